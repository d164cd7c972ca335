"""The completer: it finishes the work that holders left pending when they died or were
cut off, by reading the abandoned-keys feed and running a handler for each key through
the client's run path, so that the claim decides who finishes a key.

Any number of completers, in any number of processes, and the keys' own callers may run
at once: a key that another one holds is answered in progress and skipped, a key already
finished is replayed and skipped, and no handler runs for a key twice unless a lease is
lost. :class:`Completer` runs its handlers on threads, :class:`AsyncCompleter` as tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from ._async_client import AsyncClient
from ._client import Client
from ._errors import Failed, IdemdError, InProgress, Permanent, Problem, Unavailable
from ._lease import AsyncLease, Lease
from ._types import AbandonedKey, Response

#: The first pause of run after a pass that could not reach idemd, and the longest.
BACKOFF_FIRST = 0.25
BACKOFF_MAX = 30.0

_MAX_KEY = 255


@dataclass(frozen=True)
class CompleterStats:
    """What one pass did with the keys it took from the feed: ``listed`` is
    ``finished + failed + skipped + errors``.

    ``finished``: the handler ran and its result is stored. ``failed``: the handler
    raised :class:`Permanent`, stored as the key's failure. ``skipped``: not run, as
    another caller or completer holds the key, or it was finished since the feed listed
    it. ``errors``: the handler raised, or the key could not be claimed or finished; it
    stays pending and is listed again once its lease runs out."""

    listed: int = 0
    finished: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0


KeyOutcome = Literal["finished", "failed", "skipped", "errors"]


class _Tally:
    """The outcomes counted by the workers of one pass, or of every pass of run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[KeyOutcome, int] = {"finished": 0, "failed": 0, "skipped": 0, "errors": 0}

    def add(self, outcome: KeyOutcome) -> None:
        with self._lock:
            self._counts[outcome] += 1

    def progress(self) -> int:
        """How many keys were finished or failed: done with for good."""
        with self._lock:
            return self._counts["finished"] + self._counts["failed"]

    def stats(self, listed: int) -> CompleterStats:
        with self._lock:
            return CompleterStats(listed=listed, **self._counts)


def _outcome(err: Exception, ran: bool, handler_error: BaseException | None) -> KeyOutcome:
    """What an exception out of the run path means for the key: the claim found it held
    or finished (skipped), the handler's own Permanent was stored (failed), or anything
    else (errors)."""
    if not ran and isinstance(err, InProgress | Failed):
        return "skipped"
    if ran and err is handler_error and isinstance(err, Permanent):
        return "failed"
    return "errors"


def _passing(err: IdemdError) -> bool:
    """Whether a failure to read the feed is one that waiting mends: idemd or the way to
    it is down or overloaded. Anything else (a token refused, a prefix idemd refuses) is
    a mistake that no retry mends."""
    return isinstance(err, Unavailable) or (
        isinstance(err, Problem) and (err.status == 429 or err.status >= 500)
    )


def backoff_delay(failures: int, draw: Callable[[float, float], float] = random.uniform) -> float:
    """The pause of run after ``failures`` passes in a row could not read the feed:
    doubling from BACKOFF_FIRST up to BACKOFF_MAX, drawn from [d/2, d] so that the
    completers cut off by one outage do not all come back at once."""
    d = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(failures - 1, 16))
    return draw(d / 2, d)


class _Options:
    """The options shared by both completers, checked once."""

    def __init__(
        self,
        prefix: str,
        all_keys: bool,
        older_than: float,
        concurrency: int,
        lease: float,
        poll_interval: float,
        on_error: Callable[[str | None, Exception], None] | None,
    ) -> None:
        if not isinstance(prefix, str):
            raise TypeError("prefix is a str")
        if not prefix and not all_keys:
            raise ValueError(
                "a prefix is required: the keys of one kind of work, which one handler finishes; "
                "pass all_keys=True to finish every abandoned key with it"
            )
        if prefix and all_keys:
            raise ValueError("all_keys with a prefix: choose one")
        try:
            size = len(prefix.encode("utf-8"))
        except UnicodeError as err:
            raise ValueError("the prefix is not valid UTF-8") from err
        if size > _MAX_KEY:
            raise ValueError(f"the prefix is {size} bytes; a key is at most {_MAX_KEY}")
        if older_than < 0:
            raise ValueError("older_than cannot be negative")
        if concurrency < 1:
            raise ValueError("concurrency is at least 1")
        # idemd refuses every claim outside the contract's limits.
        if not 0.1 <= lease <= 3600:
            raise ValueError("lease is 0.1 to 3600 seconds")
        if poll_interval <= 0:
            raise ValueError("poll_interval is more than 0 seconds")
        self.prefix = prefix
        self.older_than = older_than
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll_interval
        self.on_error = on_error

    def report(self, key: str | None, err: Exception) -> None:
        if self.on_error is None:
            return
        # A hook that fails must not stop the completer.
        with contextlib.suppress(Exception):
            self.on_error(key, err)


