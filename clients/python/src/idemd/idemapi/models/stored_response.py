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
    """
    Attributes:
        status (int):
        headers (StoredResponseHeaders | Unset):
        body (str | Unset): The body, base64-encoded.
    """

    status: int
    headers: StoredResponseHeaders | Unset = UNSET
    body: str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        status = self.status

        headers: dict[str, Any] | Unset = UNSET
        if not isinstance(self.headers, Unset):
            headers = self.headers.to_dict()

        body = self.body

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

        stored_response = cls(
            status=status,
            headers=headers,
            body=body,
        )

        return stored_response
