from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.stored_response_headers import StoredResponseHeaders


T = TypeVar("T", bound="StoredResponse")


@_attrs_define
class StoredResponse:
    """A response to replay: plain, with `headers` and `body`, or sealed, with `sealed`
    alone. A response with `sealed` and `headers` or `body` (even empty) is refused.

        Attributes:
            status (int): A final HTTP status; a 1xx cannot be replayed as an answer.
            headers (StoredResponseHeaders | Unset): Header names are RFC 9110 tokens and values hold no CR, LF, NUL or
                other control characters. Hop-by-hop and framing headers (Connection, Keep-Alive, Proxy-*, TE, Trailer,
                Transfer-Encoding, Upgrade, Content-Length) are refused: the server replaying the response sets them.
            body (str | Unset): The body, base64-encoded. A 204 or 304 response has none.
            sealed (str | Unset): The response's headers and body, sealed by the client with a key idemd does not hold (an
                AEAD envelope, base64-encoded; docs/sealing.md gives its format). idemd stores and answers it as given and reads
                only its first bytes, to refuse what is not an envelope; the status stays readable. With it, `headers` and
                `body` are absent, whatever the status. A plain response may not carry a header named `Idemd-Sealed`, the name
                under which a store keeps the mark of a sealed one.
    """

    status: int
    headers: StoredResponseHeaders | Unset = UNSET
    body: str | Unset = UNSET
    sealed: str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        status = self.status

        headers: dict[str, Any] | Unset = UNSET
        if not isinstance(self.headers, Unset):
            headers = self.headers.to_dict()

        body = self.body

        sealed = self.sealed

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "status": status,
            }
        )
        if headers is not UNSET:
            field_dict["headers"] = headers
        if body is not UNSET:
            field_dict["body"] = body
        if sealed is not UNSET:
            field_dict["sealed"] = sealed

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.stored_response_headers import StoredResponseHeaders

        d = dict(src_dict)
        status = d.pop("status")

        _headers = d.pop("headers", UNSET)
        headers: StoredResponseHeaders | Unset
        if isinstance(_headers, Unset):
            headers = UNSET
        else:
            headers = StoredResponseHeaders.from_dict(_headers)

        body = d.pop("body", UNSET)

        sealed = d.pop("sealed", UNSET)

        stored_response = cls(
            status=status,
            headers=headers,
            body=body,
            sealed=sealed,
        )

        return stored_response
