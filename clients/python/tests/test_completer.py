"""The completer, over real HTTP against a real idemd: it finishes the keys that holders
left pending, each once however many completers run, skips the keys that someone else
holds or finished, leaves pending the keys whose handler failed, stores a permanent
failure, and runs until it is stopped, riding out an idemd it cannot reach."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import Daemon, fresh_key, wait_until
from proxy import GateProxy
from slowdown import scale

import idemd
from idemd._completer import BACKOFF_FIRST, BACKOFF_MAX, backoff_delay


@pytest.fixture
def proxies(daemon: Daemon) -> Iterator[Callable[..., GateProxy]]:
    made: list[GateProxy] = []

    def make(**options: Any) -> GateProxy:
        proxy = GateProxy(daemon.url, **{"hold": (), **options})
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


class Handled:
    """What the handlers saw, shared by every completer of a test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: Counter[str] = Counter()
        self.leases: dict[str, tuple[int, bool, str | None, bytes]] = {}

    def saw(self, held: idemd.Lease | idemd.AsyncLease) -> None:
        point = held.recovery_point
        with self.lock:
            self.runs[held.key] += 1
            self.leases[held.key] = (
                held.attempt,
                held.recovered,
                None if point is None else point.name,
                b"" if point is None else point.data,
            )


def abandoned_keys(daemon: Daemon, prefix: str, n: int, listed_first: bool = True) -> dict[str, str]:
    """``n`` keys under ``prefix`` whose holder claimed them and never finished: every
    other one with a fingerprint, the first half with a recovery point. Returns each
    key's fingerprint, once the feed lists them all (unless ``listed_first`` is False,
    for a completer that may take them as soon as they are)."""
    keys: dict[str, str] = {}
    with idemd.Client(daemon.url, owner="died") as c:
        for i in range(n):
            key, fp = f"{prefix}{i:02d}", f"sha256:{i:064x}" if i % 2 else ""
            claim = c.claim(key, fingerprint=fp, lease=0.2)
            if i < n // 2:
                c.record_recovery_point(key, claim.token, "step", f"data-{i}".encode())
            keys[key] = fp
        if listed_first:
            wait_until(f"the {n} leases to run out", lambda: listed(c, prefix) == set(keys))
    return keys


def listed(c: idemd.Client, prefix: str) -> set[str]:
    return {k.key for k in c.abandoned_keys(prefix=prefix)}


def assert_finished(daemon: Daemon, keys: dict[str, str], handled: Handled) -> None:
    """Each key's handler ran once in all, under the lease that took it over, from its
    recovery point; every key is completed with the handler's result."""
    assert handled.runs == Counter(dict.fromkeys(keys, 1))
    n = len(keys)
    for i, key in enumerate(sorted(keys)):
        point = ("step", f"data-{i}".encode()) if i < n // 2 else (None, b"")
        assert handled.leases[key] == (2, True, *point)
    with idemd.Client(daemon.url) as c:
        for key, fp in keys.items():
            record = c.lookup(key)
            assert (record.state, record.attempt, record.fingerprint) == ("completed", 2, fp)
            assert record.response == idemd.Response(200, body=f"finished {key}".encode())
            assert record.recovery_point is None


def completed(c: idemd.Client, keys: dict[str, str]) -> bool:
    return all(c.lookup(k).state == "completed" for k in keys)


def test_two_completers_finish_each_key_once(daemon: Daemon) -> None:
    """Two completers on two clients pass over the same feed at the same time: the claims
    decide, so every key is finished once in all, and what one finished or holds the
    other skips."""
    prefix = fresh_key("complete") + "/"
    keys = abandoned_keys(daemon, prefix, 8)
    handled = Handled()
    start = threading.Barrier(2, timeout=scale(30))

    def finish(held: idemd.Lease) -> idemd.Response:
        handled.saw(held)
        return idemd.Response(200, body=f"finished {held.key}".encode())

    def one_pass(c: idemd.Client) -> idemd.CompleterStats:
        completer = idemd.Completer(c, finish, prefix=prefix, concurrency=2)
        start.wait()
        return completer.run_once()

    with idemd.Client(daemon.url) as a, idemd.Client(daemon.url) as b, ThreadPoolExecutor(2) as pool:
        stats = [f.result(scale(60)) for f in [pool.submit(one_pass, a), pool.submit(one_pass, b)]]
    assert_finished(daemon, keys, handled)
    assert sum(s.finished for s in stats) == len(keys)
    for s in stats:
        assert (s.failed, s.errors) == (0, 0)
        assert s.listed == s.finished + s.skipped
    # A pass over a finished feed lists nothing.
    with idemd.Client(daemon.url) as c:
        assert idemd.Completer(c, finish, prefix=prefix).run_once() == idemd.CompleterStats()
    assert handled.runs == Counter(dict.fromkeys(keys, 1))


