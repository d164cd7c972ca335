from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.claim_acquired import ClaimAcquired
    from ..models.claim_finished import ClaimFinished
    from ..models.key_record import KeyRecord
    from ..models.lease_extended import LeaseExtended
    from ..models.problem import Problem


T = TypeVar("T", bound="BatchItemResult")


@_attrs_define
class BatchItemResult:
    """An item's answer: the status the single call would have answered, and its body
    under one member: `acquired` (a claim's 201), `finished` (a claim's 200),
    `record` (a complete's or release's 200), `extended` (an extend's 200), or
    `problem` (any status of 400 and above).

        Attributes:
            status (int): The HTTP status the single call would have answered.
            acquired (ClaimAcquired | Unset): The caller holds the lease.
            finished (ClaimFinished | Unset): The key is finished; its stored result is replayed.
            record (KeyRecord | Unset):
            extended (LeaseExtended | Unset):
            problem (Problem | Unset): An RFC 9457 problem detail.
    """

    status: int
    acquired: ClaimAcquired | Unset = UNSET
    finished: ClaimFinished | Unset = UNSET
    record: KeyRecord | Unset = UNSET
    extended: LeaseExtended | Unset = UNSET
    problem: Problem | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        status = self.status

        acquired: dict[str, Any] | Unset = UNSET
        if not isinstance(self.acquired, Unset):
            acquired = self.acquired.to_dict()

        finished: dict[str, Any] | Unset = UNSET
        if not isinstance(self.finished, Unset):
            finished = self.finished.to_dict()

        record: dict[str, Any] | Unset = UNSET
        if not isinstance(self.record, Unset):
            record = self.record.to_dict()

        extended: dict[str, Any] | Unset = UNSET
        if not isinstance(self.extended, Unset):
            extended = self.extended.to_dict()

        problem: dict[str, Any] | Unset = UNSET
        if not isinstance(self.problem, Unset):
            problem = self.problem.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "status": status,
            }
        )
        if acquired is not UNSET:
            field_dict["acquired"] = acquired
        if finished is not UNSET:
            field_dict["finished"] = finished
        if record is not UNSET:
            field_dict["record"] = record
        if extended is not UNSET:
            field_dict["extended"] = extended
        if problem is not UNSET:
            field_dict["problem"] = problem

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.claim_acquired import ClaimAcquired
        from ..models.claim_finished import ClaimFinished
        from ..models.key_record import KeyRecord
        from ..models.lease_extended import LeaseExtended
        from ..models.problem import Problem

        d = dict(src_dict)
        status = d.pop("status")

        _acquired = d.pop("acquired", UNSET)
        acquired: ClaimAcquired | Unset
        if isinstance(_acquired, Unset):
            acquired = UNSET
        else:
            acquired = ClaimAcquired.from_dict(_acquired)

        _finished = d.pop("finished", UNSET)
        finished: ClaimFinished | Unset
        if isinstance(_finished, Unset):
            finished = UNSET
        else:
            finished = ClaimFinished.from_dict(_finished)

        _record = d.pop("record", UNSET)
        record: KeyRecord | Unset
        if isinstance(_record, Unset):
            record = UNSET
        else:
            record = KeyRecord.from_dict(_record)

        _extended = d.pop("extended", UNSET)
        extended: LeaseExtended | Unset
        if isinstance(_extended, Unset):
            extended = UNSET
        else:
            extended = LeaseExtended.from_dict(_extended)

        _problem = d.pop("problem", UNSET)
        problem: Problem | Unset
        if isinstance(_problem, Unset):
            problem = UNSET
        else:
            problem = Problem.from_dict(_problem)

        batch_item_result = cls(
            status=status,
            acquired=acquired,
            finished=finished,
            record=record,
            extended=extended,
            problem=problem,
        )

        batch_item_result.additional_properties = d
        return batch_item_result

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
