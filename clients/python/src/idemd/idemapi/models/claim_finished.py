from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.claim_finished_outcome import ClaimFinishedOutcome, check_claim_finished_outcome
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.stored_response import StoredResponse


T = TypeVar("T", bound="ClaimFinished")


@_attrs_define
class ClaimFinished:
    """The key is finished; its stored result is replayed.

    Attributes:
        outcome (ClaimFinishedOutcome): completed for a stored result, failed for a terminal failure.
        attempt (int): The attempt that finished the key.
        expires_at (datetime.datetime): When the record is forgotten; until then the result is replayed.
        response (StoredResponse | Unset): A response to replay: plain, with `headers` and `body`, or sealed, with
            `sealed`
            alone. A response with `sealed` and `headers` or `body` (even empty) is refused.
    """

    outcome: ClaimFinishedOutcome
    attempt: int
    expires_at: datetime.datetime
    response: StoredResponse | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        outcome: str = self.outcome

        attempt = self.attempt

        expires_at = self.expires_at.isoformat()

        response: dict[str, Any] | Unset = UNSET
        if not isinstance(self.response, Unset):
            response = self.response.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "outcome": outcome,
                "attempt": attempt,
                "expires_at": expires_at,
            }
        )
        if response is not UNSET:
            field_dict["response"] = response

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.stored_response import StoredResponse

        d = dict(src_dict)
        outcome = check_claim_finished_outcome(d.pop("outcome"))

        attempt = d.pop("attempt")

        expires_at = datetime.datetime.fromisoformat(d.pop("expires_at"))

        _response = d.pop("response", UNSET)
        response: StoredResponse | Unset
        if isinstance(_response, Unset):
            response = UNSET
        else:
            response = StoredResponse.from_dict(_response)

        claim_finished = cls(
            outcome=outcome,
            attempt=attempt,
            expires_at=expires_at,
            response=response,
        )

        claim_finished.additional_properties = d
        return claim_finished

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
