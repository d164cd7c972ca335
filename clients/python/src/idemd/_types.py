"""The values the client returns: plain dataclasses, free of the generated models."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Literal

#: What a claim produced; another caller holding the key is :class:`InProgress` instead.
Outcome = Literal["acquired", "completed", "failed"]

#: What a release does: ``retry`` frees the key for the next claim, ``fail`` stores a
#: terminal failure that later claims replay.
ReleaseMode = Literal["retry", "fail"]


@dataclass(frozen=True)
class Response:
    """An operation's result as idemd stores and replays it."""

    status: int = 200
    headers: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class RecoveryPoint:
    """How far a holder of a key got, as it recorded it with ``lease.checkpoint``: the
    next acquisition of the key (a takeover, or a claim after a release for a retry)
    receives it, so that the work resumes from there instead of starting over.
    ``attempt`` is the attempt of the holder that recorded it, ``recorded_at`` when idemd
    recorded it, by idemd's clock."""

    name: str
    data: bytes
    attempt: int
    recorded_at: datetime.datetime


@dataclass(frozen=True)
class Claim:
    """A claim's answer. ``token`` is set when ``outcome`` is ``acquired``; ``response``
    when it is ``completed`` or ``failed``."""

    outcome: Outcome
    attempt: int
    expires_at: datetime.datetime
    token: str = ""
    lease_expires_at: datetime.datetime | None = None
    recovered: bool = False
    response: Response | None = None
    #: The last recovery point of the key, which an acquired lease starts from.
    recovery_point: RecoveryPoint | None = None


@dataclass(frozen=True)
class Record:
    """What idemd keeps for a key. ``state`` is an open set: pending, released,
    completed, failed, and perhaps others later."""

    key: str
    state: str
    attempt: int
    created_at: datetime.datetime
    updated_at: datetime.datetime
    expires_at: datetime.datetime
    fingerprint: str = ""
    owner: str = ""
    lease_expires_at: datetime.datetime | None = None
    response: Response | None = None
    #: The last recovery point, while the key is not finished.
    recovery_point: RecoveryPoint | None = None


@dataclass(frozen=True)
class Result:
    """What ``run`` returns: the response, and whether it was replayed from an earlier
    run instead of made now."""

    response: Response
    replayed: bool


@dataclass(frozen=True)
class AbandonedKey:
    """A key whose holder left it pending: its lease ran out, more than the asked
    ``older_than`` ago, and nobody has claimed it since.

    ``attempt`` is the attempt of the holder that left it (a claim now is the next);
    ``fingerprint`` is the one a claim must carry to acquire it ("" when it has none, and
    a claim must then carry none); ``owner`` is the label of that holder's claim;
    ``recovery_point`` is the name of the last recovery point, "" when none was recorded
    (a claim of the key receives the whole point)."""

    key: str
    attempt: int
    lease_expired_at: datetime.datetime
    fingerprint: str = ""
    owner: str = ""
    recovery_point: str = ""


@dataclass(frozen=True)
class AbandonedPage:
    """One page of the abandoned-keys feed. ``next_cursor`` reads the next page, None at
    the end; a page may hold fewer keys than its limit, even none, and still have one."""

    keys: list[AbandonedKey]
    next_cursor: str | None = None
