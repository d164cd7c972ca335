from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from ..models.release_request_mode import ReleaseRequestMode, check_release_request_mode
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.stored_response import StoredResponse


T = TypeVar("T", bound="ReleaseRequest")


@_attrs_define
class ReleaseRequest:
    """
    Attributes:
        key (str): The idempotency key, 1 to 255 bytes of UTF-8.
        lease_token (str): The lease_token of the claim that holds the key, at most 256 bytes.
        mode (ReleaseRequestMode): retry frees the key for the next claim; fail stores a terminal failure.
        response (StoredResponse | Unset): A response to replay: plain, with `headers` and `body`, or sealed, with
            `sealed`
            alone. A response with `sealed` and `headers` or `body` (even empty) is refused.
        retention_ms (int | Unset): How long a failure is kept, in milliseconds from now. Absent means 24 hours (or the
            daemon's --retention).
    """

    key: str
    lease_token: str
    mode: ReleaseRequestMode
    response: StoredResponse | Unset = UNSET
    retention_ms: int | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        lease_token = self.lease_token

        mode: str = self.mode

        response: dict[str, Any] | Unset = UNSET
        if not isinstance(self.response, Unset):
            response = self.response.to_dict()

        retention_ms = self.retention_ms

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "key": key,
                "lease_token": lease_token,
                "mode": mode,
            }
        )
        if response is not UNSET:
            field_dict["response"] = response
        if retention_ms is not UNSET:
            field_dict["retention_ms"] = retention_ms

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.stored_response import StoredResponse

        d = dict(src_dict)
        key = d.pop("key")

        lease_token = d.pop("lease_token")

        mode = check_release_request_mode(d.pop("mode"))

        _response = d.pop("response", UNSET)
        response: StoredResponse | Unset
        if isinstance(_response, Unset):
            response = UNSET
        else:
            response = StoredResponse.from_dict(_response)

        retention_ms = d.pop("retention_ms", UNSET)

        release_request = cls(
            key=key,
            lease_token=lease_token,
            mode=mode,
            response=response,
            retention_ms=retention_ms,
        )

        return release_request
