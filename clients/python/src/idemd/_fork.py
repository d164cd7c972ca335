"""Clients survive os.fork(): servers make them at import time and then fork workers
(gunicorn --preload, uWSGI, Celery's prefork pool, multiprocessing's 'fork' start method).

A forked child has only the thread that forked, so a batch another thread had in flight
would never end there, and a lock held at that moment would never be released. It also
shares the parent's sockets: two processes writing requests to one keep-alive
connection and reading its answers could each read an answer meant for the other. So in
the child every client that is still open drops the batcher and the connection pool it
inherited and starts with fresh ones. The inherited ones are not closed: closing an
AsyncClient's TLS connection sends close_notify on it, and closing any of its connections
unregisters it from the parent's event loop, whose epoll instance the child shares. Left
to the garbage collector, they only close the child's file descriptors; the parent's stay
open.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class Forkable(Protocol):
    def _renew_after_fork(self) -> None:
        """Replace, in a forked child, everything that the parent's threads or
        connections hold, without touching the parent's."""


_open: weakref.WeakSet[Forkable] = weakref.WeakSet()


def track(client: Forkable) -> None:
    """Renew ``client`` in every child forked while it is open."""
    _open.add(client)


def forget(client: Forkable) -> None:
    """``client`` was closed: a child gets it closed too."""
    _open.discard(client)


def _renew_in_child() -> None:
    for client in list(_open):
        client._renew_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)
