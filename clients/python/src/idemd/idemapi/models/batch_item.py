from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.claim_request import ClaimRequest
    from ..models.complete_request import CompleteRequest
    from ..models.extend_request import ExtendRequest
    from ..models.release_request import ReleaseRequest


T = TypeVar("T", bound="BatchItem")


@_attrs_define
class BatchItem:
    """One operation, under exactly one of its members.

    Attributes:
        claim (ClaimRequest | Unset):
        complete (CompleteRequest | Unset):
        release (ReleaseRequest | Unset):
        extend (ExtendRequest | Unset):
    """

    claim: ClaimRequest | Unset = UNSET
    complete: CompleteRequest | Unset = UNSET
    release: ReleaseRequest | Unset = UNSET
    extend: ExtendRequest | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        claim: dict[str, Any] | Unset = UNSET
        if not isinstance(self.claim, Unset):
            claim = self.claim.to_dict()

        complete: dict[str, Any] | Unset = UNSET
        if not isinstance(self.complete, Unset):
            complete = self.complete.to_dict()

        release: dict[str, Any] | Unset = UNSET
        if not isinstance(self.release, Unset):
            release = self.release.to_dict()

        extend: dict[str, Any] | Unset = UNSET
        if not isinstance(self.extend, Unset):
            extend = self.extend.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if claim is not UNSET:
            field_dict["claim"] = claim
        if complete is not UNSET:
            field_dict["complete"] = complete
        if release is not UNSET:
            field_dict["release"] = release
        if extend is not UNSET:
            field_dict["extend"] = extend

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.claim_request import ClaimRequest
        from ..models.complete_request import CompleteRequest
        from ..models.extend_request import ExtendRequest
        from ..models.release_request import ReleaseRequest

        d = dict(src_dict)
        _claim = d.pop("claim", UNSET)
        claim: ClaimRequest | Unset
        if isinstance(_claim, Unset):
            claim = UNSET
        else:
            claim = ClaimRequest.from_dict(_claim)

        _complete = d.pop("complete", UNSET)
        complete: CompleteRequest | Unset
        if isinstance(_complete, Unset):
            complete = UNSET
        else:
            complete = CompleteRequest.from_dict(_complete)

        _release = d.pop("release", UNSET)
        release: ReleaseRequest | Unset
        if isinstance(_release, Unset):
            release = UNSET
        else:
            release = ReleaseRequest.from_dict(_release)

        _extend = d.pop("extend", UNSET)
        extend: ExtendRequest | Unset
        if isinstance(_extend, Unset):
            extend = UNSET
        else:
            extend = ExtendRequest.from_dict(_extend)

        batch_item = cls(
            claim=claim,
            complete=complete,
            release=release,
            extend=extend,
        )

        return batch_item
