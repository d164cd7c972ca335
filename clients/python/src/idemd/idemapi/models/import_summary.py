from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.kept_record import KeptRecord


T = TypeVar("T", bound="ImportSummary")


@_attrs_define
class ImportSummary:
    """
    Attributes:
        written (int): Records written, where the store held none of their keys.
        same (int): Records the store held already as they are (an import repeated).
        kept (int): Records not written because the store holds another record of the key, newer or different, which it
            keeps.
        expired (int): Records whose retention had run out.
        other_tenant (int): Records of another tenant than the caller's, left out because the token lacks the `platform`
            scope.
        kept_records (list[KeptRecord] | Unset): The first 1000 records counted in `kept`.
    """

    written: int
    same: int
    kept: int
    expired: int
    other_tenant: int
    kept_records: list[KeptRecord] | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        written = self.written

        same = self.same

        kept = self.kept

        expired = self.expired

        other_tenant = self.other_tenant

        kept_records: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.kept_records, Unset):
            kept_records = []
            for kept_records_item_data in self.kept_records:
                kept_records_item = kept_records_item_data.to_dict()
                kept_records.append(kept_records_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "written": written,
                "same": same,
                "kept": kept,
                "expired": expired,
                "other_tenant": other_tenant,
            }
        )
        if kept_records is not UNSET:
            field_dict["kept_records"] = kept_records

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.kept_record import KeptRecord

        d = dict(src_dict)
        written = d.pop("written")

        same = d.pop("same")

        kept = d.pop("kept")

        expired = d.pop("expired")

        other_tenant = d.pop("other_tenant")

        _kept_records = d.pop("kept_records", UNSET)
        kept_records: list[KeptRecord] | Unset = UNSET
        if _kept_records is not UNSET:
            kept_records = []
            for kept_records_item_data in _kept_records:
                kept_records_item = KeptRecord.from_dict(kept_records_item_data)

                kept_records.append(kept_records_item)

        import_summary = cls(
            written=written,
            same=same,
            kept=kept,
            expired=expired,
            other_tenant=other_tenant,
            kept_records=kept_records,
        )

        import_summary.additional_properties = d
        return import_summary

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
