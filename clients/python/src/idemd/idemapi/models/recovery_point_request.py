from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="RecoveryPointRequest")


@_attrs_define
class RecoveryPointRequest:
    """
    Attributes:
        key (str): The idempotency key, 1 to 255 bytes of UTF-8.
        lease_token (str): The lease_token of the claim that holds the key, at most 256 bytes.
        name (str): The point reached, 1 to 128 bytes of UTF-8, for example `charged`.
        data (str | Unset): What the next holder needs to resume, base64-encoded; at most the daemon's
            --max-recovery-point-bytes (4096 by default) once decoded. Absent means empty.
            A client that seals (docs/sealing.md) sends an envelope here, which idemd keeps
            as it keeps any bytes.
    """

    key: str
    lease_token: str
    name: str
    data: str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        lease_token = self.lease_token

        name = self.name

        data = self.data

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "key": key,
                "lease_token": lease_token,
                "name": name,
            }
        )
        if data is not UNSET:
            field_dict["data"] = data

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        key = d.pop("key")

        lease_token = d.pop("lease_token")

        name = d.pop("name")

        data = d.pop("data", UNSET)

        recovery_point_request = cls(
            key=key,
            lease_token=lease_token,
            name=name,
            data=data,
        )

        return recovery_point_request
