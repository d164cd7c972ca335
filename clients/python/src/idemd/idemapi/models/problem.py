from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.quota_usage import QuotaUsage


T = TypeVar("T", bound="Problem")


@_attrs_define
class Problem:
    """An RFC 9457 problem detail.

    Attributes:
        type_ (str):
        title (str):
        status (int):
        code (str): The machine-readable reason, an open set: clients must accept codes they do
            not know and treat them by status. Known codes: invalid_request,
            invalid_json, unsupported_media_type, payload_too_large, not_found,
            in_progress, fingerprint_mismatch, lease_lost, store_unavailable,
            not_replicated, method_not_allowed, internal, unauthenticated, forbidden,
            rate_limited, request_timeout (the body did not arrive within the daemon's
            --body-timeout), not_supported (the daemon's store cannot do what was asked),
            result_unavailable (502: the key's result is kept in the blob store, which
            does not hold it intact; no part of it is answered),
            quota_exceeded (a claim that would acquire a key, from a tenant at its quota
            on what the store keeps: `quota` says which and how much),
            store_moved (503: the key's record was handed over to another store while
            records move between stores, and this daemon does not serve that store;
            nothing was acquired or changed, the key is not free: retry after
            retry_after_ms, as for store_unavailable, but never let the operation run
            unprotected on it).
        detail (str | Unset): What went wrong, naming the member of the request at fault.
        instance (str | Unset):
        retry_after_ms (int | Unset): For in_progress, rate_limited, quota_exceeded, store_unavailable and store_moved,
            how long to wait before trying again.
        quota (QuotaUsage | Unset): With quota_exceeded: the quota the tenant reached and what the store keeps of it.
            Replays, lookups and the completion, release and renewal of leases already
            granted still work.
    """

    type_: str
    title: str
    status: int
    code: str
    detail: str | Unset = UNSET
    instance: str | Unset = UNSET
    retry_after_ms: int | Unset = UNSET
    quota: QuotaUsage | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        type_ = self.type_

        title = self.title

        status = self.status

        code = self.code

        detail = self.detail

        instance = self.instance

        retry_after_ms = self.retry_after_ms

        quota: dict[str, Any] | Unset = UNSET
        if not isinstance(self.quota, Unset):
            quota = self.quota.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "type": type_,
                "title": title,
                "status": status,
                "code": code,
            }
        )
        if detail is not UNSET:
            field_dict["detail"] = detail
        if instance is not UNSET:
            field_dict["instance"] = instance
        if retry_after_ms is not UNSET:
            field_dict["retry_after_ms"] = retry_after_ms
        if quota is not UNSET:
            field_dict["quota"] = quota

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.quota_usage import QuotaUsage

        d = dict(src_dict)
        type_ = d.pop("type")

        title = d.pop("title")

        status = d.pop("status")

        code = d.pop("code")

        detail = d.pop("detail", UNSET)

        instance = d.pop("instance", UNSET)

        retry_after_ms = d.pop("retry_after_ms", UNSET)

        _quota = d.pop("quota", UNSET)
        quota: QuotaUsage | Unset
        if isinstance(_quota, Unset):
            quota = UNSET
        else:
            quota = QuotaUsage.from_dict(_quota)

        problem = cls(
            type_=type_,
            title=title,
            status=status,
            code=code,
            detail=detail,
            instance=instance,
            retry_after_ms=retry_after_ms,
            quota=quota,
        )

        problem.additional_properties = d
        return problem

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