class _Workers:
    """At most ``n`` handlers at once, each on a thread of the pool; :meth:`submit` waits
    for a free one, so that the feed is read no faster than its keys are run."""

    def __init__(self, n: int, cond: threading.Condition, stopped: threading.Event) -> None:
        self._n = n
        self._cond = cond
        self._stopped = stopped
        self._running: set[str] = set()
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="idemd-completer")
        #: What a handler raised that is not an Exception, raised again by close.
        self._crash: BaseException | None = None

    def running(self, key: str) -> bool:
        with self._cond:
            return key in self._running

    def submit(self, key: str, fn: Callable[[], None]) -> bool:
        """Runs ``fn`` for ``key`` once a worker is free; False when the completer was
        stopped meanwhile, and ``fn`` does not run."""
        with self._cond:
            while len(self._running) >= self._n and not self._stopped.is_set():
                self._cond.wait()
            if self._stopped.is_set():
                return False
            self._running.add(key)
        self._pool.submit(self._work, key, fn)
        return True

    def _work(self, key: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as err:
            self._crash = self._crash or err
        finally:
            with self._cond:
                self._running.discard(key)
                self._cond.notify_all()

    def close(self) -> None:
        """Waits for the handlers that run, then raises what one of them crashed with."""
        self._pool.shutdown(wait=True)
        if self._crash is not None:
            raise self._crash


class Completer:
    """Finishes the keys under ``prefix`` that their holders left pending (the
    abandoned-keys feed, :meth:`Client.abandoned`), on threads, with ``handler``.

    ``handler`` is called as a function given to :meth:`Client.run` is, with the lease:
    its ``key``, ``recovered`` True when the key was taken over from a holder whose lease
    ran out (the usual case), the ``attempt``, and the ``recovery_point`` that holder
    recorded, if any; it may record progress with ``lease.checkpoint``. It finishes the
    work, or compensates it, and returns the :class:`Response` stored as the key's result,
    which the key's own callers then get back. A :class:`Permanent` it raises is stored
    as the key's failure. Any other exception leaves the key pending rather than freeing
    it for a retry as run would, since a released key is no longer in the feed the
    completer works from: the feed lists it again once the lease runs out.

    Each key is claimed with the fingerprint the feed shows, so the claim decides who
    finishes it: a key another caller or completer holds is skipped, and so is one
    finished since it was listed.

    With a client given sealing, the handler's recovery point is opened and its result
    stored sealed; a point that does not open (:class:`Unsealable`) is an error of the
    key, which stays pending for a completer whose ring holds its key.

    Options: ``prefix`` selects the keys, for example a middleware's ``key_prefix``; it
    is required, and may be empty only with ``all_keys=True`` (then every abandoned key
    of the tenant goes to this one handler), so that a prefix left empty by mistake is an
    error rather than a handler run on every other kind of work. ``older_than`` (seconds,
    default 0) leaves alone the keys whose lease ran out more recently, for example to
    give their own callers time to retry first. ``concurrency`` (default 4) bounds the
    handlers that run at once. ``lease`` (default 30 s) is the lease each handler runs
    under, renewed while it runs; it is also how long a key whose handler failed waits
    before it is listed again. ``poll_interval`` (default 5 s) is how long :meth:`run`
    waits before the next pass after a pass that finished nothing. ``on_error`` is called
    with each error met and not raised: a key that could not be finished (with its key),
    and in :meth:`run` a pass that could not read the feed (with None).
    """

    def __init__(
        self,
        client: Client,
        handler: Callable[[Lease], Response],
        *,
        prefix: str = "",
        all_keys: bool = False,
        older_than: float = 0.0,
        concurrency: int = 4,
        lease: float = 30.0,
        poll_interval: float = 5.0,
        on_error: Callable[[str | None, Exception], None] | None = None,
    ) -> None:
        if not callable(handler):
            raise TypeError("handler is a function of the lease")
        self._client = client
        self._handler = handler
        self._o = _Options(prefix, all_keys, older_than, concurrency, lease, poll_interval, on_error)
        self._stopped = threading.Event()
        self._cond = threading.Condition()

    def stop(self) -> None:
        """Stops the completer, from any thread: :meth:`run` and :meth:`run_once` take no
        more keys and return once the handlers that run have returned (a thread cannot
        be interrupted, so a handler that runs is waited for, and its result stored).
        A stopped completer stays stopped."""
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()

    def run_once(self) -> CompleterStats:
        """One pass over the feed, every page of it, running the handler for each key
        listed; returns once the handlers it started have returned. A feed that cannot be
        read to its end raises its error, once those handlers have returned (the keys
        listed until then were run)."""
        tally = _Tally()
        workers = _Workers(self._o.concurrency, self._cond, self._stopped)
        try:
            listed = self._pass(workers, tally)
        finally:
            workers.close()
        return tally.stats(listed)

    def run(self) -> None:
        """Finishes abandoned keys until :meth:`stop` is called, then returns once the
        handlers that run have returned. Its workers outlive the passes over the feed: a
        pass hands them the keys that are not running already, so a handler that takes
        long holds up no other key. After a pass that handed out keys and during which
        a key was finished or failed, the next starts at once, for more may be waiting;
        otherwise it starts ``poll_interval`` later. While idemd cannot be reached
        (:class:`Unavailable`, 429, 5xx) the passes come further and further apart, from
        0.25 s doubling up to 30 s with jitter; each failed pass goes to ``on_error``,
        and run never returns for one. A feed that idemd refuses otherwise (401, 403,
        400) is a mistake that no retry mends: run raises it, once its handlers
        returned."""
        tally = _Tally()
        workers = _Workers(self._o.concurrency, self._cond, self._stopped)
        failures = 0
        try:
            while not self._stopped.is_set():
                before = tally.progress()
                try:
                    handed = self._pass(workers, tally, skip=workers.running)
                except IdemdError as err:
                    if not _passing(err):
                        raise
                    self._o.report(None, err)
                    failures += 1
                    self._stopped.wait(backoff_delay(failures))
                    continue
                failures = 0
                if handed == 0 or tally.progress() == before:
                    self._stopped.wait(self._o.poll_interval)
        finally:
            workers.close()

    def _pass(self, workers: _Workers, tally: _Tally, skip: Callable[[str], bool] | None = None) -> int:
        """Reads every page of the feed and hands each key to the workers, once in the
        pass, but not the keys that ``skip`` says run already; returns how many it
        handed out."""
        seen: set[str] = set()
        handed = 0
        o = self._o
        for k in self._client.abandoned_keys(prefix=o.prefix, older_than=o.older_than):
            if self._stopped.is_set():
                break
            # A page read later may list again a key that was given up meanwhile; one run
            # a pass is enough.
            if k.key in seen or (skip is not None and skip(k.key)):
                continue
            seen.add(k.key)
            if not workers.submit(k.key, functools.partial(self._count, k, tally)):
                break
            handed += 1
        return handed

    def _count(self, k: AbandonedKey, tally: _Tally) -> None:
        tally.add(self._finish(k))

    def _finish(self, k: AbandonedKey) -> KeyOutcome:
        """Runs the handler for ``k`` by the client's run path, and says how it went."""
        ran = False
        handler_error: BaseException | None = None

        def body(held: Lease) -> Response:
            nonlocal ran, handler_error
            ran = True
            try:
                return self._handler(held)
            except BaseException as err:
                handler_error = err
                raise

        try:
            result = self._client._claim_and_run(
                k.key, body, k.fingerprint, self._o.lease, None, release=False
            )
        except Exception as err:
            outcome = _outcome(err, ran, handler_error)
            if outcome == "errors":
                self._o.report(k.key, err)
            return outcome
        return "skipped" if result.replayed else "finished"


class _Tasks:
    """At most ``n`` handlers at once, each a task; :meth:`submit` waits for a free one.
    Used from the event loop's thread only."""

    def __init__(self, n: int, stopped: Callable[[], bool]) -> None:
        self._n = n
        self._stopped = stopped
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wakeup: asyncio.Future[None] | None = None

    def running(self, key: str) -> bool:
        return key in self._tasks

    def wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def submit(self, key: str, work: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """See :meth:`_Workers.submit`."""
        while len(self._tasks) >= self._n and not self._stopped():
            self._wakeup = asyncio.get_running_loop().create_future()
            await self._wakeup
        if self._stopped():
            return False
        task = asyncio.create_task(work())
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._done(key))
        return True

    def _done(self, key: str) -> None:
        self._tasks.pop(key, None)
        self.wake()

    async def close(self, cancel: bool) -> None:
        """Waits for the handlers that run, cancelling them first with ``cancel``."""
        tasks = list(self._tasks.values())
        if cancel:
            for task in tasks:
                task.cancel()
        if tasks:
            # asyncio.wait neither raises the handlers' cancellation nor swallows ours.
            await asyncio.wait(tasks)


class AsyncCompleter:
    """The :class:`Completer` of an :class:`AsyncClient`: the same options, with a
    coroutine function of the :class:`AsyncLease` as ``handler``, whose handlers run as
    tasks of the event loop.

    :meth:`stop` (from the event loop's thread; from another, through
    ``loop.call_soon_threadsafe``) makes :meth:`run` and :meth:`run_once` take no more
    keys and return once the handlers that run have returned, their results stored.
    Cancelling the task of :meth:`run` or :meth:`run_once` cancels the handlers that run
    instead, waits for them to end, and raises the cancellation: a handler cancelled
    leaves its key pending, for the next completer once its lease runs out."""

    def __init__(
        self,
        client: AsyncClient,
        handler: Callable[[AsyncLease], Awaitable[Response]],
        *,
        prefix: str = "",
        all_keys: bool = False,
        older_than: float = 0.0,
        concurrency: int = 4,
        lease: float = 30.0,
        poll_interval: float = 5.0,
        on_error: Callable[[str | None, Exception], None] | None = None,
    ) -> None:
        if not callable(handler):
            raise TypeError("handler is a coroutine function of the lease")
        self._client = client
        self._handler = handler
        self._o = _Options(prefix, all_keys, older_than, concurrency, lease, poll_interval, on_error)
        self._stopped = asyncio.Event()
        self._pools: set[_Tasks] = set()

    def stop(self) -> None:
        """See the class. A stopped completer stays stopped."""
        self._stopped.set()
        for pool in self._pools:
            pool.wake()

    async def run_once(self) -> CompleterStats:
        """See :meth:`Completer.run_once`."""
        tally = _Tally()
        tasks = self._tasks()
        try:
            listed = await self._pass(tasks, tally)
        except Exception:
            await self._close(tasks, cancel=False)
            raise
        except BaseException:
            await self._close(tasks, cancel=True)
            raise
        await self._close(tasks, cancel=False)
        return tally.stats(listed)

    async def run(self) -> None:
        """See :meth:`Completer.run`; it returns after :meth:`stop`, and raises the
        cancellation of its task once the handlers it cancelled have ended."""
        tally = _Tally()
        tasks = self._tasks()
        try:
            await self._passes(tasks, tally)
        except Exception:
            await self._close(tasks, cancel=False)
            raise
        except BaseException:
            await self._close(tasks, cancel=True)
            raise
        await self._close(tasks, cancel=False)

    async def _passes(self, tasks: _Tasks, tally: _Tally) -> None:
        failures = 0
        while not self._stopped.is_set():
            before = tally.progress()
            try:
                handed = await self._pass(tasks, tally, skip=tasks.running)
            except IdemdError as err:
                if not _passing(err):
                    raise
                self._o.report(None, err)
                failures += 1
                await self._pause(backoff_delay(failures))
                continue
            failures = 0
            if handed == 0 or tally.progress() == before:
                await self._pause(self._o.poll_interval)

    def _tasks(self) -> _Tasks:
        tasks = _Tasks(self._o.concurrency, self._stopped.is_set)
        self._pools.add(tasks)
        return tasks

    async def _close(self, tasks: _Tasks, cancel: bool) -> None:
        self._pools.discard(tasks)
        await tasks.close(cancel)

    async def _pause(self, seconds: float) -> None:
        """Waits ``seconds``, or less when the completer is stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    async def _pass(self, tasks: _Tasks, tally: _Tally, skip: Callable[[str], bool] | None = None) -> int:
        """See :meth:`Completer._pass`."""
        seen: set[str] = set()
        handed = 0
        o = self._o
        # Closed at once when the pass stops early, rather than when it is collected.
        async with contextlib.aclosing(
            self._client.abandoned_keys(prefix=o.prefix, older_than=o.older_than)
        ) as keys:
            async for k in keys:
                if self._stopped.is_set():
                    break
                if k.key in seen or (skip is not None and skip(k.key)):
                    continue
                seen.add(k.key)
                if not await tasks.submit(k.key, functools.partial(self._count, k, tally)):
                    break
                handed += 1
        return handed

    async def _count(self, k: AbandonedKey, tally: _Tally) -> None:
        tally.add(await self._finish(k))

    async def _finish(self, k: AbandonedKey) -> KeyOutcome:
        """See :meth:`Completer._finish`."""
        ran = False
        handler_error: BaseException | None = None

        async def body(held: AsyncLease) -> Response:
            nonlocal ran, handler_error
            ran = True
            try:
                return await self._handler(held)
            except BaseException as err:
                handler_error = err
                raise

        try:
            result = await self._client._claim_and_run(
                k.key, body, k.fingerprint, self._o.lease, None, release=False
            )
        except Exception as err:
            outcome = _outcome(err, ran, handler_error)
            if outcome == "errors":
                self._o.report(k.key, err)
            return outcome
        return "skipped" if result.replayed else "finished"
