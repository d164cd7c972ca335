"""The lease that run-once work holds, and how it is kept while the work runs.

A thread (:class:`Keeper`) or a task (:class:`AsyncKeeper`) renews the lease every third
of its length. The holder also reckons, on its own monotonic clock, when idemd may let
the lease run out: from the moment it sent the claim, or the last renewal that was
answered, plus the lease less a margin of :data:`MARGIN`. idemd starts the lease when
it receives the claim, which is after the send, so reckoning from the send already
covers the network; the margin is for the two clocks running at different rates, which
NTP keeps within 500 ppm and an unsynchronised crystal within some 100 ppm. Five per
cent leaves two orders of magnitude of room (virtual machines whose clocks stall) and
shortens a 30 s lease by 1.5 s.

When that local deadline passes with no renewal answered, the lease is lost exactly as
if idemd had answered lease_lost: by then another caller may hold the key, so nothing
the work returns may be stored, and a holder cut off from idemd must not go on believing
it holds the key. The error is :class:`LeaseExpired`, a :class:`LeaseLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

from ._errors import IdemdError, LeaseExpired, LeaseLost, NotFound
from ._types import RecoveryPoint

if TYPE_CHECKING:
    from ._async_client import AsyncClient
    from ._client import Client

#: The share of the lease the holder's reckoning leaves for clock-rate drift.
MARGIN = 0.05

#: The shortest pause between two renewals, so that a tiny lease cannot spin.
MIN_DELAY = 0.01


def local_deadline(sent: float, lease: float) -> float:
    """When a lease of ``lease`` seconds granted by a call sent at ``sent`` (on the
    time.monotonic() clock) is reckoned to have run out."""
    return sent + lease * (1 - MARGIN)


def renewal_period(lease: float) -> float:
    """The time from the send of one renewal answered (or of the claim) to the next."""
    return max(lease / 3, MIN_DELAY)


def retry_delay(lease: float, left: float, draw: Callable[[float, float], float] = random.uniform) -> float:
    """The pause before trying again after a renewal failed, with ``left`` seconds to the
    local deadline: shorter than the normal period, and shorter still as the deadline
    nears, so that a short outage is ridden out with tries to spare. It is drawn from
    [d/2, d] so that the holders cut off by one outage do not all come back at once."""
    d = max(MIN_DELAY, min(lease / 6, left / 3))
    return draw(d / 2, d)


Loss = Literal["answered", "expired"]

#: What one renewal came to: answered, failed with the lease still held, or the lease lost.
Renewal = Literal["answered", "failed", "lost"]


class _Reckoning:
    """The local deadline of one lease and whether the lease is over, shared by the
    thread or task that renews it and the code that runs under it.

    The lease is lost once (the first cause is kept): by an answered lease_lost or
    not_found, or by the deadline passing. Once the run is over (``end``), nothing
    changes any more: a renewal's late answer, or the clock, cannot mark the lease of a
    finished run lost."""

    def __init__(self, deadline: float, on_lost: Callable[[], None]) -> None:
        self.deadline = deadline
        self.loss: Loss | None = None
        self.ended = False
        #: Why the last renewal failed, when no renewal was answered since.
        self.failure: IdemdError | None = None
        self._on_lost = [on_lost]
        self._lock = threading.Lock()

    def when_lost(self, fn: Callable[[], None]) -> None:
        self._on_lost.append(fn)

    def _lose(self, loss: Loss) -> bool:
        """Marks the lease lost, the lock held; True when this call did."""
        if self.loss is not None or self.ended:
            return False
        self.loss = loss
        return True

    def _told(self) -> None:
        for fn in self._on_lost:
            fn()

    def check(self) -> bool:
        """Whether the lease is lost, marking it so once the deadline has passed."""
        if self.loss is not None:
            return True
        if self.ended or time.monotonic() < self.deadline:
            return False
        with self._lock:
            lost = time.monotonic() >= self.deadline and self._lose("expired")
        if lost:
            self._told()
        return self.loss is not None

    def answered(self, sent: float, lease: float) -> bool:
        """A renewal sent at ``sent`` was answered: the deadline moves to its send plus
        the lease, unless the answer came after the deadline, which no answer brings
        back. False when the lease is no longer held."""
        with self._lock:
            if self.loss is None and not self.ended:
                if time.monotonic() < self.deadline:
                    self.deadline = max(self.deadline, local_deadline(sent, lease))
                    self.failure = None
                    return True
                lost = self._lose("expired")
            else:
                lost = False
        if lost:
            self._told()
        return False

    def refused(self) -> None:
        """idemd answered that the lease is gone."""
        with self._lock:
            lost = self._lose("answered")
        if lost:
            self._told()

    def end(self) -> Loss | None:
        """The run is over: how the lease was lost, if it was; the clock is read one last
        time, so that work that returns after the deadline is never taken for a success."""
        self.check()
        with self._lock:
            self.ended = True
            return self.loss

    def remaining(self) -> float:
        if self.loss is not None or self.ended:
            return 0.0
        return max(0.0, self.deadline - time.monotonic())

    def over(self) -> bool:
        """Whether the lease is lost, or will be once anything looks: its deadline has
        passed during the run, which no renewal answered later brings back. It reads
        the clock and marks nothing, so any thread may ask."""
        if self.loss is not None:
            return True
        return not self.ended and time.monotonic() >= self.deadline


class _LostEvent(threading.Event):
    """``Lease.lost``: an event that is set when idemd answers that the lease is gone,
    and counts as set from the moment the local deadline passes. It reads the clock when
    asked, and a waiter wakes at the deadline, so no thread has to stand by to set it."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._reckoning = _Reckoning(deadline, super().set)

    def is_set(self) -> bool:
        return super().is_set() or self._reckoning.check()

    def wait(self, timeout: float | None = None) -> bool:
        end = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            if self.is_set():
                return True
            now = time.monotonic()
            if now >= end:
                return False
            # The deadline may move on while this waits: woken at the old one, the loop
            # reads the new one. Once the run is over, only the flag counts.
            r = self._reckoning
            until = end if r.ended else min(end, r.deadline)
            if super().wait(None if until == math.inf else max(until - now, 0.0)):
                return True


