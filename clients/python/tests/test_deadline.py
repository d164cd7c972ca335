"""The lease's local deadline: a holder reckons its lease from the send of its claim, or
of its last renewal that was answered, plus 95 % of the lease, and takes the lease for
lost when that deadline passes with no renewal answered, as if idemd had answered
lease_lost. Renewals that fail are tried again sooner; a short outage keeps the lease;
slow answers that still come in time never end a lease. Over real HTTP against a real
idemd, with a proxy in front of it that cuts or slows the link."""

from __future__ import annotations

import asyncio
import contextlib
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
from idemd._lease import MARGIN, MIN_DELAY, local_deadline, renewal_period, retry_delay


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


# The reckoning itself, without idemd.


@pytest.mark.parametrize(
    ("lease", "left", "d"),
    [
        (30.0, 28.5, 5.0),  # a lease just renewed: a sixth of the lease
        (30.0, 6.0, 2.0),  # the deadline nears: a third of the time left
        (0.3, 0.285, 0.05),
        (0.3, 0.012, MIN_DELAY),  # never below the floor
        (2.0, -1.0, MIN_DELAY),
    ],
)
def test_retry_delay_bounds(lease: float, left: float, d: float) -> None:
    """After a failed renewal the next try comes after a delay drawn from [d/2, d], where
    d = max(10 ms, min(lease/6, left/3))."""
    assert retry_delay(lease, left, lambda low, high: low) == pytest.approx(d / 2)
    assert retry_delay(lease, left, lambda low, high: high) == pytest.approx(d)
    for _ in range(200):
        assert d / 2 <= retry_delay(lease, left) <= d
    # Every retry comes sooner than the normal period.
    assert retry_delay(lease, left) <= renewal_period(lease)


def test_the_deadline_leaves_the_margin() -> None:
    assert MARGIN == 0.05
    assert local_deadline(100.0, 30.0) == pytest.approx(128.5)
    # While the deadline is far, a retry leaves time for two more before it.
    for lease in (0.3, 1.0, 30.0):
        left = lease * (1 - MARGIN) - renewal_period(lease)
        assert 3 * retry_delay(lease, left, lambda low, high: high) <= left


def test_a_lease_is_lost_when_its_deadline_passes() -> None:
    deadline = time.monotonic() + 0.05
    lease = idemd.Lease("k", "t", 1, deadline=deadline)
    assert lease.deadline == deadline
    assert 0 < lease.remaining() <= 0.05
    assert lease.lost.wait(scale(30))  # the waiter wakes at the deadline; nothing sets the event
    assert time.monotonic() >= deadline
    assert lease.lost.is_set()
    assert lease.remaining() == 0.0
    # A renewal answered now came too late: it does not bring the lease back.
    assert not lease._reckoning.answered(time.monotonic(), 30.0)
    assert lease.deadline == deadline
    assert lease.lost.is_set()
    # A lease made by hand has no deadline.
    free = idemd.Lease("k", "t", 1)
    assert not free.lost.is_set()
    assert not free.lost.wait(0.01)
    assert free.remaining() == float("inf")


def test_an_async_lease_is_lost_when_its_deadline_passes() -> None:
    """As the sync lease: lost counts as set from the moment the local deadline passes,
    also while the event loop is blocked and no timer of it has run, so that it agrees
    with remaining(); and a waiter wakes at the deadline."""

    async def main() -> None:
        deadline = time.monotonic() + 0.05
        lease = idemd.AsyncLease("k", "t", 1, deadline=deadline)
        assert 0 < lease.remaining() <= 0.05
        assert not lease.lost.is_set()
        # Blocks the event loop until the deadline has passed, as work that does not
        # await would.
        while time.monotonic() < deadline:
            pass
        assert lease.remaining() == 0.0
        assert lease.lost.is_set()
        assert await asyncio.wait_for(lease.lost.wait(), scale(30))
        # A renewal answered now came too late: it does not bring the lease back.
        assert not lease._reckoning.answered(time.monotonic(), 30.0)
        assert lease.deadline == deadline
        assert lease.lost.is_set()

        later = time.monotonic() + 0.05
        waited = idemd.AsyncLease("k", "t", 1, deadline=later)
        assert await asyncio.wait_for(waited.lost.wait(), scale(30))  # nothing sets the event
        assert time.monotonic() >= later
        assert waited.lost.is_set()

        # A lease made by hand has no deadline.
        free = idemd.AsyncLease("k", "t", 1)
        assert not free.lost.is_set()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(free.lost.wait(), 0.01)
        assert free.remaining() == float("inf")

    asyncio.run(main())


