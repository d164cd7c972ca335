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


@dataclass(frozen=True)
class Result:
    """What ``run`` returns: the response, and whether it was replayed from an earlier
    run instead of made now."""

    response: Response
    replayed: bool
