"""The lease that run-once work holds: what the function given to ``run``, a function
decorated with ``idempotent`` and a handler behind either middleware run under. The
clients, the middlewares and ``current_lease`` import it from here."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from ._errors import LeaseLost


@dataclass
class Lease:
    """The lease a function given to :meth:`Client.run` runs under. ``lost`` is set when
    a renewal finds the lease gone (another caller took the key over): the function
    should stop, and nothing it returns afterwards is stored.

    ``attempt`` grows by one at every acquisition of the key, so it is a fencing token
    for the function's writes; ``recovered`` is True when this lease took the key over
    from a holder whose lease ran out, which may have done the work already
    (docs/effects.md)."""

    key: str
    token: str
    attempt: int
    recovered: bool = False
    lost: threading.Event = field(default_factory=threading.Event)


@dataclass
class AsyncLease:
    """The lease a coroutine given to :meth:`AsyncClient.run` runs under. When a renewal
    finds the lease gone, ``lost`` is set and the coroutine is cancelled. ``attempt`` and
    ``recovered`` are those of :class:`idemd.Lease`."""

    key: str
    token: str
    attempt: int
    recovered: bool = False
    lost: asyncio.Event = field(default_factory=asyncio.Event)


def lease_lost(key: str) -> LeaseLost:
    """The error of a run whose lease was lost while it ran."""
    return LeaseLost(
        409,
        code="lease_lost",
        title="Lease lost",
        detail=f"{key!r} was taken over while the operation ran",
    )
