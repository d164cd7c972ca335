from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="RecoveryPoint")


@_attrs_define
class RecoveryPoint:
    """The last point a holder of the key recorded, while the key is not finished.

    Attributes:
        name (str):
        attempt (int): The attempt whose holder recorded it.
        recorded_at (datetime.datetime):
        data (str | Unset): The payload as recorded, base64-encoded; absent when empty.
    """

    name: str
    attempt: int
    recorded_at: datetime.datetime
    data: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        attempt = self.attempt

        recorded_at = self.recorded_at.isoformat()

        data = self.data

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "name": name,
                "attempt": attempt,
                "recorded_at": recorded_at,
            }
        )
        if data is not UNSET:
            field_dict["data"] = data

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        name = d.pop("name")

        attempt = d.pop("attempt")

        recorded_at = datetime.datetime.fromisoformat(d.pop("recorded_at"))

        data = d.pop("data", UNSET)

        recovery_point = cls(
            name=name,
            attempt=attempt,
            recorded_at=recorded_at,
            data=data,
        )

        recovery_point.additional_properties = d
        return recovery_point

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
