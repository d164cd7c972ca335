from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="QuotaUsage")


@_attrs_define
class QuotaUsage:
    """With quota_exceeded: the quota the tenant reached and what the store keeps of it.
    Replays, lookups and the completion, release and renewal of leases already
    granted still work.

        Attributes:
            limit (str): The auth file's limit that was reached, max_stored_bytes or max_records.
            used (int): The tenant's usage in that limit's unit.
            max_ (int): The limit.
            records (int): The tenant's records in the store.
            stored_bytes (int): The bytes of the tenant's records as the store counts them.
    """

    limit: str
    used: int
    max_: int
    records: int
    stored_bytes: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        limit = self.limit

        used = self.used

        max_ = self.max_

        records = self.records

        stored_bytes = self.stored_bytes

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "limit": limit,
                "used": used,
                "max": max_,
                "records": records,
                "stored_bytes": stored_bytes,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        limit = d.pop("limit")

        used = d.pop("used")

        max_ = d.pop("max")

        records = d.pop("records")

        stored_bytes = d.pop("stored_bytes")

        quota_usage = cls(
            limit=limit,
            used=used,
            max_=max_,
            records=records,
            stored_bytes=stored_bytes,
        )

        quota_usage.additional_properties = d
        return quota_usage

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
