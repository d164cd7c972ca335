from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.recovery_point import RecoveryPoint
    from ..models.stored_response import StoredResponse


T = TypeVar("T", bound="KeyRecord")


@_attrs_define
class KeyRecord:
    """
    Attributes:
        key (str):
        state (str): pending, released, completed or failed (an open set: accept others).
            released means the key was given back for a retry and is free to claim.
        attempt (int):
        created_at (datetime.datetime):
        updated_at (datetime.datetime):
        expires_at (datetime.datetime): When the record is forgotten.
        fingerprint (str | Unset):
        owner (str | Unset): The label the current or last claim gave; it grants nothing.
        lease_expires_at (datetime.datetime | Unset):
        response (StoredResponse | Unset): A response to replay: plain, with `headers` and `body`, or sealed, with
            `sealed`
            alone. A response with `sealed` and `headers` or `body` (even empty) is refused.
        recovery_point (RecoveryPoint | Unset): The last point a holder of the key recorded, while the key is not
            finished.
    """

    key: str
    state: str
    attempt: int
    created_at: datetime.datetime
    updated_at: datetime.datetime
    expires_at: datetime.datetime
    fingerprint: str | Unset = UNSET
    owner: str | Unset = UNSET
    lease_expires_at: datetime.datetime | Unset = UNSET
    response: StoredResponse | Unset = UNSET
    recovery_point: RecoveryPoint | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        state = self.state

        attempt = self.attempt

        created_at = self.created_at.isoformat()

        updated_at = self.updated_at.isoformat()

        expires_at = self.expires_at.isoformat()

        fingerprint = self.fingerprint

        owner = self.owner

        lease_expires_at: str | Unset = UNSET
        if not isinstance(self.lease_expires_at, Unset):
            lease_expires_at = self.lease_expires_at.isoformat()

        response: dict[str, Any] | Unset = UNSET
        if not isinstance(self.response, Unset):
            response = self.response.to_dict()

        recovery_point: dict[str, Any] | Unset = UNSET
        if not isinstance(self.recovery_point, Unset):
            recovery_point = self.recovery_point.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "key": key,
                "state": state,
                "attempt": attempt,
                "created_at": created_at,
                "updated_at": updated_at,
                "expires_at": expires_at,
            }
        )
        if fingerprint is not UNSET:
            field_dict["fingerprint"] = fingerprint
        if owner is not UNSET:
            field_dict["owner"] = owner
        if lease_expires_at is not UNSET:
            field_dict["lease_expires_at"] = lease_expires_at
        if response is not UNSET:
            field_dict["response"] = response
        if recovery_point is not UNSET:
            field_dict["recovery_point"] = recovery_point

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.recovery_point import RecoveryPoint
        from ..models.stored_response import StoredResponse

        d = dict(src_dict)
        key = d.pop("key")

        state = d.pop("state")

        attempt = d.pop("attempt")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        updated_at = datetime.datetime.fromisoformat(d.pop("updated_at"))

        expires_at = datetime.datetime.fromisoformat(d.pop("expires_at"))

        fingerprint = d.pop("fingerprint", UNSET)

        owner = d.pop("owner", UNSET)

        _lease_expires_at = d.pop("lease_expires_at", UNSET)
        lease_expires_at: datetime.datetime | Unset
        if isinstance(_lease_expires_at, Unset):
            lease_expires_at = UNSET
        else:
            lease_expires_at = datetime.datetime.fromisoformat(_lease_expires_at)

        _response = d.pop("response", UNSET)
        response: StoredResponse | Unset
        if isinstance(_response, Unset):
            response = UNSET
        else:
            response = StoredResponse.from_dict(_response)

        _recovery_point = d.pop("recovery_point", UNSET)
        recovery_point: RecoveryPoint | Unset
        if isinstance(_recovery_point, Unset):
            recovery_point = UNSET
        else:
            recovery_point = RecoveryPoint.from_dict(_recovery_point)

        key_record = cls(
            key=key,
            state=state,
            attempt=attempt,
            created_at=created_at,
            updated_at=updated_at,
            expires_at=expires_at,
            fingerprint=fingerprint,
            owner=owner,
            lease_expires_at=lease_expires_at,
            response=response,
            recovery_point=recovery_point,
        )

        key_record.additional_properties = d
        return key_record

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
