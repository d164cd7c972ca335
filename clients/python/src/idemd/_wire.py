"""Translation between the generated models and this package's types, shared by the
sync and the async client. Nothing above this module sees a generated model."""

from __future__ import annotations

import base64
import datetime
import json
import math
import secrets
from collections.abc import Mapping
from typing import Any, BinaryIO, cast

from ._errors import Problem, Unsealable, problem_class, unexpected_answer
from ._seal import NO_RESPONSE_STATUS, Outcome, Sealing, point_without_ring, unopened
from ._types import AbandonedKey, AbandonedPage, Claim, Record, RecoveryPoint, ReleaseMode, Response
from .idemapi import types as api_types
from .idemapi.models import (
    AbandonedKeys,
    ClaimAcquired,
    ClaimFinished,
    ClaimRequest,
    CompleteRequest,
    ExtendRequest,
    KeyRecord,
    RecoveryPointRequest,
    ReleaseRequest,
    StoredResponse,
    StoredResponseHeaders,
)
from .idemapi.models import Problem as WireProblem
from .idemapi.models import RecoveryPoint as WirePoint
from .idemapi.types import UNSET, Unset


def new_secret() -> str:
    """A fresh claim secret: 128 random bits, hex-encoded."""
    return secrets.token_hex(16)


def millis(seconds: float | None) -> int | Any:
    if seconds is None or seconds <= 0:
        return UNSET
    return round(seconds * 1000)


def older_than_ms(seconds: float) -> int | Any:
    """Whole milliseconds, rounded up, so that the feed never lists a key whose lease ran
    out more recently than asked."""
    if seconds <= 0:
        return UNSET
    return math.ceil(seconds * 1000)


def claim_request(
    key: str,
    fingerprint: str,
    owner: str,
    secret: str,
    lease: float | None,
    wait: float | None,
) -> ClaimRequest:
    return ClaimRequest(
        key=key,
        fingerprint=fingerprint or UNSET,
        owner=owner or UNSET,
        claim_secret=secret,
        lease_ms=millis(lease),
        wait_ms=millis(wait),
    )


def complete_request(
    key: str, token: str, response: Response, retention: float | None, sealing: Sealing | None
) -> CompleteRequest:
    return CompleteRequest(
        key=key,
        lease_token=token,
        response=to_stored(key, response, sealing, "completed"),
        retention_ms=millis(retention),
    )


#: The largest body a completion sends base64 in JSON; a larger one (or its sealed
#: envelope) goes as the raw body of PUT /v1/keys/{key}/result, a third fewer bytes and
#: no base64. A daemon with a blob store takes such a result up to its
#: --max-blob-bytes; one without answers 413 over its --max-response-bytes, either way.
RAW_RESULT_BYTES = 1 << 20


def stored_bytes(response: Response, sealing: Sealing | None) -> int:
    """The size of what idemd stores of ``response``: its body, or its sealed envelope."""
    if sealing is None:
        return len(response.body)
    return sealing.envelope_len(response)


def put_result_args(
    key: str, token: str, response: Response, retention: float | None, sealing: Sealing | None
) -> dict[str, Any] | None:
    """The arguments of PUT /v1/keys/{key}/result that complete ``key`` with ``response``
    when what is stored of it (its body, or its sealed envelope) is over RAW_RESULT_BYTES;
    None for a smaller one, which goes as JSON."""
    if stored_bytes(response, sealing) <= RAW_RESULT_BYTES:
        return None
    args: dict[str, Any] = {
        "key": key,
        "idemd_lease_token": token,
        "idemd_status": response.status,
        "idemd_retention_ms": millis(retention),
    }
    if sealing is not None:
        payload = sealing.seal_response(key, "completed", response)
        args["idemd_sealed"] = "1"
    else:
        payload = bytes(response.body)
        if response.headers:
            args["idemd_result_headers"] = json.dumps({k: list(v) for k, v in response.headers.items()})
    # Bytes rather than the file the generated type names: httpx sends them from
    # memory, through the async client too, and can send them again.
    args["body"] = api_types.File(payload=cast(BinaryIO, payload))
    return args


