"""Natural batching against a real idemd, behind a GateProxy that holds chosen requests
so that calls gather behind them deterministically. Each test runs with Client, its
calls made from threads, and with AsyncClient, its calls made as tasks on an event loop
of its own; both hand back concurrent futures."""

from __future__ import annotations

import asyncio
import base64
import datetime
import http.server
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import Daemon, fresh_key, wait_until
from proxy import GateProxy
from slowdown import scale

import idemd

TIMEOUT = scale(60.0)


class Caller:
    """Starts a client's calls concurrently, each returning a future of its outcome."""

    def start(self, name: str, *args: Any, **kwargs: Any) -> Future[Any]:
        raise NotImplementedError

    def queued(self) -> int:
        """How many calls wait for the client's request in flight."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def queue(self, name: str, *args: Any, **kwargs: Any) -> Future[Any]:
        """Starts a call and waits until it is queued behind the request in flight, so
        that the calls of a batch are in the order they were started."""
        before = self.queued()
        call = self.start(name, *args, **kwargs)
        wait_until(f"{name} to be queued", lambda: self.queued() == before + 1 or call.done())
        if call.done():
            call.result()
            pytest.fail(f"{name} was answered instead of queued")
        return call


class ThreadCaller(Caller):
    def __init__(self, url: str, **options: Any) -> None:
        self.client = idemd.Client(url, **options)
        self._pool = ThreadPoolExecutor(64)

    def start(self, name: str, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._pool.submit(getattr(self.client, name), *args, **kwargs)

    def queued(self) -> int:
        batches = self.client._batches
        return 0 if batches is None else batches.queued

    def close(self) -> None:
        self._pool.shutdown()
        self.client.close()


class LoopCaller(Caller):
    def __init__(self, url: str, **options: Any) -> None:
        self.client = idemd.AsyncClient(url, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def start(self, name: str, *args: Any, **kwargs: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(getattr(self.client, name)(*args, **kwargs), self._loop)

    def queued(self) -> int:
        async def count() -> int:
            batches = self.client._batches
            return 0 if batches is None else batches.queued

        return asyncio.run_coroutine_threadsafe(count(), self._loop).result(TIMEOUT)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.aclose(), self._loop).result(TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(TIMEOUT)
        self._loop.close()


Connect = Callable[..., Caller]


@pytest.fixture(params=["threads", "asyncio"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """Makes a Client (threads) or an AsyncClient (asyncio) of a URL; closed after the test."""
    made: list[Caller] = []

    def make(url: str, **options: Any) -> Caller:
        caller: Caller = (
            ThreadCaller(url, **options) if request.param == "threads" else LoopCaller(url, **options)
        )
        made.append(caller)
        return caller

    yield make
    for caller in made:
        caller.close()


@pytest.fixture
def gate(daemon: Daemon) -> Iterator[Callable[..., GateProxy]]:
    """Starts GateProxies, in front of the shared daemon unless told otherwise."""
    started: list[GateProxy] = []

    def start(target: str = daemon.url, **options: Any) -> GateProxy:
        proxy = GateProxy(target, **options)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()


@pytest.fixture
def plain(daemon: Daemon) -> Iterator[idemd.Client]:
    """A client straight to the daemon, without batching, to set up and check records."""
    with idemd.Client(daemon.url, batching=False) as c:
        yield c


def held_claim(proxy: GateProxy, caller: Caller) -> Future[Any]:
    """Sends a claim that the proxy holds, as request number ``proxy.count()``."""
    index = proxy.count()
    held = caller.start("claim", fresh_key("held"))
    wait_until("the held claim to reach the proxy", lambda: proxy.count() == index + 1)
    return held


def failure(call: Future[Any]) -> BaseException:
    err = call.exception(TIMEOUT)
    assert err is not None, f"unexpected value: {call.result()}"
    return err


def test_calls_in_flight_go_out_as_one_batch_each_answered_as_alone(
    connect: Connect, gate: Callable[..., GateProxy], plain: idemd.Client
) -> None:
    proxy = gate(hold=(0, 2))
    caller = connect(proxy.url)
    finished = fresh_key("finished")
    done = plain.claim(finished, fingerprint="f")
    plain.complete(finished, done.token, idemd.Response(201, body=b"made"))

    held = held_claim(proxy, caller)
    k1, k2 = fresh_key("k1"), fresh_key("k2")
    first = caller.queue("claim", k1, fingerprint="a")
    mismatch = caller.queue("claim", k1, fingerprint="b")
    busy = caller.queue("claim", k1, fingerprint="a")
    other = caller.queue("claim", k2, lease=60)
    replay = caller.queue("claim", finished, fingerprint="f")
    proxy.open(0)
    assert held.result(TIMEOUT).outcome == "acquired"
    a1, a2 = first.result(TIMEOUT), other.result(TIMEOUT)
    assert proxy.paths() == ["/v1/claim", "/v1/batch of 5"]

    assert (a1.outcome, a1.attempt, len(a1.token)) == ("acquired", 1, 32)
    assert (a2.outcome, a2.attempt, len(a2.token)) == ("acquired", 1, 32)
    mismatched = failure(mismatch)
    assert isinstance(mismatched, idemd.FingerprintMismatch), repr(mismatched)
    assert (mismatched.status, mismatched.code) == (422, "fingerprint_mismatch")
    in_progress = failure(busy)
    assert isinstance(in_progress, idemd.InProgress), repr(in_progress)
    assert (in_progress.status, in_progress.code) == (409, "in_progress")
    assert in_progress.retry_after is not None
    assert in_progress.retry_after > 20
    replayed = replay.result(TIMEOUT)
    assert replayed.outcome == "completed"
    assert replayed.response == idemd.Response(201, body=b"made")

    # Completes, extends and releases share a batch too; items on one key run in their
    # order, so the claim after the release replays the failure it stored.
    held = held_claim(proxy, caller)
    completed = caller.queue("complete", k1, a1.token, idemd.Response(200, body=b"one"))
    extended = caller.queue("extend", k2, a2.token, 120)
    lost = caller.queue("extend", k2, "0123456789abcdef0123456789abcdef", 1)
    released = caller.queue("release", k2, a2.token, "fail", idemd.Response(402, body=b"declined"))
    again = caller.queue("claim", k2)
    proxy.open(2)
    assert held.result(TIMEOUT).outcome == "acquired"
    assert completed.result(TIMEOUT) is None
    assert a2.lease_expires_at is not None
    assert extended.result(TIMEOUT) > a2.lease_expires_at + datetime.timedelta(seconds=30)
    assert isinstance(failure(lost), idemd.LeaseLost), repr(failure(lost))
    assert released.result(TIMEOUT) is None
    failed = again.result(TIMEOUT)
    assert (failed.outcome, failed.response) == ("failed", idemd.Response(402, body=b"declined"))
    assert proxy.paths()[2:] == ["/v1/claim", "/v1/batch of 5"]
    assert plain.lookup(k1).state == "completed"


def test_a_caller_cancelled_while_queued_is_left_out(
    gate: Callable[..., GateProxy], plain: idemd.Client
) -> None:
    proxy = gate()
    caller = LoopCaller(proxy.url)
    try:
        held = held_claim(proxy, caller)
        gone, stays = fresh_key("gone"), fresh_key("stays")
        left = caller.queue("claim", gone)
        staying = caller.queue("claim", stays)
        assert left.cancel()
        wait_until("the cancelled call to leave the queue", lambda: caller.queued() == 1)
        proxy.open()
        assert held.result(TIMEOUT).outcome == "acquired"
        assert staying.result(TIMEOUT).outcome == "acquired"
        assert proxy.paths() == ["/v1/claim", "/v1/claim"]
        with pytest.raises(idemd.NotFound):
            plain.lookup(gone)
        assert plain.lookup(stays).state == "pending"
    finally:
        caller.close()


def test_a_caller_cancelled_while_its_batch_is_in_flight_does_not_cut_it_off(
    gate: Callable[..., GateProxy], plain: idemd.Client
) -> None:
    proxy = gate(hold=(0, 1))
    caller = LoopCaller(proxy.url)
    try:
        held = held_claim(proxy, caller)
        gone, stays = fresh_key("gone"), fresh_key("stays")
        left = caller.queue("claim", gone)
        staying = caller.queue("claim", stays)
        proxy.open(0)
        assert held.result(TIMEOUT).outcome == "acquired"
        wait_until("the batch to reach the proxy", lambda: proxy.count() == 2)
        assert left.cancel()
        proxy.open(1)
        assert staying.result(TIMEOUT).outcome == "acquired"
        assert proxy.paths() == ["/v1/claim", "/v1/batch of 2"]
        # The batch went through whole: the claim of the caller that left took effect.
        assert plain.lookup(gone).state == "pending"
    finally:
        caller.close()


def test_a_daemon_without_the_batch_endpoint_gets_calls_one_by_one_and_no_batch_after(
    connect: Connect, gate: Callable[..., GateProxy]
) -> None:
    proxy = gate(batch_status=404)
    caller = connect(proxy.url)
    held = held_claim(proxy, caller)
    k1 = fresh_key("k1")
    first = caller.queue("claim", k1)
    busy = caller.queue("claim", k1)
    other = caller.queue("claim", fresh_key("k2"))
    proxy.open()
    assert held.result(TIMEOUT).outcome == "acquired"
    assert first.result(TIMEOUT).outcome == "acquired"
    assert isinstance(failure(busy), idemd.InProgress), repr(failure(busy))
    assert other.result(TIMEOUT).outcome == "acquired"
    assert proxy.paths() == ["/v1/claim", "/v1/batch of 3", "/v1/claim", "/v1/claim", "/v1/claim"]

    later = [caller.start("claim", fresh_key("later")) for _ in range(4)]
    for call in later:
        assert call.result(TIMEOUT).outcome == "acquired"
    assert proxy.paths()[5:] == ["/v1/claim"] * 4


def test_a_batch_refused_as_too_large_is_resent_call_by_call_and_batching_stays_on(
    connect: Connect, gate: Callable[..., GateProxy]
) -> None:
    proxy = gate(hold=(0, 4), batch_status=413)
    caller = connect(proxy.url)
    for _ in range(2):
        index = proxy.count()
        held = held_claim(proxy, caller)
        calls = [caller.queue("claim", fresh_key("a")), caller.queue("claim", fresh_key("b"))]
        proxy.open(index)
        assert held.result(TIMEOUT).outcome == "acquired"
        for call in calls:
            assert call.result(TIMEOUT).outcome == "acquired"
        assert proxy.paths()[index:] == ["/v1/claim", "/v1/batch of 2", "/v1/claim", "/v1/claim"]


def test_sealed_results_share_a_batch_and_come_back_opened(
    connect: Connect, gate: Callable[..., GateProxy], daemon: Daemon
) -> None:
    """Completes and releases in mode fail go in a batch as {status, sealed}, which
    idemd keeps as given; claims answered in a batch open what they replay, and one
    whose result does not open gets Unsealable alone."""
    ring = idemd.KeyRing([idemd.SealKey("batch-1", bytes(range(32)))])
    proxy = gate(hold=(0, 2, 4))
    caller = connect(proxy.url, sealing=idemd.Sealing("default", ring))
    k1, k2, foreign = fresh_key("sealed-1"), fresh_key("sealed-2"), fresh_key("sealed-foreign")
    other = idemd.Sealing("default", idemd.KeyRing([idemd.SealKey("batch-other", bytes(32))]))
    with idemd.Client(daemon.url, sealing=other) as c:
        c.complete(foreign, c.claim(foreign).token, idemd.Response(200, body=b"theirs"))

    held = held_claim(proxy, caller)
    claims = [caller.queue("claim", k1), caller.queue("claim", k2)]
    proxy.open(0)
    a1, a2 = (call.result(TIMEOUT) for call in claims)
    assert held.result(TIMEOUT).outcome == "acquired"

    made = idemd.Response(201, {"Location": ["/orders/9"]}, b"made for ada@example.com")
    declined = idemd.Response(402, body=b"card 4242 declined")
    held = held_claim(proxy, caller)
    completed = caller.queue("complete", k1, a1.token, made)
    released = caller.queue("release", k2, a2.token, "fail", declined)
    proxy.open(2)
    assert completed.result(TIMEOUT) is None
    assert released.result(TIMEOUT) is None
    for key, status, secret in ((k1, 201, b"ada@example.com"), (k2, 402, b"4242")):
        raw = httpx.get(f"{daemon.url}/v1/records/{key}", timeout=TIMEOUT).json()["response"]
        assert set(raw) == {"status", "sealed"}
        assert raw["status"] == status
        assert secret not in base64.b64decode(raw["sealed"])

    held = held_claim(proxy, caller)
    replays = [caller.queue("claim", k1), caller.queue("claim", k2), caller.queue("claim", foreign)]
    proxy.open(4)
    assert held.result(TIMEOUT).outcome == "acquired"
    assert replays[0].result(TIMEOUT).response == made
    assert replays[1].result(TIMEOUT).response == declined
    refused = failure(replays[2])
    assert isinstance(refused, idemd.Unsealable), repr(refused)
    assert (refused.reason, refused.key_id) == ("unknown_key", "batch-other")
    batches = ["/v1/batch of 2", "/v1/batch of 2", "/v1/batch of 3"]
    assert proxy.paths() == [path for batch in batches for path in ("/v1/claim", batch)]


def test_with_batching_off_every_call_is_its_own_request(
    connect: Connect, gate: Callable[..., GateProxy]
) -> None:
    proxy = gate()
    caller = connect(proxy.url, batching=False)
    held = held_claim(proxy, caller)
    calls = [caller.start("claim", fresh_key("a")), caller.start("claim", fresh_key("b"))]
    wait_until("both calls to reach the proxy", lambda: proxy.count() == 3)
    proxy.open()
    for call in [held, *calls]:
        assert call.result(TIMEOUT).outcome == "acquired"
    assert proxy.paths() == ["/v1/claim"] * 3


def test_a_claim_that_waits_and_a_large_call_go_alone(
    connect: Connect, gate: Callable[..., GateProxy], plain: idemd.Client
) -> None:
    proxy = gate()
    caller = connect(proxy.url)
    large = fresh_key("large")
    lease = plain.claim(large)
    held = held_claim(proxy, caller)
    queued = caller.queue("claim", fresh_key("a"))
    waits = caller.start("claim", fresh_key("waits"), wait=1)
    big = caller.start("complete", large, lease.token, idemd.Response(200, body=b"x" * (20 << 10)))
    wait_until("the waiting claim and the large complete to reach the proxy", lambda: proxy.count() == 3)
    assert caller.queued() == 1
    proxy.open()
    for call in (held, queued, waits):
        assert call.result(TIMEOUT).outcome == "acquired"
    assert big.result(TIMEOUT) is None
    assert sorted(proxy.paths()[1:3]) == ["/v1/claim", "/v1/complete"]
    assert proxy.paths()[3:] == ["/v1/claim"]
    assert plain.lookup(large).state == "completed"


class _NotIdemd(http.server.BaseHTTPRequestHandler):
    """A server that answers every request 200 with a JSON body that is not idemd's."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_answer_that_is_not_idemds_is_refused_in_a_batch_as_alone(
    connect: Connect, gate: Callable[..., GateProxy]
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotIdemd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proxy = gate(f"http://127.0.0.1:{server.server_address[1]}")
        caller = connect(proxy.url)
        held = held_claim(proxy, caller)
        calls = [
            caller.queue("claim", fresh_key("a")),
            caller.queue("extend", fresh_key("b"), "0" * 32, 1),
        ]
        proxy.open()
        for call in [held, *calls]:
            err = failure(call)
            assert type(err) is idemd.Problem, repr(err)
            assert (err.status, err.title) == (0, "unexpected answer")
        assert proxy.paths() == ["/v1/claim", "/v1/batch of 2"]
    finally:
        server.shutdown()
        server.server_close()


def test_many_concurrent_callers_are_each_answered(
    connect: Connect, gate: Callable[..., GateProxy], plain: idemd.Client
) -> None:
    """No request is held: gathering follows the load, and every call gets its own answer."""
    proxy = gate(hold=())
    caller = connect(proxy.url)
    keys = [fresh_key("many") for _ in range(48)]
    claims = [caller.start("claim", key, fingerprint=key) for key in keys]
    tokens = [call.result(TIMEOUT).token for call in claims]
    busy = [caller.start("claim", key, fingerprint=key) for key in keys]
    for call in busy:
        assert isinstance(failure(call), idemd.InProgress)
    completes = [
        caller.start("complete", key, token, idemd.Response(200, body=key.encode()))
        for key, token in zip(keys, tokens, strict=True)
    ]
    for call in completes:
        assert call.result(TIMEOUT) is None
    replays = [caller.start("claim", key, fingerprint=key) for key in keys]
    for key, call in zip(keys, replays, strict=True):
        assert call.result(TIMEOUT).response == idemd.Response(200, body=key.encode())
    assert plain.lookup(keys[-1]).state == "completed"
