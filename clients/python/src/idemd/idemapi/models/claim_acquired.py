from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.claim_acquired_outcome import ClaimAcquiredOutcome, check_claim_acquired_outcome

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
    """

    outcome: ClaimAcquiredOutcome
    lease_token: str
    lease_expires_at: datetime.datetime
    attempt: int
    recovered: bool
    expires_at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        outcome: str = self.outcome

        lease_token = self.lease_token

        lease_expires_at = self.lease_expires_at.isoformat()

        attempt = self.attempt

        recovered = self.recovered

        expires_at = self.expires_at.isoformat()

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

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        outcome = check_claim_acquired_outcome(d.pop("outcome"))

        lease_token = d.pop("lease_token")

        lease_expires_at = datetime.datetime.fromisoformat(d.pop("lease_expires_at"))

        attempt = d.pop("attempt")

        recovered = d.pop("recovered")

        expires_at = datetime.datetime.fromisoformat(d.pop("expires_at"))

        claim_acquired = cls(
            outcome=outcome,
            lease_token=lease_token,
            lease_expires_at=lease_expires_at,
            attempt=attempt,
            recovered=recovered,
            expires_at=expires_at,
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
