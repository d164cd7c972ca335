"""The lease of the code running now, for code that is not handed it as an argument: a
function decorated with ``idempotent``, and handlers behind the middlewares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ._lease import AsyncLease, Lease

_current: ContextVar[Lease | AsyncLease | None] = ContextVar("idemd_lease", default=None)


def current_lease() -> Lease | AsyncLease | None:
    """The lease the code running now runs under, or None outside one.

    Set while a function given to ``run`` or ``once`` runs, while a function decorated
    with ``idempotent`` runs, and while a handler behind the ASGI or WSGI middleware
    runs. ``attempt`` is a fencing token for the code's writes and ``recovered`` says
    that a holder whose lease ran out may have done the work already (docs/effects.md).
    """
    return _current.get()


@contextmanager
def leased(held: Lease | AsyncLease) -> Iterator[None]:
    """Make ``held`` the current lease until the block ends."""
    token = _current.set(held)
    try:
        yield
    finally:
        _current.reset(token)