class _AsyncLostEvent(asyncio.Event):
    """``AsyncLease.lost``: an event that is set when the lease is lost, and counts as
    set from the moment the local deadline passes, as ``Lease.lost`` does. The keeper's
    timer sets it at the deadline, but only once the event loop runs again: work that
    blocks the loop past the deadline would otherwise find it clear while
    ``remaining()`` says 0. A waiter wakes at the deadline too."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._reckoning = _Reckoning(deadline, super().set)

    def is_set(self) -> bool:
        return super().is_set() or self._reckoning.over()

    async def wait(self) -> Literal[True]:
        while not self.is_set():
            # The deadline may move on while this waits: woken at the old one, the loop
            # reads the new one. Once the run is over, only the flag counts.
            r = self._reckoning
            timeout = None if r.ended or r.deadline == math.inf else max(r.deadline - time.monotonic(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(super().wait(), timeout)
        return True


def lease_lost(key: str) -> LeaseLost:
    return LeaseLost(
        409,
        code="lease_lost",
        title="Lease lost",
        detail=f"{key!r} was taken over while the operation ran",
    )


def lease_expired(key: str, failure: BaseException | None) -> LeaseExpired:
    err = LeaseExpired(
        0,
        title="Lease expired",
        detail=f"no renewal of the lease on {key!r} was answered before its local deadline; "
        "another caller may hold the key",
    )
    if failure is not None:
        err.__cause__ = failure
    return err


def _error(key: str, reckoning: _Reckoning, loss: Loss | None) -> LeaseLost | None:
    if loss is None:
        return None
    if loss == "expired":
        return lease_expired(key, reckoning.failure)
    return lease_lost(key)


C = TypeVar("C")


def _holder(client: C | None) -> C:
    if client is None:
        raise RuntimeError(
            "checkpoint needs a lease handed out by run, once, consume, a decorator, a middleware "
            "or a Completer"
        )
    return client


def _check_held(key: str, reckoning: _Reckoning) -> None:
    """Raises why the lease is lost, if it is: a holder that knows it lost the lease does
    not ask idemd to record anything under it."""
    lost = _error(key, reckoning, reckoning.loss if reckoning.check() else None)
    if lost is not None:
        raise lost


def _refused(key: str, reckoning: _Reckoning, err: LeaseLost | NotFound) -> NoReturn:
    """idemd answered a checkpoint that the lease is gone: the lease is lost, exactly as
    when a renewal is answered so, and what is raised is a LeaseLost."""
    reckoning.refused()
    if isinstance(err, LeaseLost):
        raise err
    raise lease_lost(key) from err


class Lease:
    """The lease a function given to :meth:`Client.run` runs under.

    ``lost`` is set when the lease is no longer held: a renewal heard from idemd that
    another caller took the key over, or no renewal was answered before the lease's
    local deadline (idemd unreachable), after which another caller may take it over.
    The function should stop, and nothing it returns afterwards is stored.

    ``remaining()`` is the time left to that deadline, in seconds (0.0 once the lease is
    lost or the run is over), and ``deadline`` the deadline itself on the
    ``time.monotonic()`` clock; renewals move it on. Bound a downstream call by it (a
    provider's request timeout), so that the call does not outlive the lease.

    ``attempt`` grows by one at every acquisition of the key, so it is a fencing token
    for the function's writes; ``recovered`` is True when this lease took the key over
    from a holder whose lease ran out, which may have done the work already
    (docs/effects.md). ``recovery_point`` is the last point an earlier holder recorded
    with :meth:`checkpoint`, which this lease starts from (None when none was; its data
    opened when the client seals, as :meth:`checkpoint` seals what it records), and
    ``key`` the full idemd key, a middleware's ``key_prefix`` included.

    A lease made by hand, without ``deadline``, is never reckoned lost by the clock, and
    without ``client`` it cannot record a checkpoint."""

    def __init__(
        self,
        key: str,
        token: str,
        attempt: int,
        recovered: bool = False,
        *,
        deadline: float = math.inf,
        recovery_point: RecoveryPoint | None = None,
        client: Client | None = None,
    ) -> None:
        self.key = key
        self.token = token
        self.attempt = attempt
        self.recovered = recovered
        self.recovery_point = recovery_point
        self._client = client
        self._lost = _LostEvent(deadline)
        self._reckoning = self._lost._reckoning

    @property
    def lost(self) -> threading.Event:
        """Set once the lease is no longer held."""
        return self._lost

    @property
    def deadline(self) -> float:
        """The local deadline, a time.monotonic() value."""
        return self._reckoning.deadline

    def remaining(self) -> float:
        """Seconds left to the local deadline; 0.0 once lost or once the run is over."""
        return self._reckoning.remaining()

    def checkpoint(self, name: str, data: bytes = b"") -> None:
        """Record a recovery point under this lease: ``name`` says how far the work got
        (1 to 128 bytes of UTF-8, for example ``"charged"``) and ``data`` what the next
        holder needs to go on from there (at most the daemon's
        ``--max-recovery-point-bytes``, 4096 by default). It replaces the point recorded
        before. Should this holder not finish the key, the next one finds the point in
        its ``recovery_point``: record one right after each effect that must not be made
        twice, with what identifies it.

        When idemd answers that the lease is lost (another caller took the key over, or
        the record is gone), it raises :class:`LeaseLost` and marks the lease lost as a
        renewal answered so would: ``lost`` is set, and the run stores nothing. Once the
        lease is lost, it raises why without asking idemd. Data over the daemon's limit
        raises :class:`PayloadTooLarge` and records nothing; the lease goes on."""
        client = _holder(self._client)
        _check_held(self.key, self._reckoning)
        try:
            client.record_recovery_point(self.key, self.token, name, data)
        except (LeaseLost, NotFound) as err:
            _refused(self.key, self._reckoning, err)

    def __repr__(self) -> str:
        return (
            f"Lease(key={self.key!r}, attempt={self.attempt}, recovered={self.recovered}, "
            f"lost={self.lost.is_set()})"
        )


class AsyncLease:
    """The lease a coroutine given to :meth:`AsyncClient.run` runs under. When a renewal
    finds the lease gone, or the local deadline passes with no renewal answered, ``lost``
    is set and the coroutine is cancelled. As with :class:`idemd.Lease`, ``lost`` counts
    as set from the moment the deadline passes, even while the coroutine blocks the event
    loop (the cancellation then comes at its next ``await``). ``attempt``, ``recovered``,
    ``recovery_point``, ``remaining()`` and ``deadline`` are those of
    :class:`idemd.Lease`, and :meth:`checkpoint` is its coroutine."""

    def __init__(
        self,
        key: str,
        token: str,
        attempt: int,
        recovered: bool = False,
        *,
        deadline: float = math.inf,
        recovery_point: RecoveryPoint | None = None,
        client: AsyncClient | None = None,
    ) -> None:
        self.key = key
        self.token = token
        self.attempt = attempt
        self.recovered = recovered
        self.recovery_point = recovery_point
        self._client = client
        self._lost = _AsyncLostEvent(deadline)
        self._reckoning = self._lost._reckoning

    @property
    def lost(self) -> asyncio.Event:
        """Set once the lease is no longer held: from the moment its local deadline
        passed, even while the event loop is blocked and has not yet cancelled the
        coroutine, as ``remaining()`` is 0 from then on."""
        return self._lost

    @property
    def deadline(self) -> float:
        """The local deadline, a time.monotonic() value."""
        return self._reckoning.deadline

    def remaining(self) -> float:
        """Seconds left to the local deadline; 0.0 once lost or once the run is over."""
        return self._reckoning.remaining()

    async def checkpoint(self, name: str, data: bytes = b"") -> None:
        """See :meth:`idemd.Lease.checkpoint`. An answer that the lease is lost also
        cancels the coroutine that runs under it, as a renewal answered so does: the
        cancellation comes at its next ``await`` after this raises."""
        client = _holder(self._client)
        _check_held(self.key, self._reckoning)
        try:
            await client.record_recovery_point(self.key, self.token, name, data)
        except (LeaseLost, NotFound) as err:
            _refused(self.key, self._reckoning, err)

    def __repr__(self) -> str:
        return (
            f"AsyncLease(key={self.key!r}, attempt={self.attempt}, recovered={self.recovered}, "
            f"lost={self.lost.is_set()})"
        )


def next_delay(lease: float, reckoning: _Reckoning, renewal: Renewal) -> float:
    """The pause before the next renewal, after one that was answered (or the claim) or
    one that failed. The normal period runs from the send of the last call answered,
    as the deadline does, so that an answer that was slow to come does not also put
    the next renewal off."""
    now = time.monotonic()
    if renewal == "answered":
        sent = reckoning.deadline - lease * (1 - MARGIN)
        return max(sent + renewal_period(lease) - now, MIN_DELAY)
    return retry_delay(lease, reckoning.deadline - now)


def claim_waited(sent: float, lease: float) -> bool:
    """Whether a claim sent at ``sent`` and answered now took more than a third of the
    lease (it waited for another holder): the work then starts with a deadline already
    near, so it is renewed once before the work starts."""
    return time.monotonic() - sent > lease / 3


class Keeper:
    """Keeps a :class:`Lease` while its work runs, from a thread of its own: ``extend``
    renews it for ``lease`` seconds."""

    def __init__(self, held: Lease, lease: float, extend: Callable[[], object]) -> None:
        self._held = held
        self._lease = lease
        self._extend = extend
        self._reckoning = held._reckoning
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def renew(self) -> Renewal:
        """Renews the lease once."""
        r = self._reckoning
        if r.check():
            return "lost"
        # The send is reckoned from here, before any batch the call may wait for, which
        # is never later than the request's real send.
        sent = time.monotonic()
        try:
            self._extend()
        except (LeaseLost, NotFound):
            r.refused()
            return "lost"
        except IdemdError as err:
            r.failure = err
            return "lost" if r.check() else "failed"
        return "answered" if r.answered(sent, self._lease) else "lost"

    def renew_now(self) -> LeaseLost | None:
        """Renews once before the work starts, after a claim that waited; the error to
        raise when the lease is not held, and the work must not run."""
        self.renew()
        r = self._reckoning
        return _error(self._held.key, r, r.loss if r.check() else None)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        delay = next_delay(self._lease, self._reckoning, "answered")
        while not self._stop.wait(delay):
            renewal = self.renew()
            if renewal == "lost":
                return
            delay = next_delay(self._lease, self._reckoning, renewal)

    def stop(self) -> LeaseLost | None:
        """Stops renewing, and ends the run: the error to raise when the lease was lost
        meanwhile. A renewal still in flight is waited for while the lease lasts, not
        beyond: its answer would come too late to matter."""
        self._stop.set()
        if self._thread is not None:
            left = self._held.remaining()
            self._thread.join(None if left == math.inf else left)
        r = self._reckoning
        return _error(self._held.key, r, r.end())


class AsyncKeeper:
    """Keeps an :class:`AsyncLease` while its work runs: a task renews it, and a timer of
    the event loop cancels the work at the local deadline, whether a renewal is in
    flight or not."""

    def __init__(self, held: AsyncLease, lease: float, extend: Callable[[], Awaitable[object]]) -> None:
        self._held = held
        self._lease = lease
        self._extend = extend
        self._reckoning = held._reckoning
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._work: asyncio.Future[Any] | None = None

    async def renew(self) -> Renewal:
        """See :meth:`Keeper.renew`."""
        r = self._reckoning
        if r.check():
            return "lost"
        # The send is reckoned from here, before any batch the call may wait for, which
        # is never later than the request's real send.
        sent = time.monotonic()
        try:
            await self._extend()
        except (LeaseLost, NotFound):
            r.refused()
            return "lost"
        except IdemdError as err:
            r.failure = err
            return "lost" if r.check() else "failed"
        return "answered" if r.answered(sent, self._lease) else "lost"

    async def renew_now(self) -> LeaseLost | None:
        """See :meth:`Keeper.renew_now`."""
        await self.renew()
        r = self._reckoning
        return _error(self._held.key, r, r.loss if r.check() else None)

    def start(self, work: asyncio.Future[Any]) -> None:
        """Renew while ``work`` runs, and cancel it when the lease is lost."""
        self._work = work
        self._reckoning.when_lost(self._cancel_work)
        self._arm()
        self._task = asyncio.create_task(self._keep())

    def _arm(self) -> None:
        r = self._reckoning
        if r.ended or r.loss is not None or r.deadline == math.inf:
            return
        self._timer = asyncio.get_running_loop().call_later(
            max(r.deadline - time.monotonic(), 0.0), self._ring
        )

    def _cancel_work(self) -> None:
        if self._work is not None:
            self._work.cancel()

    def _ring(self) -> None:
        # A renewal answered since the timer was set moved the deadline on: set it again
        # for the new one, rather than resetting it at every renewal.
        self._timer = None
        if not self._reckoning.check():
            self._arm()

    async def _keep(self) -> None:
        delay = next_delay(self._lease, self._reckoning, "answered")
        while True:
            await asyncio.sleep(delay)
            renewal = await self.renew()
            if renewal == "lost":
                return
            delay = next_delay(self._lease, self._reckoning, renewal)

    def end(self) -> LeaseLost | None:
        """Stops renewing at once and ends the run: the error to raise when the lease
        was lost. Await :meth:`stopped` for the renewing task to finish."""
        # A loss found now, by the last look at the clock, is reported but cancels
        # nothing: the work may be the task that is ending the run, as it sends the last
        # of its answer.
        self._work = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
        r = self._reckoning
        return _error(self._held.key, r, r.end())

    async def stopped(self) -> None:
        if self._task is not None:
            # asyncio.wait neither raises the renewer's cancellation nor swallows ours.
            await asyncio.wait([self._task])

    async def stop(self) -> LeaseLost | None:
        """:meth:`end`, then waits for the renewing task to finish."""
        lost = self.end()
        await self.stopped()
        return lost
