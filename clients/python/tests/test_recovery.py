"""Recovery points and the abandoned-keys feed, over real HTTP against a real idemd: a
holder records how far it got with ``lease.checkpoint``, the next acquisition of the key
(a takeover, or a claim after a release for a retry) starts from it, and the feed lists
the keys whose holders left them pending."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import Daemon, fresh_key, wait_until
from proxy import GateProxy
from slowdown import scale

import idemd

DATA = b"ch_1\x00\xff"


@pytest.fixture
def proxies(daemon: Daemon) -> Iterator[Callable[..., GateProxy]]:
    """Proxies in front of the shared idemd, closed after the test."""
    made: list[GateProxy] = []

    def make(**options: Any) -> GateProxy:
        proxy = GateProxy(daemon.url, **{"hold": (), **options})
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def take_over(url: str, key: str, fn: Callable[[idemd.Lease], idemd.Response]) -> idemd.Result:
    """Runs ``fn`` under the key once idemd hands it over: the claim waits for the
    holder's lease to run out, and is tried again when its wait ends first."""
    with idemd.Client(url) as c:
        deadline = time.monotonic() + scale(30)
        while True:
            try:
                return c.run(key, fn, wait=5)
            except idemd.InProgress:
                if time.monotonic() > deadline:
                    pytest.fail(f"{key!r} was never taken over")