def release_request(
    key: str,
    token: str,
    mode: ReleaseMode,
    response: Response | None,
    retention: float | None,
    sealing: Sealing | None,
) -> ReleaseRequest:
    return ReleaseRequest(
        key=key,
        lease_token=token,
        mode=mode,
        response=failure_stored(key, mode, response, sealing),
        retention_ms=millis(retention),
    )


def extend_request(key: str, token: str, lease: float) -> ExtendRequest:
    return ExtendRequest(key=key, lease_token=token, lease_ms=round(lease * 1000))


def recovery_point_request(
    key: str, token: str, name: str, data: bytes, sealing: Sealing | None
) -> RecoveryPointRequest:
    if sealing is not None:
        data = sealing.seal_point(key, name, data)
    return RecoveryPointRequest(
        key=key,
        lease_token=token,
        name=name,
        data=base64.b64encode(data).decode("ascii") if data else UNSET,
    )


def recovery_point(p: WirePoint | Any, key: str, sealing: Sealing | None) -> RecoveryPoint | None:
    """The recovery point of ``key`` as its holder recorded it, opened when sealed;
    Unsealable when it does not open."""
    if not isinstance(p, WirePoint):
        return None
    data = base64.b64decode(p.data) if isinstance(p.data, str) else b""
    data = point_without_ring(data) if sealing is None else sealing.open_point(key, p.name, data)
    return RecoveryPoint(name=p.name, data=data, attempt=p.attempt, recorded_at=p.recorded_at)


def abandoned_page(parsed: AbandonedKeys) -> AbandonedPage:
    keys = [
        AbandonedKey(
            key=k.key,
            attempt=k.attempt,
            lease_expired_at=k.lease_expired_at,
            fingerprint=_text(k.fingerprint),
            owner=_text(k.owner),
            recovery_point=_text(k.recovery_point),
        )
        for k in parsed.keys
    ]
    # An empty cursor would read the first page again, as the end of the feed must not.
    cursor = parsed.next_cursor if isinstance(parsed.next_cursor, str) and parsed.next_cursor else None
    return AbandonedPage(keys=keys, next_cursor=cursor)


def next_cursor(cursor: str | None, page: AbandonedPage) -> str:
    """The cursor to read after ``page``, which was read with ``cursor``: a feed that
    answers the cursor it was given would be read forever."""
    if page.next_cursor is None or page.next_cursor == cursor:
        raise unexpected_answer(
            ValueError("the abandoned-keys feed answered the cursor it was given as the next one")
        )
    return page.next_cursor


def _text(value: str | Any) -> str:
    return value if isinstance(value, str) else ""


def failure_stored(
    key: str, mode: ReleaseMode, response: Response | None, sealing: Sealing | None
) -> StoredResponse | Unset:
    """What a release stores: ``response`` as a failed result, and for a failure
    without a response, when the client seals, the sealed mark of none."""
    if response is not None:
        return to_stored(key, response, sealing, "failed")
    if sealing is None or mode != "fail":
        return UNSET
    sealed = base64.b64encode(sealing.seal_no_response(key)).decode("ascii")
    return StoredResponse(status=NO_RESPONSE_STATUS, sealed=sealed)


def to_stored(key: str, r: Response, sealing: Sealing | None, outcome: Outcome) -> StoredResponse:
    """A result of ``outcome`` as idemd stores it: sealed, with only its status
    readable, when the client seals."""
    if sealing is not None:
        sealed = base64.b64encode(sealing.seal_response(key, outcome, r)).decode("ascii")
        return StoredResponse(status=r.status, sealed=sealed)
    headers: Any = UNSET
    if r.headers:
        headers = StoredResponseHeaders.from_dict({k: list(v) for k, v in r.headers.items()})
    body: Any = UNSET
    if r.body:
        body = base64.b64encode(r.body).decode("ascii")
    return StoredResponse(status=r.status, headers=headers, body=body)