def test_async_lease_lost_while_the_loop_is_blocked(daemon: Daemon) -> None:
    """A coroutine that blocks the event loop past its lease's local deadline finds
    lost set, as remaining() says 0, before any timer of the loop could run; and run
    raises LeaseExpired, as the sync client does."""
    key = fresh_key("deadline-blocked-async")
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with idemd.AsyncClient(daemon.url) as client:

            async def block(held: idemd.AsyncLease) -> idemd.Response:
                seen["before"] = held.lost.is_set()
                end = time.monotonic() + 30
                while time.monotonic() < held.deadline and time.monotonic() < end:
                    pass
                seen["lost"], seen["remaining"] = held.lost.is_set(), held.remaining()
                return idemd.Response(201, body=b"late")

            with pytest.raises(idemd.LeaseExpired):
                await client.run(key, block, lease=0.3)

    asyncio.run(main())
    assert seen == {"before": False, "lost": True, "remaining": 0.0}


# A holder whose link to idemd is cut right after its claim.


def test_cut_link_expires_the_lease(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    """The holder's renewals never reach idemd: its lease ends at its local deadline,
    before idemd lets the other caller take the key over, and run raises LeaseExpired
    although the function returned a result. The other caller's result stands."""
    lease = 0.6
    proxy = proxies(cut_after=1)
    holder = idemd.Client(proxy.url, retries=0)
    key = fresh_key("deadline-cut")
    holding, taken = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def stall(held: idemd.Lease) -> idemd.Response:
        holding.set()
        seen["lost"] = held.lost.wait(scale(30))
        seen["remaining"], seen["deadline"] = held.remaining(), held.deadline
        taken.wait(scale(30))
        return idemd.Response(201, body=b"late")

    with ThreadPoolExecutor(1) as pool:
        before = time.monotonic()
        first: Future[idemd.Result] = pool.submit(holder.run, key, stall, lease=lease)
        assert holding.wait(scale(30))
        took, result = take_over(daemon, key, lease)
        taken.set()
        with pytest.raises(idemd.LeaseExpired) as lost:
            first.result(scale(30))
    assert isinstance(lost.value, idemd.LeaseLost)
    assert seen["lost"]
    assert seen["remaining"] == 0.0
    # Reckoned from the claim's send, which is before the proxy received it, however long
    # a loaded machine took to send it after before.
    assert before < seen["deadline"] <= proxy.received[0].at + lease * (1 - MARGIN)
    # The holder gave the lease up by its own clock before idemd handed the key over.
    assert seen["deadline"] < took[0][2]
    assert [(attempt, recovered) for attempt, recovered, _ in took] == [(2, True)]
    assert (result.response.body, result.replayed) == (b"mine", False)
    assert proxy.paths() == ["/v1/claim"]
    assert_stands(daemon, key)


def test_async_cut_link_expires_the_lease(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    """As the sync test: the coroutine is cancelled at the local deadline and run
    raises LeaseExpired."""
    lease = 0.6
    proxy = proxies(cut_after=1)
    key = fresh_key("deadline-cut-async")
    seen: dict[str, Any] = {}

    async def main() -> None:
        holder = idemd.AsyncClient(proxy.url, retries=0)
        holding = asyncio.Event()

        async def stall(held: idemd.AsyncLease) -> idemd.Response:
            holding.set()
            try:
                await asyncio.sleep(scale(30))
            except asyncio.CancelledError:
                seen["lost"], seen["remaining"] = held.lost.is_set(), held.remaining()
                seen["deadline"], seen["cancelled_at"] = held.deadline, time.monotonic()
                raise
            return idemd.Response(201, body=b"late")

        before = time.monotonic()
        first = asyncio.ensure_future(holder.run(key, stall, lease=lease))
        await asyncio.wait_for(holding.wait(), scale(30))
        with pytest.raises(idemd.LeaseExpired):
            await asyncio.wait_for(first, scale(30))
        seen["before"] = before
        await holder.aclose()

    asyncio.run(main())
    assert seen["lost"]
    assert seen["remaining"] == 0.0
    assert seen["before"] < seen["deadline"] <= proxy.received[0].at + lease * (1 - MARGIN)
    assert seen["cancelled_at"] >= seen["deadline"]
    took, result = take_over(daemon, key, lease)
    assert [(attempt, recovered) for attempt, recovered, _ in took] == [(2, True)]
    assert seen["deadline"] < took[0][2]
    assert (result.response.body, result.replayed) == (b"mine", False)
    assert proxy.paths() == ["/v1/claim"]
    assert_stands(daemon, key)


#: The lease of the caller that takes a key over. It is long whatever the stalled
#: holder's was: the taker's claim waits, so its lease is renewed once before its
#: function runs (R17), and that renewal must be answered within the lease even on a
#: loaded machine.
TAKER_LEASE = 30.0


def take_over(daemon: Daemon, key: str, lease: float) -> tuple[list[tuple[int, bool, float]], idemd.Result]:
    """Another caller, on a working link, waits for the key (held under ``lease``) and
    runs under it: the attempt and recovered of its lease, when its function started,
    and its result."""
    took: list[tuple[int, bool, float]] = []

    def take(held: idemd.Lease) -> idemd.Response:
        took.append((held.attempt, held.recovered, time.monotonic()))
        return idemd.Response(201, body=b"mine")

    with idemd.Client(daemon.url) as c:
        end = time.monotonic() + scale(30)
        while True:
            try:
                return took, c.run(key, take, lease=TAKER_LEASE, wait=max(5, 2 * lease))
            except idemd.InProgress:
                if time.monotonic() > end:
                    pytest.fail(f"{key!r} was never taken over")


def assert_stands(daemon: Daemon, key: str) -> None:
    """The other caller's result is the one stored, and a later run replays it."""
    with idemd.Client(daemon.url) as c:
        record = c.lookup(key)
        assert record.state == "completed"
        assert (record.response or idemd.Response()).body == b"mine"

        def never(_: idemd.Lease) -> idemd.Response:
            raise AssertionError("a finished key ran again")

        again = c.run(key, never)
        assert (again.response.body, again.replayed) == (b"mine", True)


# A short outage: the renewals fail for a while, then one is answered in time.


def test_a_link_restored_in_time_keeps_the_lease(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    lease = scale(2.0)  # room for a loaded machine's dropped renewals and the one answered
    proxy = proxies(cut_after=1)
    key = fresh_key("deadline-blip")
    c = idemd.Client(proxy.url, retries=0)
    kept: list[tuple[float, float]] = []

    def work(held: idemd.Lease) -> idemd.Response:
        first = held.deadline
        # Renewals are dropped until the proxy has seen two of them, which come sooner
        # than the normal period once the first failed; then the link is back.
        wait_until("two renewals to be dropped", lambda: proxy.dropped >= 2 or held.lost.is_set())
        proxy.cut = False
        wait_until("a renewal to be answered", lambda: held.deadline > first or held.lost.is_set())
        assert not held.lost.is_set()
        kept.append((first, held.deadline))
        return idemd.Response(201, body=b"kept")

    result = c.run(key, work, lease=lease)
    assert (result.response.body, result.replayed) == (b"kept", False)
    [(first, renewed)] = kept
    assert renewed > first
    assert proxy.dropped >= 2
    assert idemd.Client(daemon.url).lookup(key).state == "completed"


def test_async_a_link_restored_in_time_keeps_the_lease(
    daemon: Daemon, proxies: Callable[..., GateProxy]
) -> None:
    lease = 2.0
    proxy = proxies(cut_after=1)
    key = fresh_key("deadline-blip-async")
    kept: list[tuple[float, float]] = []

    async def until(what: str, cond: Callable[[], bool]) -> None:
        end = time.monotonic() + scale(20)
        while not cond():
            if time.monotonic() > end:
                pytest.fail(f"timed out waiting for {what}")
            await asyncio.sleep(0.005)

    async def main() -> idemd.Result:
        async with idemd.AsyncClient(proxy.url, retries=0) as c:

            async def work(held: idemd.AsyncLease) -> idemd.Response:
                first = held.deadline
                await until("two renewals to be dropped", lambda: proxy.dropped >= 2)
                proxy.cut = False
                await until("a renewal to be answered", lambda: held.deadline > first)
                assert not held.lost.is_set()
                kept.append((first, held.deadline))
                return idemd.Response(201, body=b"kept")

            return await c.run(key, work, lease=lease)

    result = asyncio.run(main())
    assert (result.response.body, result.replayed) == (b"kept", False)
    [(first, renewed)] = kept
    assert renewed > first
    assert proxy.dropped >= 2
    assert idemd.Client(daemon.url).lookup(key).state == "completed"


# No false alarms: healthy holders behind a slow idemd keep their leases.

# A renewal sent a third of the way into a lease must be answered within 62 % of it.
# This process also runs the proxy, and a full collection of the test session's heap
# pauses it for some 100 ms on a busy machine, which a 300 ms lease's 185 ms cannot
# absorb on top of the round trip; the shortest lease here leaves 620 ms, times the
# slowdown factor for a machine slower still.
LEASES = tuple(scale(lease) for lease in (1.0, 2.0, 3.0))
HOLDERS = 20
#: The holders start this far apart, so that the test measures holders at work rather
#: than a burst of 60 claims at once, whose last would be answered after much of a
#: short lease (a lease reckoned from the call's start, before the batch it waits for).
STAGGER = 0.005


def warm_up(lookup: Callable[[str], object]) -> None:
    """The client's first call opens its connection and loads what httpx loads on first
    use, which can take a short lease's worth of time on a busy machine."""
    with contextlib.suppress(idemd.NotFound):
        lookup(fresh_key("warm-up"))


def test_no_false_alarms_behind_a_slow_idemd(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    """20 holders for each of three lease lengths share one client (so that renewals
    wait for one another in batches) behind a proxy that adds 30 ms to every request;
    each works for two and a half leases. None is lost; every result is stored."""
    proxy = proxies(delay=0.03)
    c = idemd.Client(proxy.url)
    warm_up(c.lookup)
    runs = [(fresh_key(f"healthy-{lease}"), lease) for lease in LEASES for _ in range(HOLDERS)]

    def run(index: int, key: str, lease: float) -> idemd.Result:
        def work(held: idemd.Lease) -> idemd.Response:
            assert not held.lost.wait(2.5 * lease)
            return idemd.Response(201, body=key.encode())

        time.sleep(index * STAGGER)
        return c.run(key, work, lease=lease)

    with ThreadPoolExecutor(len(runs)) as pool:
        results = list(pool.map(lambda r: run(r[0], *r[1]), enumerate(runs)))
    assert [(r.response.body, r.replayed) for r in results] == [(k.encode(), False) for k, _ in runs]
    assert_stored(daemon, [k for k, _ in runs])


def test_async_no_false_alarms_behind_a_slow_idemd(daemon: Daemon, proxies: Callable[..., GateProxy]) -> None:
    proxy = proxies(delay=0.03)
    runs = [(fresh_key(f"healthy-async-{lease}"), lease) for lease in LEASES for _ in range(HOLDERS)]

    async def main() -> list[idemd.Result]:
        async with idemd.AsyncClient(proxy.url) as c:
            with contextlib.suppress(idemd.NotFound):
                await c.lookup(fresh_key("warm-up"))

            async def run(index: int, key: str, lease: float) -> idemd.Result:
                async def work(held: idemd.AsyncLease) -> idemd.Response:
                    await asyncio.sleep(2.5 * lease)
                    assert not held.lost.is_set()
                    return idemd.Response(201, body=key.encode())

                await asyncio.sleep(index * STAGGER)
                return await c.run(key, work, lease=lease)

            done = await asyncio.gather(
                *(run(i, k, lease) for i, (k, lease) in enumerate(runs)), return_exceptions=True
            )
        failed = [r for r in done if not isinstance(r, idemd.Result)]
        assert failed == []
        return [r for r in done if isinstance(r, idemd.Result)]

    results = asyncio.run(main())
    assert [(r.response.body, r.replayed) for r in results] == [(k.encode(), False) for k, _ in runs]
    assert_stored(daemon, [k for k, _ in runs])


def assert_stored(daemon: Daemon, keys: list[str]) -> None:
    with idemd.Client(daemon.url) as c:
        records = [c.lookup(k) for k in keys]
    stored = [(r.state, (r.response or idemd.Response()).body) for r in records]
    assert stored == [("completed", k.encode()) for k in keys]


# A claim that waited for another holder is renewed before the work starts.

Runner = Callable[[str, str, float, Callable[[], None]], "Future[idemd.Result]"]


@pytest.fixture(params=["sync", "async"])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    """Runs run(key, fn, lease, wait=10) with the client of one kind on a thread of its
    own; fn calls ``body`` and answers 200."""
    pool = ThreadPoolExecutor(1)

    def start(url: str, key: str, lease: float, body: Callable[[], None]) -> Future[idemd.Result]:
        if request.param == "sync":

            def sync_fn(_: idemd.Lease) -> idemd.Response:
                body()
                return idemd.Response(200)

            return pool.submit(idemd.Client(url).run, key, sync_fn, lease=lease, wait=10)

        async def async_fn(_: idemd.AsyncLease) -> idemd.Response:
            body()
            return idemd.Response(200)

        async def arun() -> idemd.Result:
            async with idemd.AsyncClient(url) as c:
                return await c.run(key, async_fn, lease=lease, wait=10)

        return pool.submit(asyncio.run, arun())

    yield start
    pool.shutdown()


def test_a_claim_that_waited_is_renewed_before_the_work(
    daemon: Daemon, proxies: Callable[..., GateProxy], runner: Runner
) -> None:
    lease = 1.5
    key = fresh_key("deadline-waited")
    owner = idemd.Client(daemon.url)
    other = owner.claim(key, lease=30)
    proxy = proxies()
    seen: list[tuple[list[str], float]] = []

    def body() -> None:
        current = idemd.current_lease()
        assert current is not None
        seen.append((proxy.paths(), current.deadline))

    waiting = runner(proxy.url, key, lease, body)
    wait_until("the claim to arrive", lambda: proxy.count() == 1)
    # Released once the claim has waited for more than a third of the lease.
    arrived = proxy.received[0].at
    wait_until("a third of the lease", lambda: time.monotonic() > arrived + lease / 3)
    released = time.monotonic()
    owner.release(key, other.token)
    assert waiting.result(scale(30)).replayed is False
    [(paths, deadline)] = seen
    assert paths == ["/v1/claim", "/v1/extend"]
    # Reckoned from the renewal, which was sent after the release.
    assert deadline > released + lease * (1 - MARGIN)


def test_a_claim_that_waited_and_lost_its_lease_does_not_run(
    daemon: Daemon, proxies: Callable[..., GateProxy], runner: Runner
) -> None:
    lease = 1.5
    key = fresh_key("deadline-waited-lost")
    owner = idemd.Client(daemon.url)
    other = owner.claim(key, lease=30)
    proxy = proxies(hold=(1,))  # the renewal after the claim waits for the test
    ran: list[bool] = []
    waiting = runner(proxy.url, key, lease, lambda: ran.append(True))
    wait_until("the claim to arrive", lambda: proxy.count() == 1)
    arrived = proxy.received[0].at
    wait_until("a third of the lease", lambda: time.monotonic() > arrived + lease / 3)
    owner.release(key, other.token)
    wait_until("the renewal to arrive", lambda: proxy.count() == 2)
    owner.purge(key)
    proxy.open(1)
    with pytest.raises(idemd.LeaseLost) as lost:
        waiting.result(scale(30))
    assert not isinstance(lost.value, idemd.LeaseExpired)  # idemd answered
    assert ran == []
    assert proxy.paths() == ["/v1/claim", "/v1/extend"]
