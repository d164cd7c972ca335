from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.claim_acquired_outcome import ClaimAcquiredOutcome, check_claim_acquired_outcome
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.recovery_point import RecoveryPoint


T = TypeVar("T", bound="ClaimAcquired")


@_attrs_define
class ClaimAcquired:
    """The caller holds the lease.

    Attributes:
        outcome (ClaimAcquiredOutcome):
        lease_token (str): Proves the lease to complete, release and extend.
        lease_expires_at (datetime.datetime): When another caller may take the key over unless the lease is extended.
        attempt (int): How many times the key has been acquired, this time included.
        recovered (bool): True when this claim took over from a holder whose lease had expired.
        expires_at (datetime.datetime): When the record is forgotten if nobody completes or releases it.
        recovery_point (RecoveryPoint | Unset): The last point a holder of the key recorded, while the key is not
            finished.
    """

    outcome: ClaimAcquiredOutcome
    lease_token: str
    lease_expires_at: datetime.datetime
    attempt: int
    recovered: bool
    expires_at: datetime.datetime
    recovery_point: RecoveryPoint | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        outcome: str = self.outcome

        lease_token = self.lease_token

        lease_expires_at = self.lease_expires_at.isoformat()

        attempt = self.attempt

        recovered = self.recovered

        expires_at = self.expires_at.isoformat()

        recovery_point: dict[str, Any] | Unset = UNSET
        if not isinstance(self.recovery_point, Unset):
            recovery_point = self.recovery_point.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "outcome": outcome,
                "lease_token": lease_token,
                "lease_expires_at": lease_expires_at,
                "attempt": attempt,
                "recovered": recovered,
                "expires_at": expires_at,
            }
        )
        if recovery_point is not UNSET:
            field_dict["recovery_point"] = recovery_point

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.recovery_point import RecoveryPoint

        d = dict(src_dict)
        outcome = check_claim_acquired_outcome(d.pop("outcome"))

        lease_token = d.pop("lease_token")

        lease_expires_at = datetime.datetime.fromisoformat(d.pop("lease_expires_at"))

        attempt = d.pop("attempt")

        recovered = d.pop("recovered")

        expires_at = datetime.datetime.fromisoformat(d.pop("expires_at"))

        _recovery_point = d.pop("recovery_point", UNSET)
        recovery_point: RecoveryPoint | Unset
        if isinstance(_recovery_point, Unset):
            recovery_point = UNSET
        else:
            recovery_point = RecoveryPoint.from_dict(_recovery_point)

        claim_acquired = cls(
            outcome=outcome,
            lease_token=lease_token,
            lease_expires_at=lease_expires_at,
            attempt=attempt,
            recovered=recovered,
            expires_at=expires_at,
            recovery_point=recovery_point,
        )

        claim_acquired.additional_properties = d
        return claim_acquired

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
