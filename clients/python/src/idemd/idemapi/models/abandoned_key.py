from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="AbandonedKey")


@_attrs_define
class AbandonedKey:
    """
    Attributes:
        key (str):
        attempt (int): The attempt of the holder that left it; a claim now is the next.
        lease_expired_at (datetime.datetime):
        fingerprint (str | Unset): The key's fingerprint, which a claim must carry to acquire it: a completer
            claims with it, having no payload of its own to digest. Absent when empty.
        owner (str | Unset): The label that holder's claim gave.
        recovery_point (str | Unset): The name of the last recovery point; absent when none was recorded.
    """

    key: str
    attempt: int
    lease_expired_at: datetime.datetime
    fingerprint: str | Unset = UNSET
    owner: str | Unset = UNSET
    recovery_point: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        attempt = self.attempt

        lease_expired_at = self.lease_expired_at.isoformat()

        fingerprint = self.fingerprint

        owner = self.owner

        recovery_point = self.recovery_point

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "key": key,
                "attempt": attempt,
                "lease_expired_at": lease_expired_at,
            }
        )
        if fingerprint is not UNSET:
            field_dict["fingerprint"] = fingerprint
        if owner is not UNSET:
            field_dict["owner"] = owner
        if recovery_point is not UNSET:
            field_dict["recovery_point"] = recovery_point

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        key = d.pop("key")

        attempt = d.pop("attempt")

        lease_expired_at = datetime.datetime.fromisoformat(d.pop("lease_expired_at"))

        fingerprint = d.pop("fingerprint", UNSET)

        owner = d.pop("owner", UNSET)

        recovery_point = d.pop("recovery_point", UNSET)

        abandoned_key = cls(
            key=key,
            attempt=attempt,
            lease_expired_at=lease_expired_at,
            fingerprint=fingerprint,
            owner=owner,
            recovery_point=recovery_point,
        )

        abandoned_key.additional_properties = d
        return abandoned_key

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
