from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="ClaimRequest")


@_attrs_define
class ClaimRequest:
    """
    Attributes:
        key (str): The idempotency key, 1 to 255 bytes of UTF-8.
        fingerprint (str | Unset): A digest of the request payload, at most 256 bytes. A claim whose fingerprint
            differs from the one the key was first claimed with is refused
            (`fingerprint_mismatch`); no fingerprint is the empty one, which differs from
            every other.
        claim_secret (str | Unset): A secret of at least 128 random bits (22 to 256 bytes, for example 32 hex
            digits) that the caller makes for this one claim and sends again only when it
            resends the same claim after a timeout or a lost answer: a claim carrying the
            live lease's claim_secret gets that same lease back. The daemon keeps only its
            SHA-256 and never shows it. Without one, a resent claim answers `in_progress`
            until the lease runs out.
        owner (str | Unset): A label naming who claims (a host, a job), at most 256 bytes, shown by lookup
            to help operators. It grants nothing: use claim_secret to get a lease back.
        lease_ms (int | Unset): How long the lease lasts, in milliseconds. Absent means 30000.
        wait_ms (int | Unset): Wait up to this long, in milliseconds, for a holder to finish instead of
            answering 409 at once. Absent means 0.
    """

    key: str
    fingerprint: str | Unset = UNSET
    claim_secret: str | Unset = UNSET
    owner: str | Unset = UNSET
    lease_ms: int | Unset = UNSET
    wait_ms: int | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        fingerprint = self.fingerprint

        claim_secret = self.claim_secret

        owner = self.owner

        lease_ms = self.lease_ms

        wait_ms = self.wait_ms

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "key": key,
            }
        )
        if fingerprint is not UNSET:
            field_dict["fingerprint"] = fingerprint
        if claim_secret is not UNSET:
            field_dict["claim_secret"] = claim_secret
        if owner is not UNSET:
            field_dict["owner"] = owner
        if lease_ms is not UNSET:
            field_dict["lease_ms"] = lease_ms
        if wait_ms is not UNSET:
            field_dict["wait_ms"] = wait_ms

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        key = d.pop("key")

        fingerprint = d.pop("fingerprint", UNSET)

        claim_secret = d.pop("claim_secret", UNSET)

        owner = d.pop("owner", UNSET)

        lease_ms = d.pop("lease_ms", UNSET)

        wait_ms = d.pop("wait_ms", UNSET)

        claim_request = cls(
            key=key,
            fingerprint=fingerprint,
            claim_secret=claim_secret,
            owner=owner,
            lease_ms=lease_ms,
            wait_ms=wait_ms,
        )

        return claim_request
