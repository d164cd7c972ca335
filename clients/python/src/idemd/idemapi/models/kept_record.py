from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="KeptRecord")


@_attrs_define
class KeptRecord:
    """
    Attributes:
        tenant (str):
        key_sha256 (str): The SHA-256 of the key, in hex, which names the record in every store.
        key (str | Unset): The key, when the stream carries it.
    """

    tenant: str
    key_sha256: str
    key: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        tenant = self.tenant

        key_sha256 = self.key_sha256

        key = self.key

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "tenant": tenant,
                "key_sha256": key_sha256,
            }
        )
        if key is not UNSET:
            field_dict["key"] = key

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        tenant = d.pop("tenant")

        key_sha256 = d.pop("key_sha256")

        key = d.pop("key", UNSET)

        kept_record = cls(
            tenant=tenant,
            key_sha256=key_sha256,
            key=key,
        )

        kept_record.additional_properties = d
        return kept_record

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