def from_stored(s: StoredResponse | Any, key: str, state: str, sealing: Sealing | None) -> Response | None:
    """A stored result of ``key``, a record in ``state`` (completed, failed, or one not
    finished), opened when sealed; Unsealable when it does not open (a sealed one and
    no ring, or a plain one, or none for a finished record, under require_sealed)."""
    if not isinstance(s, StoredResponse):
        if sealing is not None and state in ("completed", "failed"):
            sealing.missing_response()
        return None
    if isinstance(s.sealed, str):
        try:
            envelope = base64.b64decode(s.sealed, validate=True)
        except ValueError:
            raise Unsealable("invalid") from None
        if sealing is None:
            raise unopened(envelope)
        return sealing.open_response(key, "failed" if state == "failed" else "completed", s.status, envelope)
    headers: dict[str, list[str]] = {}
    if isinstance(s.headers, StoredResponseHeaders):
        headers = {k: list(v) for k, v in s.headers.additional_properties.items()}
    body = base64.b64decode(s.body) if isinstance(s.body, str) else b""
    plain = Response(status=s.status, headers=headers, body=body)
    return plain if sealing is None else sealing.plain_response(plain)


def expect(answer: api_types.Response[Any], *kinds: type) -> Any:
    """The parsed answer when it is one of ``kinds``; the matching exception otherwise."""
    parsed = answer.parsed
    if kinds and isinstance(parsed, kinds):
        return parsed
    if not kinds and int(answer.status_code) < 300:
        return None
    if isinstance(parsed, WireProblem):
        raise problem(parsed, answer.headers)
    status = int(answer.status_code)
    raise problem_class(status, "")(
        status, title="unexpected answer", detail=answer.content[:200].decode("utf-8", "replace")
    )


def problem(wire: WireProblem, headers: Mapping[str, str] | None = None) -> Problem:
    """The exception for an idemd problem; ``headers`` are its answer's, when it had one
    of its own (a problem in a batch has none)."""
    retry_after = wire.retry_after_ms / 1000 if isinstance(wire.retry_after_ms, int) else None
    if retry_after is None and headers is not None:
        header = headers.get("retry-after", "")
        retry_after = float(header) if header.isdigit() else None
    return problem_class(wire.status, wire.code)(
        wire.status,
        code=wire.code,
        title=wire.title,
        detail=wire.detail if isinstance(wire.detail, str) else "",
        type=wire.type_,
        retry_after=retry_after,
    )


def claim(parsed: ClaimAcquired | ClaimFinished, key: str, sealing: Sealing | None) -> Claim:
    """The claim of ``key``, its result or recovery point opened; Unsealable when one
    does not open."""
    if isinstance(parsed, ClaimAcquired):
        return Claim(
            outcome="acquired",
            token=parsed.lease_token,
            attempt=parsed.attempt,
            lease_expires_at=parsed.lease_expires_at,
            expires_at=parsed.expires_at,
            recovered=parsed.recovered,
            recovery_point=recovery_point(parsed.recovery_point, key, sealing),
        )
    return Claim(
        outcome=parsed.outcome,
        attempt=parsed.attempt,
        expires_at=parsed.expires_at,
        response=from_stored(parsed.response, key, str(parsed.outcome), sealing),
    )


def record(parsed: KeyRecord, key: str, sealing: Sealing | None) -> Record:
    """The record of ``key`` (bound to the key asked for, not the one answered), its
    result and recovery point opened; Unsealable when one does not open."""
    return Record(
        key=parsed.key,
        state=parsed.state,
        attempt=parsed.attempt,
        created_at=parsed.created_at,
        updated_at=parsed.updated_at,
        expires_at=parsed.expires_at,
        fingerprint=_text(parsed.fingerprint),
        owner=_text(parsed.owner),
        lease_expires_at=parsed.lease_expires_at
        if isinstance(parsed.lease_expires_at, datetime.datetime)
        else None,
        response=from_stored(parsed.response, key, parsed.state, sealing),
        recovery_point=recovery_point(parsed.recovery_point, key, sealing),
    )
