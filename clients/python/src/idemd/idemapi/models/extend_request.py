from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="ExtendRequest")


@_attrs_define
class ExtendRequest:
    """
    Attributes:
        key (str): The idempotency key, 1 to 255 bytes of UTF-8.
        lease_token (str): The lease_token of the claim that holds the key, at most 256 bytes.
        lease_ms (int): The new lease, in milliseconds from now.
    """

    key: str
    lease_token: str
    lease_ms: int

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        lease_token = self.lease_token

        lease_ms = self.lease_ms

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "key": key,
                "lease_token": lease_token,
                "lease_ms": lease_ms,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        key = d.pop("key")

        lease_token = d.pop("lease_token")

        lease_ms = d.pop("lease_ms")

        extend_request = cls(
            key=key,
            lease_token=lease_token,
            lease_ms=lease_ms,
        )

        return extend_request
