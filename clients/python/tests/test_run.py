"""run, once and the idempotent decorator, sync and async, against a real idemd."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Daemon, fresh_key, wait_until
from slowdown import scale

import idemd


def test_run_replays(any_daemon: Daemon) -> None:
    c = idemd.Client(any_daemon.url)
    key = fresh_key("run")
    runs = 0

    def fn(lease: idemd.Lease) -> idemd.Response:
        nonlocal runs
        runs += 1
        return idemd.Response(201, body=f"run {runs}".encode())

    first = c.run(key, fn, fingerprint="fp")
    second = c.run(key, fn, fingerprint="fp")
    assert first == idemd.Result(idemd.Response(201, body=b"run 1"), replayed=False)
    assert second == idemd.Result(idemd.Response(201, body=b"run 1"), replayed=True)
    assert runs == 1


def test_run_concurrent_callers_run_once(daemon: Daemon) -> None:
    c = idemd.Client(daemon.url)
    key = fresh_key("run-concurrent")
    runs = 0
    lock = threading.Lock()
    release = threading.Event()

    def fn(lease: idemd.Lease) -> idemd.Response:
        nonlocal runs
        with lock:
            runs += 1
        release.wait(scale(20))
        return idemd.Response(200, body=b"once")

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(c.run, key, fn, wait=20) for _ in range(20)]
        wait_until("the first run to start", lambda: runs == 1)
        release.set()
        results = [f.result() for f in futures]
    assert runs == 1
    assert {r.response.body for r in results} == {b"once"}
    assert sum(not r.replayed for r in results) == 1


def test_run_releases_on_an_exception(daemon: Daemon) -> None:
    c = idemd.Client(daemon.url)
    key = fresh_key("run-errors")

    def boom(lease: idemd.Lease) -> idemd.Response:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        c.run(key, boom)
    with pytest.raises(KeyboardInterrupt):
        c.run(key, lambda lease: (_ for _ in ()).throw(KeyboardInterrupt()))
    res = c.run(key, lambda lease: idemd.Response(200, body=b"third time"))
    assert res == idemd.Result(idemd.Response(200, body=b"third time"), replayed=False)
    assert c.lookup(key).attempt == 3


def test_run_permanent_failure(daemon: Daemon) -> None:
    c = idemd.Client(daemon.url)
    key = fresh_key("run-permanent")
    declined = idemd.Response(402, body=b"declined")

    def charge(lease: idemd.Lease) -> idemd.Response:
        raise idemd.Permanent(declined, "card declined")

    with pytest.raises(idemd.Permanent, match="card declined"):
        c.run(key, charge)

    def must_not_run(lease: idemd.Lease) -> idemd.Response:
        raise AssertionError("ran again after a permanent failure")

    with pytest.raises(idemd.Failed) as failed:
        c.run(key, must_not_run)
    assert failed.value.response == declined


def test_run_extends_the_lease(any_daemon: Daemon) -> None:
    """fn runs for three leases: the renewals keep every other caller out all along."""
    c, other = idemd.Client(any_daemon.url), idemd.Client(any_daemon.url)
    key = fresh_key("run-extend")
    lease = 1.0

    def fn(held: idemd.Lease) -> idemd.Response:
        end = time.monotonic() + 3 * lease
        probes = 0
        while time.monotonic() < end:
            with pytest.raises(idemd.InProgress):
                other.claim(key)
            probes += 1
            held.lost.wait(lease / 4)
        assert not held.lost.is_set()
        return idemd.Response(200, body=str(probes).encode())

    res = c.run(key, fn, lease=lease)
    assert res.response.status == 200
    assert int(res.response.body) >= 4


def test_run_lease_lost(any_daemon: Daemon) -> None:
    """The key is purged while fn runs: the next renewal finds the lease gone, fn is told,
    and run raises LeaseLost instead of storing a result."""
    c = idemd.Client(any_daemon.url)
    key = fresh_key("run-lost")
    told = False

    def fn(held: idemd.Lease) -> idemd.Response:
        nonlocal told
        c.purge(key)
        told = held.lost.wait(scale(20))
        return idemd.Response(200, body=b"too late")

    with pytest.raises(idemd.LeaseLost):
        c.run(key, fn, lease=0.3)
    assert told, "fn was not told that the lease was lost"
    with pytest.raises(idemd.NotFound):
        c.lookup(key)


def test_once_for_a_redelivered_message(daemon: Daemon) -> None:
    c = idemd.Client(daemon.url)
    key = idemd.message_key("orders", "partition-3", fresh_key("offset"))
    handled = 0
    lock = threading.Lock()

    def handle(lease: idemd.Lease) -> None:
        nonlocal handled
        with lock:
            handled += 1

    with ThreadPoolExecutor(10) as pool:
        ran = list(pool.map(lambda _: c.once(key, handle, wait=20), range(10)))
    assert handled == 1
    assert ran.count(True) == 1


def test_decorator(daemon: Daemon) -> None:
    c = idemd.Client(daemon.url)
    prefix = fresh_key("charge")
    charged: list[tuple[str, int]] = []

    @c.idempotent(prefix + ":{order_id}")
    def charge(order_id: str, cents: int = 100) -> dict[str, object]:
        charged.append((order_id, cents))
        return {"order": order_id, "charged": cents}

    assert charge("o-1") == {"order": "o-1", "charged": 100}
    assert charge("o-1") == {"order": "o-1", "charged": 100}
    assert charge(order_id="o-2", cents=5) == {"order": "o-2", "charged": 5}
    assert charged == [("o-1", 100), ("o-2", 5)]
    assert charge.__name__ == "charge"

    @c.idempotent(lambda user, **_: f"{prefix}:welcome:{user}")
    def welcome(user: str, *, template: str = "hi") -> str:
        charged.append((user, 0))
        return template

    assert welcome("ann") == welcome("ann", template="other") == "hi"
    assert charged[-1] == ("ann", 0)
    assert len(charged) == 3


def test_async_run(any_daemon: Daemon) -> None:
    async def main() -> None:
        async with idemd.AsyncClient(any_daemon.url) as c:
            key = fresh_key("arun")
            runs = 0

            async def fn(lease: idemd.AsyncLease) -> idemd.Response:
                nonlocal runs
                runs += 1
                await asyncio.sleep(0)
                return idemd.Response(202, body=b"queued")

            results = await asyncio.gather(*(c.run(key, fn, wait=20) for _ in range(10)))
            assert runs == 1
            assert all(r.response == idemd.Response(202, body=b"queued") for r in results)

            failing = fresh_key("arun-fail")

            async def boom(lease: idemd.AsyncLease) -> idemd.Response:
                raise ValueError("boom")

            with pytest.raises(ValueError, match="boom"):
                await c.run(failing, boom)
            assert (await c.lookup(failing)).state == "released"

    asyncio.run(main())


def test_async_run_extends_then_loses_the_lease(any_daemon: Daemon) -> None:
    async def main() -> None:
        async with idemd.AsyncClient(any_daemon.url) as c:
            key = fresh_key("arun-lost")
            renewed = asyncio.Event()
            cancelled = False

            async def fn(held: idemd.AsyncLease) -> idemd.Response:
                nonlocal cancelled
                # Past two leases the key is still ours: the renewals work.
                await asyncio.sleep(2.2)
                with pytest.raises(idemd.InProgress):
                    await c.claim(key)
                renewed.set()
                await c.purge(key)
                try:
                    # The cancellation comes at the next renewal; 20 s bounds the wait.
                    await asyncio.sleep(scale(20))
                except asyncio.CancelledError:
                    cancelled = True
                    raise
                return idemd.Response(200, body=b"too late")

            with pytest.raises(idemd.LeaseLost):
                await c.run(key, fn, lease=1.0)
            assert renewed.is_set()
            assert cancelled, "fn was not cancelled when the lease was lost"
            with pytest.raises(idemd.NotFound):
                await c.lookup(key)

    asyncio.run(main())


def test_async_cancelled_caller_releases_the_key(daemon: Daemon) -> None:
    async def main() -> None:
        async with idemd.AsyncClient(daemon.url) as c:
            key = fresh_key("arun-cancel")
            started = asyncio.Event()

            async def fn(held: idemd.AsyncLease) -> idemd.Response:
                started.set()
                await asyncio.sleep(scale(60))
                return idemd.Response(200)

            task = asyncio.create_task(c.run(key, fn))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await c.lookup(key)).state == "released"

    asyncio.run(main())


def test_async_decorator_and_once(daemon: Daemon) -> None:
    async def main() -> None:
        async with idemd.AsyncClient(daemon.url) as c:
            prefix = fresh_key("asend")
            sent: list[str] = []

            @c.idempotent(prefix + ":{to}")
            async def send(to: str) -> list[str]:
                sent.append(to)
                return [to, "sent"]

            assert await send("bob") == ["bob", "sent"]
            assert await send("bob") == ["bob", "sent"]
            assert sent == ["bob"]

            async def handle(lease: idemd.AsyncLease) -> None:
                sent.append("message")

            key = idemd.message_key("queue", fresh_key("id"))
            assert await c.once(key, handle) is True
            assert await c.once(key, handle) is False
            assert sent == ["bob", "message"]

    asyncio.run(main())