def test_two_async_completers_finish_each_key_once(daemon: Daemon) -> None:
    """As the sync test, with two AsyncCompleters on two AsyncClients in one loop."""
    prefix = fresh_key("complete-async") + "/"
    keys = abandoned_keys(daemon, prefix, 8)
    handled = Handled()

    async def finish(held: idemd.AsyncLease) -> idemd.Response:
        handled.saw(held)
        await asyncio.sleep(0)  # let the other completer's calls interleave
        return idemd.Response(200, body=f"finished {held.key}".encode())

    async def main() -> list[idemd.CompleterStats]:
        async with idemd.AsyncClient(daemon.url) as a, idemd.AsyncClient(daemon.url) as b:
            completers = [idemd.AsyncCompleter(c, finish, prefix=prefix, concurrency=2) for c in (a, b)]
            return list(await asyncio.gather(*(c.run_once() for c in completers)))

    stats = asyncio.run(main())
    assert_finished(daemon, keys, handled)
    assert sum(s.finished for s in stats) == len(keys)
    for s in stats:
        assert (s.failed, s.errors) == (0, 0)
        assert s.listed == s.finished + s.skipped


def test_completer_skips_fails_and_leaves_pending(daemon: Daemon) -> None:
    """One completer, one key at a time, over five abandoned keys. While the first key's
    handler runs, the test claims one of the others (held live by someone else) and
    finishes another: the completer skips both without running them. Of the last two,
    one handler raises (the key stays pending, not released, and is listed again once
    its lease runs out) and one raises Permanent (stored as the key's failure)."""
    prefix = fresh_key("complete-mixed") + "/"
    keys = abandoned_keys(daemon, prefix, 5)
    handled = Handled()
    roles: dict[str, str] = {}
    first_runs, roles_set = threading.Event(), threading.Event()
    errors: list[tuple[str | None, Exception]] = []

    def handler(held: idemd.Lease) -> idemd.Response:
        handled.saw(held)
        if not first_runs.is_set():
            roles[held.key] = "ok"
            first_runs.set()
            assert roles_set.wait(scale(30))
        role = roles[held.key]
        if role == "error":
            raise RuntimeError("the provider is down")
        if role == "permanent":
            raise idemd.Permanent(idemd.Response(402, body=b"declined"))
        assert role == "ok", f"{held.key} ({role}) ran"
        return idemd.Response(200, body=f"finished {held.key}".encode())

    c = idemd.Client(daemon.url)
    completer = idemd.Completer(
        c, handler, prefix=prefix, concurrency=1, lease=0.5, on_error=lambda k, e: errors.append((k, e))
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(completer.run_once)
        assert first_runs.wait(scale(30))
        live, finished, error, permanent = sorted(set(keys) - set(roles))
        roles.update({live: "live", finished: "finished", error: "error", permanent: "permanent"})
        other = idemd.Client(daemon.url)
        held = other.claim(live, fingerprint=keys[live], lease=60)
        assert held.outcome == "acquired"
        theirs = other.claim(finished, fingerprint=keys[finished])
        other.complete(finished, theirs.token, idemd.Response(201, body=b"theirs"))
        roles_set.set()
        stats = running.result(scale(60))

    assert stats == idemd.CompleterStats(listed=5, finished=1, failed=1, skipped=2, errors=1)
    ok = next(k for k, r in roles.items() if r == "ok")
    assert set(handled.runs) == {ok, error, permanent}
    assert all(n == 1 for n in handled.runs.values())
    assert [(k, type(e)) for k, e in errors] == [(error, RuntimeError)]
    assert c.lookup(ok).state == "completed"
    assert (c.lookup(live).state, c.lookup(live).attempt) == ("pending", 2)
    assert c.lookup(finished).response == idemd.Response(201, body=b"theirs")
    failed = c.lookup(permanent)
    assert (failed.state, failed.response) == ("failed", idemd.Response(402, body=b"declined"))
    left = c.lookup(error)
    assert (left.state, left.attempt) == ("pending", 2)
    wait_until("the failed key to be listed again", lambda: error in listed(c, prefix))
    again = next(k for k in c.abandoned_keys(prefix=prefix) if k.key == error)
    assert again.attempt == 2


def test_run_stops_when_asked(daemon: Daemon) -> None:
    """run finishes keys as they are abandoned, pass after pass, until stop: it takes no
    more keys, waits for the handler in flight (whose result is stored), and returns;
    no handler runs afterwards."""
    prefix = fresh_key("complete-run") + "/"
    handled = Handled()
    gate, in_flight = threading.Event(), threading.Event()

    def handler(held: idemd.Lease) -> idemd.Response:
        handled.saw(held)
        if held.key.endswith("slow"):
            in_flight.set()
            assert gate.wait(scale(30))
        return idemd.Response(200, body=f"finished {held.key}".encode())

    c = idemd.Client(daemon.url)
    completer = idemd.Completer(c, handler, prefix=prefix, poll_interval=0.05)
    runner = threading.Thread(target=completer.run)
    runner.start()
    try:
        first = abandoned_keys(daemon, prefix + "a", 2, listed_first=False)
        wait_until("the first keys to be finished", lambda: completed(c, first))
        # Keys abandoned later are picked up by a later pass.
        second = abandoned_keys(daemon, prefix + "b", 2, listed_first=False)
        wait_until("the later keys to be finished", lambda: completed(c, second))
        assert c.claim(prefix + "slow", lease=0.2).outcome == "acquired"
        assert in_flight.wait(scale(30))
        completer.stop()
        assert runner.is_alive()  # the handler in flight holds it
        gate.set()
        runner.join(scale(30))
        assert not runner.is_alive()
    finally:
        completer.stop()
        gate.set()
        runner.join(scale(30))
    assert c.lookup(prefix + "slow").state == "completed"
    runs = Counter(handled.runs)
    assert runs == Counter(dict.fromkeys([*first, *second, prefix + "slow"], 1))
    late = abandoned_keys(daemon, prefix + "late", 1)
    assert handled.runs == runs
    assert all(c.lookup(k).state == "pending" for k in late)
    # A stopped completer stays stopped.
    completer.run()
    assert completer.run_once() == idemd.CompleterStats()


def test_async_run_stops_when_asked_or_cancelled(daemon: Daemon) -> None:
    """stop makes run return once the handler in flight returned, its result stored.
    Cancelling run's task instead cancels the handler in flight, which leaves its key
    pending (not released), and raises the cancellation."""
    prefix = fresh_key("complete-run-async") + "/"
    handled = Handled()

    async def main() -> None:
        gate, in_flight = asyncio.Event(), asyncio.Event()
        cancelled: list[str] = []

        async def handler(held: idemd.AsyncLease) -> idemd.Response:
            handled.saw(held)
            if "slow" in held.key:
                in_flight.set()
                try:
                    await asyncio.wait_for(gate.wait(), scale(30))
                except asyncio.CancelledError:
                    cancelled.append(held.key)
                    raise
            return idemd.Response(200, body=f"finished {held.key}".encode())

        async with idemd.AsyncClient(daemon.url) as c:
            completer = idemd.AsyncCompleter(c, handler, prefix=prefix, poll_interval=0.05)
            task = asyncio.create_task(completer.run())
            keys = await asyncio.to_thread(abandoned_keys, daemon, prefix + "a", 3, False)
            with idemd.Client(daemon.url) as sync:
                await asyncio.to_thread(wait_until, "the keys to be finished", lambda: completed(sync, keys))
            await c.claim(prefix + "slow-1", lease=0.2)
            await asyncio.wait_for(in_flight.wait(), scale(30))
            completer.stop()
            assert not task.done()  # the handler in flight holds it
            gate.set()
            await asyncio.wait_for(task, scale(30))
            assert (await c.lookup(prefix + "slow-1")).state == "completed"

            gate.clear()
            in_flight.clear()
            other = idemd.AsyncCompleter(c, handler, prefix=prefix + "slow-2", poll_interval=0.05)
            task = asyncio.create_task(other.run())
            await c.claim(prefix + "slow-2", lease=0.2)
            await asyncio.wait_for(in_flight.wait(), scale(30))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert cancelled == [prefix + "slow-2"]
            left = await c.lookup(prefix + "slow-2")
            assert (left.state, left.attempt) == ("pending", 2)

    asyncio.run(main())
    assert all(n == 1 for n in handled.runs.values())
    assert len(handled.runs) == 5


def test_run_rides_out_an_unreachable_idemd(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    """With its link to idemd cut, run reports each failed pass and keeps going, the
    passes further and further apart; once the link is back it finishes the keys."""
    proxy = proxies()
    proxy.cut = True
    prefix = fresh_key("complete-outage") + "/"
    errors: list[tuple[str | None, Exception, float]] = []

    def handler(held: idemd.Lease) -> idemd.Response:
        return idemd.Response(200, body=f"finished {held.key}".encode())

    completer = idemd.Completer(
        idemd.Client(proxy.url, retries=0),
        handler,
        prefix=prefix,
        poll_interval=0.05,
        on_error=lambda k, e: errors.append((k, e, time.monotonic())),
    )
    runner = threading.Thread(target=completer.run)
    runner.start()
    try:
        wait_until("three failed passes", lambda: len(errors) >= 3)
        assert runner.is_alive()
        assert all(k is None and isinstance(e, idemd.Unavailable) for k, e, _ in errors)
        keys = abandoned_keys(daemon, prefix, 2)
        proxy.cut = False
        with idemd.Client(daemon.url) as c:
            wait_until("the keys to be finished", lambda: completed(c, keys))
    finally:
        completer.stop()
        runner.join(scale(30))
    assert not runner.is_alive()
    # The passes came further apart: after the n-th failure run paused at least half of
    # BACKOFF_FIRST * 2**(n-1) (the jitter's lower bound).
    at = [t for _, _, t in errors]
    for n in (1, 2):
        assert at[n] - at[n - 1] >= BACKOFF_FIRST * 2 ** (n - 1) / 2


def test_backoff_doubles_to_its_cap() -> None:
    low = [backoff_delay(n, lambda lo, hi: lo) for n in range(1, 12)]
    high = [backoff_delay(n, lambda lo, hi: hi) for n in range(1, 12)]
    assert high[:4] == [BACKOFF_FIRST, 2 * BACKOFF_FIRST, 4 * BACKOFF_FIRST, 8 * BACKOFF_FIRST]
    assert high[-1] == BACKOFF_MAX
    assert low == [h / 2 for h in high]
    assert backoff_delay(1000, lambda lo, hi: hi) == BACKOFF_MAX


def test_completer_options_are_checked(daemon: Daemon) -> None:
    """A prefix is required unless all_keys says every key; the other options must be
    ones idemd accepts."""
    c, ac = idemd.Client(daemon.url), idemd.AsyncClient(daemon.url)

    def handler(_: idemd.Lease) -> idemd.Response:
        return idemd.Response()

    async def async_handler(_: idemd.AsyncLease) -> idemd.Response:
        return idemd.Response()

    for options, error in (
        ({}, "prefix is required"),
        ({"prefix": ""}, "prefix is required"),
        ({"prefix": "p/", "all_keys": True}, "choose one"),
        ({"prefix": "p" * 256}, "256 bytes"),
        ({"prefix": "p\udc80"}, "UTF-8"),
        ({"prefix": "p/", "lease": 0.05}, "lease"),
        ({"prefix": "p/", "lease": 3601}, "lease"),
        ({"prefix": "p/", "concurrency": 0}, "concurrency"),
        ({"prefix": "p/", "poll_interval": 0}, "poll_interval"),
        ({"prefix": "p/", "older_than": -1}, "older_than"),
    ):
        with pytest.raises(ValueError, match=error):
            idemd.Completer(c, handler, **options)
        with pytest.raises(ValueError, match=error):
            idemd.AsyncCompleter(ac, async_handler, **options)
    assert idemd.Completer(c, handler, all_keys=True)
    assert idemd.AsyncCompleter(ac, async_handler, prefix="p" * 255)