def test_checkpoint_reaches_the_takeover(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    """A holder records a point, then its link to idemd is cut: its lease ends at its
    local deadline, and the caller that takes the key over starts from the point (name,
    data, the attempt that recorded it). A checkpoint through the stale lease raises
    LeaseExpired without reaching idemd; completing the key drops the point."""
    proxy = proxies()
    holder = idemd.Client(proxy.url, retries=0)
    key = fresh_key("point-takeover")
    holding = threading.Event()
    stale: dict[str, Any] = {}

    def work(held: idemd.Lease) -> idemd.Response:
        stale["start"] = held.recovery_point
        held.checkpoint("charged", DATA)
        proxy.cut = True
        holding.set()
        stale["lost"] = held.lost.wait(scale(30))
        stale["lease"] = held
        return idemd.Response(201, body=b"stale")

    seen: dict[str, Any] = {}

    def resume(held: idemd.Lease) -> idemd.Response:
        seen.update(attempt=held.attempt, recovered=held.recovered, point=held.recovery_point)
        # While the key is pending, its record shows the point too.
        seen["record"] = idemd.Client(daemon.url).lookup(key).recovery_point
        return idemd.Response(201, body=b"resumed")

    before = datetime.datetime.now(datetime.UTC)
    with ThreadPoolExecutor(1) as pool:
        first: Future[idemd.Result] = pool.submit(holder.run, key, work, lease=0.6)
        assert holding.wait(scale(30))
        result = take_over(daemon.url, key, resume)
        with pytest.raises(idemd.LeaseExpired):
            first.result(scale(30))
    assert stale["start"] is None
    assert stale["lost"]
    assert (seen["attempt"], seen["recovered"]) == (2, True)
    point = seen["point"]
    assert isinstance(point, idemd.RecoveryPoint)
    assert (point.name, point.data, point.attempt) == ("charged", DATA, 1)
    assert before - datetime.timedelta(seconds=1) < point.recorded_at < datetime.datetime.now(datetime.UTC)
    assert seen["record"] == point
    assert (result.response.body, result.replayed) == (b"resumed", False)

    dropped = proxy.dropped
    lease: idemd.Lease = stale["lease"]
    with pytest.raises(idemd.LeaseExpired):
        lease.checkpoint("late")
    assert proxy.dropped == dropped  # not sent: the holder knows it lost the lease
    record = idemd.Client(daemon.url).lookup(key)
    assert (record.state, record.attempt, record.recovery_point) == ("completed", 2, None)


def test_async_checkpoint_reaches_the_takeover(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    """As the sync test, with AsyncClient.run: the stale coroutine is cancelled at its
    local deadline, and the takeover's AsyncLease starts from the point."""
    proxy = proxies()
    key = fresh_key("point-takeover-async")
    seen: dict[str, Any] = {}

    async def main() -> None:
        holder = idemd.AsyncClient(proxy.url, retries=0)
        holding = asyncio.Event()

        async def work(held: idemd.AsyncLease) -> idemd.Response:
            await held.checkpoint("charged", DATA)
            proxy.cut = True
            holding.set()
            await asyncio.wait_for(asyncio.Event().wait(), scale(30))  # cancelled at the deadline
            raise AssertionError("the stale holder was not cancelled")

        async def resume(held: idemd.AsyncLease) -> idemd.Response:
            seen.update(attempt=held.attempt, recovered=held.recovered, point=held.recovery_point)
            return idemd.Response(201)

        first = asyncio.create_task(holder.run(key, work, lease=0.6))
        await asyncio.wait_for(holding.wait(), scale(30))
        async with idemd.AsyncClient(daemon.url) as c:
            for _ in range(6):
                try:
                    await c.run(key, resume, wait=5)
                    break
                except idemd.InProgress:
                    continue
            else:
                pytest.fail(f"{key!r} was never taken over")
        with pytest.raises(idemd.LeaseExpired):
            await first
        await holder.aclose()

    asyncio.run(main())
    assert (seen["attempt"], seen["recovered"]) == (2, True)
    assert (seen["point"].name, seen["point"].data, seen["point"].attempt) == ("charged", DATA, 1)


def test_checkpoint_answered_lease_lost(daemon: Daemon) -> None:
    """The key is taken from a holder whose lease is live by its own reckoning (purged and
    claimed again by another caller): its next checkpoint is answered lease_lost, raises
    LeaseLost (not LeaseExpired) and marks the lease lost, run stores nothing, and the
    point is not recorded."""
    c, other = idemd.Client(daemon.url), idemd.Client(daemon.url)
    key = fresh_key("point-lost")
    seen: dict[str, Any] = {}

    def work(held: idemd.Lease) -> idemd.Response:
        held.checkpoint("step-1", b"a")
        other.purge(key)
        assert other.claim(key, lease=30).outcome == "acquired"
        assert not held.lost.is_set()
        try:
            held.checkpoint("step-2", b"b")
        except idemd.LeaseLost as err:
            seen["error"] = err
        seen["lost"], seen["remaining"] = held.lost.is_set(), held.remaining()
        return idemd.Response(201, body=b"not stored")

    with pytest.raises(idemd.LeaseLost) as raised:
        c.run(key, work)
    assert not isinstance(raised.value, idemd.LeaseExpired)
    err = seen["error"]
    assert not isinstance(err, idemd.LeaseExpired)
    assert (err.status, err.code) == (409, "lease_lost")
    assert (seen["lost"], seen["remaining"]) == (True, 0.0)
    record = other.lookup(key)
    assert (record.state, record.attempt, record.recovery_point) == ("pending", 1, None)


def test_async_checkpoint_answered_lease_lost(daemon: Daemon) -> None:
    """As the sync test: the answer also cancels the coroutine at its next await, as a
    renewal answered lease_lost does, and run raises LeaseLost."""
    key = fresh_key("point-lost-async")
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with idemd.AsyncClient(daemon.url) as c, idemd.AsyncClient(daemon.url) as other:

            async def work(held: idemd.AsyncLease) -> idemd.Response:
                await held.checkpoint("step-1", b"a")
                await other.purge(key)
                assert (await other.claim(key, lease=30)).outcome == "acquired"
                try:
                    await held.checkpoint("step-2", b"b")
                except idemd.LeaseLost as err:
                    seen["error"] = err
                seen["lost"] = held.lost.is_set()
                await asyncio.wait_for(asyncio.Event().wait(), scale(30))  # cancelled: the lease is lost
                seen["went on"] = True
                return idemd.Response(201)

            with pytest.raises(idemd.LeaseLost) as raised:
                await c.run(key, work)
            assert not isinstance(raised.value, idemd.LeaseExpired)
            record = await other.lookup(key)
            assert (record.state, record.recovery_point) == ("pending", None)

    asyncio.run(main())
    assert seen["error"].code == "lease_lost"
    assert seen["lost"]
    assert "went on" not in seen


def test_checkpoint_after_a_retry_release(daemon: Daemon) -> None:
    """A run that records a point and then fails releases the key for a retry, which
    keeps the point; the next run (through the decorator, which finds its lease with
    current_lease) starts from it, not recovered, and completing drops the point."""
    c = idemd.Client(daemon.url)
    key = fresh_key("point-retry")

    def reserve(held: idemd.Lease) -> idemd.Response:
        held.checkpoint("reserved", b"r-1")
        raise RuntimeError("the provider timed out")

    with pytest.raises(RuntimeError, match="timed out"):
        c.run(key, reserve)
    released = c.lookup(key)
    assert released.state == "released"
    assert released.recovery_point is not None
    assert (released.recovery_point.name, released.recovery_point.data) == ("reserved", b"r-1")

    @c.idempotent(lambda order: key)
    def confirm(order: str) -> dict[str, Any]:
        held = idemd.current_lease()
        assert isinstance(held, idemd.Lease)
        point = held.recovery_point
        assert point is not None
        return {"order": order, "attempt": held.attempt, "recovered": held.recovered, "from": point.name}

    assert confirm("o-1") == {"order": "o-1", "attempt": 2, "recovered": False, "from": "reserved"}
    record = c.lookup(key)
    assert (record.state, record.recovery_point) == ("completed", None)


def test_async_checkpoint_from_consume(daemon: Daemon) -> None:
    """Leases handed out by consume record points too: a delivery that fails after its
    checkpoint is requeued, and the redelivery's lease starts from the point."""
    key = idemd.message_key("orders", "3", fresh_key("offset"))
    starts: list[tuple[int, str | None]] = []

    async def main() -> list[idemd.Verdict]:
        async with idemd.AsyncClient(daemon.url) as c:

            async def handle(held: idemd.AsyncLease) -> None:
                point = held.recovery_point
                starts.append((held.attempt, None if point is None else point.name))
                if held.recovery_point is None:
                    await held.checkpoint("emailed", b"msg-7")
                    raise RuntimeError("the broker went away")

            return [await c.consume(key, handle) for _ in range(3)]

    verdicts = asyncio.run(main())
    assert [v.action for v in verdicts] == ["requeue", "ack", "ack"]
    assert [v.ran for v in verdicts] == [True, True, False]
    assert starts == [(1, None), (2, "emailed")]


def test_an_oversized_checkpoint_is_refused(daemon: Daemon) -> None:
    """Data over the daemon's 4096 bytes is refused with 413 (PayloadTooLarge): nothing
    is recorded, the point before stands, and the lease goes on to complete."""
    c = idemd.Client(daemon.url)
    key = fresh_key("point-big")
    seen: dict[str, Any] = {}

    def work(held: idemd.Lease) -> idemd.Response:
        held.checkpoint("small", b"a")
        with pytest.raises(idemd.PayloadTooLarge) as raised:
            held.checkpoint("big", b"x" * 4097)
        seen["error"], seen["lost"] = raised.value, held.lost.is_set()
        seen["record"] = c.lookup(key)
        held.checkpoint("limit", b"y" * 4096)
        return idemd.Response(201)

    assert not c.run(key, work).replayed
    err = seen["error"]
    assert isinstance(err, idemd.Problem)
    assert (err.status, err.code) == (413, "payload_too_large")
    assert not seen["lost"]
    record = seen["record"]
    assert record.state == "pending"
    assert (record.recovery_point.name, record.recovery_point.data) == ("small", b"a")
    assert c.lookup(key).state == "completed"


def test_async_oversized_checkpoint_is_refused(daemon: Daemon) -> None:
    key = fresh_key("point-big-async")

    async def main() -> None:
        async with idemd.AsyncClient(daemon.url) as c:

            async def work(held: idemd.AsyncLease) -> idemd.Response:
                await held.checkpoint("small", b"a")
                with pytest.raises(idemd.PayloadTooLarge):
                    await held.checkpoint("big", b"x" * 4097)
                assert not held.lost.is_set()
                point = (await c.lookup(key)).recovery_point
                assert point is not None
                assert (point.name, point.data) == ("small", b"a")
                return idemd.Response(201)

            assert not (await c.run(key, work)).replayed

    asyncio.run(main())


def test_record_recovery_point(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    """The low-level call: it records under a claim's token, goes as a request of its own
    (never in a batch), and raises LeaseLost for a stale token or a finished key,
    NotFound for a key that is gone, PayloadTooLarge for data over the limit."""
    proxy = proxies()
    c = idemd.Client(proxy.url)
    key = fresh_key("point-low")
    claim = c.claim(key, fingerprint="sha256:abc")
    assert claim.recovery_point is None
    c.record_recovery_point(key, claim.token, "step", b"1")
    c.record_recovery_point(key, claim.token, "empty")
    point = c.lookup(key).recovery_point
    assert point is not None
    assert (point.name, point.data, point.attempt) == ("empty", b"", 1)
    with pytest.raises(idemd.LeaseLost):
        c.record_recovery_point(key, "not-the-token", "step")
    with pytest.raises(idemd.PayloadTooLarge):
        c.record_recovery_point(key, claim.token, "big", b"x" * 4097)
    c.release(key, claim.token, "retry")
    again = c.claim(key, fingerprint="sha256:abc")
    assert again.recovery_point == point
    c.complete(key, again.token, idemd.Response(200))
    with pytest.raises(idemd.LeaseLost):
        c.record_recovery_point(key, again.token, "after")
    with pytest.raises(idemd.NotFound):
        c.record_recovery_point(fresh_key("point-none"), "token", "step")
    assert proxy.paths().count("/v1/recovery-point") == 6
    assert not any(p.startswith("/v1/batch") for p in proxy.paths())


def abandon(c: idemd.Client, key: str, lease: float = 0.1, **claim: Any) -> idemd.Claim:
    """Claims ``key`` and never finishes it: a holder that died."""
    got = c.claim(key, lease=lease, **claim)
    assert got.outcome == "acquired"
    return got


def read_all(c: idemd.Client, prefix: str) -> list[idemd.AbandonedKey]:
    """Every key of the feed under ``prefix``, a page of at most one key at a time."""
    keys: list[idemd.AbandonedKey] = []
    cursor: str | None = None
    for _ in range(100):
        page = c.abandoned(prefix=prefix, limit=1, cursor=cursor)
        assert len(page.keys) <= 1
        keys.extend(page.keys)
        if page.next_cursor is None:
            return keys
        cursor = page.next_cursor
    pytest.fail("the feed did not end within 100 pages")


def test_abandoned_feed(any_daemon: Daemon) -> None:
    """Keys whose holders left them pending appear in the feed under their prefix, with
    their attempt, fingerprint, owner and recovery point name; a live key, a finished
    one and a key under another prefix do not. Pages of one key read them all, and so
    does abandoned_keys."""
    c = idemd.Client(any_daemon.url, owner="worker-7")
    prefix = fresh_key("feed") + "/"
    plain = abandon(c, prefix + "a")
    abandon(c, prefix + "b", fingerprint="sha256:bb")
    pointed = abandon(c, prefix + "c", lease=1.0)
    c.record_recovery_point(prefix + "c", pointed.token, "charged", b"ch_9")
    done = abandon(c, prefix + "done")
    c.complete(prefix + "done", done.token, idemd.Response(200))
    abandon(c, prefix + "live", lease=60)
    abandon(c, fresh_key("elsewhere"))

    wait_until("the three leases to run out", lambda: len(read_all(c, prefix)) == 3)
    keys = sorted(read_all(c, prefix), key=lambda k: k.key)
    assert [k.key for k in keys] == [prefix + "a", prefix + "b", prefix + "c"]
    assert [(k.attempt, k.owner) for k in keys] == [(1, "worker-7")] * 3
    assert [k.fingerprint for k in keys] == ["", "sha256:bb", ""]
    assert [k.recovery_point for k in keys] == ["", "", "charged"]
    assert all(k.lease_expired_at < datetime.datetime.now(datetime.UTC) for k in keys)
    assert sorted(k.key for k in c.abandoned_keys(prefix=prefix, limit=1)) == [k.key for k in keys]
    assert c.abandoned(prefix=prefix, older_than=3600).keys == []
    # The key whose holder comes back is no longer abandoned.
    c.complete(prefix + "a", plain.token, idemd.Response(200))
    assert sorted(k.key for k in c.abandoned_keys(prefix=prefix)) == [prefix + "b", prefix + "c"]
    with pytest.raises(idemd.Problem) as refused:
        c.abandoned(prefix=prefix, limit=0)
    assert (refused.value.status, refused.value.code) == (400, "invalid_request")


def test_async_abandoned_feed(daemon: Daemon) -> None:
    """The async client reads the same feed, page by page and as an async generator."""
    prefix = fresh_key("feed-async") + "/"
    with idemd.Client(daemon.url) as c:
        for name in ("x", "y"):
            abandon(c, prefix + name, fingerprint="sha256:" + name)
        wait_until("both leases to run out", lambda: len(read_all(c, prefix)) == 2)

    async def main() -> tuple[list[str], list[str]]:
        async with idemd.AsyncClient(daemon.url) as ac:
            paged: list[str] = []
            cursor: str | None = None
            for _ in range(100):
                page = await ac.abandoned(prefix=prefix, limit=1, cursor=cursor)
                assert len(page.keys) <= 1
                paged += [k.fingerprint for k in page.keys]
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert cursor is None
            every = [k.key async for k in ac.abandoned_keys(prefix=prefix, limit=1)]
            return paged, every

    paged, every = asyncio.run(main())
    assert sorted(paged) == ["sha256:x", "sha256:y"]
    assert sorted(every) == [prefix + "x", prefix + "y"]
