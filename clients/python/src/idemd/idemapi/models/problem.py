from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

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
            --body-timeout), not_supported (the daemon's store cannot do what was asked).
        detail (str | Unset): What went wrong, naming the member of the request at fault.
        instance (str | Unset):
        retry_after_ms (int | Unset): For in_progress, rate_limited and store_unavailable, how long to wait before
            trying again.
    """

    type_: str
    title: str
    status: int
    code: str
    detail: str | Unset = UNSET
    instance: str | Unset = UNSET
    retry_after_ms: int | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        type_ = self.type_

        title = self.title

        status = self.status

        code = self.code

        detail = self.detail

        instance = self.instance

        retry_after_ms = self.retry_after_ms

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

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        type_ = d.pop("type")

        title = d.pop("title")

        status = d.pop("status")

        code = d.pop("code")

        detail = d.pop("detail", UNSET)

        instance = d.pop("instance", UNSET)

        retry_after_ms = d.pop("retry_after_ms", UNSET)

        problem = cls(
            type_=type_,
            title=title,
            status=status,
            code=code,
            detail=detail,
            instance=instance,
            retry_after_ms=retry_after_ms,
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
