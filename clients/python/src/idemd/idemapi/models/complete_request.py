from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.stored_response import StoredResponse


T = TypeVar("T", bound="CompleteRequest")


@_attrs_define
class CompleteRequest:
    """
    Attributes:
        key (str): The idempotency key, 1 to 255 bytes of UTF-8.
        lease_token (str): The lease_token of the claim that holds the key, at most 256 bytes.
        response (StoredResponse): A response to replay: plain, with `headers` and `body`, or sealed, with `sealed`
            alone. A response with `sealed` and `headers` or `body` (even empty) is refused.
        retention_ms (int | Unset): How long the result is kept, in milliseconds from now. Absent means 24 hours (or the
            daemon's --retention).
    """

    key: str
    lease_token: str
    response: StoredResponse
    retention_ms: int | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        lease_token = self.lease_token

        response = self.response.to_dict()

        retention_ms = self.retention_ms

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "key": key,
                "lease_token": lease_token,
                "response": response,
            }
        )
        if retention_ms is not UNSET:
            field_dict["retention_ms"] = retention_ms

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.stored_response import StoredResponse

        d = dict(src_dict)
        key = d.pop("key")

        lease_token = d.pop("lease_token")

        response = StoredResponse.from_dict(d.pop("response"))

        retention_ms = d.pop("retention_ms", UNSET)

        complete_request = cls(
            key=key,
            lease_token=lease_token,
            response=response,
            retention_ms=retention_ms,
        )

        return complete_request
