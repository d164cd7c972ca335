"""The calls of Client and AsyncClient against a real idemd."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import http.server
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Daemon, Moving, fresh_key, wait_until
from slowdown import scale

import idemd
import idemd._transport
from idemd._transport import LIMITS


def test_claim_complete_replay(any_daemon: Daemon) -> None:
    with idemd.Client(any_daemon.url) as c:
        key = fresh_key("lifecycle")
        cl = c.claim(key, fingerprint="fp-1", lease=20)
        assert (cl.outcome, cl.attempt, len(cl.token)) == ("acquired", 1, 32)
        assert cl.lease_expires_at is not None
        assert cl.lease_expires_at - datetime.datetime.now(datetime.UTC) > datetime.timedelta(seconds=15)

        with pytest.raises(idemd.InProgress) as busy:
            c.claim(key, fingerprint="fp-1")
        assert busy.value.status == 409
        assert busy.value.code == "in_progress"
        assert busy.value.retry_after is not None
        assert busy.value.retry_after > 15
        with pytest.raises(idemd.FingerprintMismatch):
            c.claim(key, fingerprint="fp-2")

        until = c.extend(key, cl.token, 60)
        assert until - datetime.datetime.now(datetime.UTC) > datetime.timedelta(seconds=50)

        body = b"\x00binary\xffbody"
        want = idemd.Response(201, {"Location": ["/orders/1"]}, body)
        with pytest.raises(idemd.LeaseLost):
            c.complete(key, "0123456789abcdef0123456789abcdef", want)
        c.complete(key, cl.token, want)
        c.complete(key, cl.token, want)  # a repeated complete is answered like the first

        again = c.claim(key, fingerprint="fp-1")
        assert again.outcome == "completed"
        assert again.response == want
        rec = c.lookup(key)
        assert (rec.key, rec.state, rec.fingerprint, rec.response) == (key, "completed", "fp-1", want)
        c.purge(key)
        with pytest.raises(idemd.NotFound):
            c.lookup(key)


def test_release_modes(any_daemon: Daemon) -> None:
    with idemd.Client(any_daemon.url) as c:
        key = fresh_key("release")
        cl = c.claim(key)
        c.release(key, cl.token, "retry")
        cl = c.claim(key)
        assert (cl.outcome, cl.attempt) == ("acquired", 2)
        c.release(key, cl.token, "fail", idemd.Response(402, body=b"declined"))
        cl = c.claim(key)
        assert cl.outcome == "failed"
        assert cl.response == idemd.Response(402, body=b"declined")


class _DropFirstClaim(http.server.BaseHTTPRequestHandler):
    """A proxy in front of the daemon that lets the first claim reach it, then cuts the
    connection before the answer gets back."""

    target = ""
    claims = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        answer = httpx.post(self.target + self.path, content=body, headers=headers)
        if self.path == "/v1/claim":
            with self.lock:
                type(self).claims += 1
                first = type(self).claims == 1
            if first:
                self.close_connection = True
                return
        self.send_response(answer.status_code)
        for k, v in answer.headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Callable[[type[http.server.BaseHTTPRequestHandler]], str]]:
    """Serve a handler class on a free loopback port for one test."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(handler: type[http.server.BaseHTTPRequestHandler]) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_resent_claim_gets_the_same_lease(
    daemon: Daemon, serve: Callable[[type[http.server.BaseHTTPRequestHandler]], str]
) -> None:
    proxy: type[_DropFirstClaim] = type("Proxy", (_DropFirstClaim,), {"target": daemon.url, "claims": 0})
    with idemd.Client(serve(proxy), owner="worker-7") as c:
        key = fresh_key("resent")
        cl = c.claim(key)
        assert (cl.outcome, cl.attempt) == ("acquired", 1)
        assert proxy.claims == 2, "the daemon should see the first claim and one resend"
        rec = idemd.Client(daemon.url).lookup(key)
        assert (rec.owner, rec.attempt) == ("worker-7", 1)
        c.complete(key, cl.token, idemd.Response(200))


def test_same_owner_shares_no_lease(daemon: Daemon) -> None:
    key = fresh_key("same-owner")
    first, second = idemd.Client(daemon.url, owner="job-42"), idemd.Client(daemon.url, owner="job-42")
    assert first.claim(key).outcome == "acquired"
    with pytest.raises(idemd.InProgress):
        second.claim(key)


def test_unavailable(own_daemon: Callable[..., Daemon]) -> None:
    d = own_daemon()
    c = idemd.Client(d.url, retries=1)
    d.kill()
    with pytest.raises(idemd.Unavailable) as down:
        c.claim(fresh_key("down"))
    assert down.value.status == 0
    assert isinstance(down.value.__cause__, httpx.TransportError)


class _ErrorPage(http.server.BaseHTTPRequestHandler):
    """Something in front of idemd that answers with its own error pages."""

    def do_POST(self) -> None:
        auth = self.headers.get("Authorization", "")
        status = 502 if "gateway" in auth else 200 if "success" in auth else 418
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Retry-After", "7")
        self.end_headers()
        self.wfile.write(b"<html>not idemd</html>")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_answer_that_is_not_idemds(
    serve: Callable[[type[http.server.BaseHTTPRequestHandler]], str],
) -> None:
    url = serve(_ErrorPage)
    with pytest.raises(idemd.Unavailable) as gateway:
        idemd.Client(url, token="gateway").claim("k")
    assert (gateway.value.status, gateway.value.code, gateway.value.retry_after) == (502, "", 7)
    with pytest.raises(idemd.Problem) as other:
        idemd.Client(url, token="teapot").claim("k")
    assert type(other.value) is idemd.Problem
    assert other.value.status == 418
    assert "not idemd" in other.value.detail
    with pytest.raises(idemd.Problem) as page:
        idemd.Client(url, token="success").claim("k")
    assert page.value.title == "unexpected answer"


def test_token_and_unknown_codes(own_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    token = "a-test-token-with-enough-entropy-0123456789"
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tenants:\n  team: {}\ntokens:\n  - tenant: team\n    scopes: [use]\n"
        f"    sha256: {hashlib.sha256(token.encode()).hexdigest()}\n"
    )
    d = own_daemon("--auth-file", str(auth))
    with pytest.raises(idemd.Problem) as anonymous:
        idemd.Client(d.url).claim("k")
    assert (anonymous.value.status, anonymous.value.code) == (401, "unauthenticated")
    c = idemd.Client(d.url, token=token)
    assert c.claim("k").outcome == "acquired"
    with pytest.raises(idemd.Problem) as forbidden:
        c.purge("k")
    assert type(forbidden.value) is idemd.Problem
    assert (forbidden.value.status, forbidden.value.code) == (403, "forbidden")


def _moved(what: str, err: BaseException) -> None:
    """err is a 503 store_moved problem with the daemon's wait, and none of the classes
    it is not: the key is not free, so nothing may run on it as if idemd were down."""
    assert isinstance(err, idemd.Problem), f"{what}: {err!r}"
    assert (err.status, err.code) == (503, "store_moved"), f"{what}: {err}"
    assert err.retry_after is not None, f"{what}: no wait in {err}"
    assert err.retry_after > 0, f"{what}: no wait in {err}"
    assert not isinstance(err, idemd.Unavailable | idemd.LeaseLost | idemd.NotFound), f"{what}: {err!r}"


def test_store_moved(moving: Moving) -> None:
    """A key whose record is being moved to another store answers 503 store_moved: a
    Problem with a wait, not Unavailable, from the calls of Client and AsyncClient."""
    with idemd.Client(moving.daemon.url, retries=0) as c:
        key = fresh_key("moved-held")
        cl = c.claim(key, lease=60)
        assert cl.token
        moving.mark(key)
        with pytest.raises(idemd.Problem) as claim:
            c.claim(key)
        _moved("claim", claim.value)
        with pytest.raises(idemd.Problem) as extend:
            c.extend(key, cl.token, 60)
        _moved("extend", extend.value)
        with pytest.raises(idemd.Problem) as complete:
            c.complete(key, cl.token, idemd.Response(200))
        _moved("complete", complete.value)
        with pytest.raises(idemd.Problem) as lookup:
            c.lookup(key)
        _moved("lookup", lookup.value)

    async def main() -> None:
        async with idemd.AsyncClient(moving.daemon.url, retries=0) as c:
            key = fresh_key("moved-held-async")
            cl = await c.claim(key, lease=60)
            assert cl.token
            moving.mark(key)
            with pytest.raises(idemd.Problem) as claim:
                await c.claim(key)
            _moved("async claim", claim.value)
            with pytest.raises(idemd.Problem) as extend:
                await c.extend(key, cl.token, 60)
            _moved("async extend", extend.value)
            with pytest.raises(idemd.Problem) as complete:
                await c.complete(key, cl.token, idemd.Response(200))
            _moved("async complete", complete.value)
            with pytest.raises(idemd.Problem) as lookup:
                await c.lookup(key)
            _moved("async lookup", lookup.value)

    asyncio.run(main())


def test_bad_input_names_the_field(daemon: Daemon) -> None:
    with pytest.raises(idemd.Problem) as bad:
        idemd.Client(daemon.url).claim("k" * 300)
    assert bad.value.status == 400
    assert "key" in bad.value.detail


def test_async_calls(any_daemon: Daemon) -> None:
    async def main() -> None:
        async with idemd.AsyncClient(any_daemon.url) as c:
            key = fresh_key("async")
            cl = await c.claim(key, fingerprint="fp", lease=10)
            assert cl.outcome == "acquired"
            with pytest.raises(idemd.InProgress):
                await c.claim(key, fingerprint="fp")
            await c.extend(key, cl.token, 20)
            await c.complete(key, cl.token, idemd.Response(201, body=b"done"))
            again = await c.claim(key, fingerprint="fp")
            assert again.outcome == "completed"
            assert again.response == idemd.Response(201, body=b"done")
            assert (await c.lookup(key)).state == "completed"
            await c.purge(key)
            with pytest.raises(idemd.NotFound):
                await c.lookup(key)
            other = fresh_key("async-release")
            cl = await c.claim(other)
            await c.release(other, cl.token, "fail", idemd.Response(402))
            assert (await c.claim(other)).outcome == "failed"

    asyncio.run(main())


def test_async_waits_for_the_holder(daemon: Daemon) -> None:
    async def main() -> None:
        async with idemd.AsyncClient(daemon.url) as c:
            key = fresh_key("async-wait")
            cl = await c.claim(key)
            waiter = asyncio.create_task(c.claim(key, wait=20))
            await asyncio.sleep(0)
            await c.complete(key, cl.token, idemd.Response(200, body=b"first"))
            got = await waiter
            assert got.outcome == "completed"
            assert got.response == idemd.Response(200, body=b"first")

    asyncio.run(main())


def test_message_key_matches_go() -> None:
    # The same values printed by the Go client's MessageKey.
    assert (
        idemd.message_key("orders", "partition-0", "42")
        == "msg-8b4d16a1f4415b1225b20cb8a76a17759840051bbf87485a70abae5bdf311a4c"
    )
    assert (
        idemd.message_key("é", "") == "msg-20515eaeb079a63aacbb1f418c419d5275c32d1edae9c8bee51ed30013f2d04d"
    )
    assert idemd.message_key("ab", "c") != idemd.message_key("a", "bc")
    assert len(idemd.message_key("x" * 10000)) <= 255


def test_timeout_bounds_a_call_to_a_silent_server() -> None:
    """A server that takes the connection and never answers: the call gives up after its
    timeout (resends included) with Unavailable."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        c = idemd.Client(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5, retries=1)
        with pytest.raises(idemd.Unavailable) as down:
            c.claim("k")
    assert isinstance(down.value.__cause__, httpx.TimeoutException)


def test_a_waiting_claim_gets_its_wait_on_top_of_the_timeout(daemon: Daemon) -> None:
    """timeout=1 with wait=2: the daemon answers after the wait, and the client waits
    for that answer instead of giving up after 1 s."""
    key = fresh_key("wait-timeout")
    holder = idemd.Client(daemon.url)
    holder.claim(key)
    with pytest.raises(idemd.InProgress):
        idemd.Client(daemon.url, timeout=1, retries=0).claim(key, wait=2)


def _count_connections(client: httpx.Client | httpx.AsyncClient) -> Callable[[], int]:
    """Counts the TCP connections a client opens, from httpcore's trace events."""
    opened = 0
    lock = threading.Lock()

    def trace(event: str, _: object) -> None:
        nonlocal opened
        if event == "connection.connect_tcp.complete":
            with lock:
                opened += 1

    async def async_trace(event: str, info: object) -> None:
        trace(event, info)

    def hook(request: httpx.Request) -> None:
        request.extensions["trace"] = trace

    async def async_hook(request: httpx.Request) -> None:
        request.extensions["trace"] = async_trace

    if isinstance(client, httpx.Client):
        client.event_hooks["request"].append(hook)
    else:
        client.event_hooks["request"].append(async_hook)
    return lambda: opened


def _established_to(url: str) -> int:
    """How many TCP connections to url's port are established, from /proc/net/tcp."""
    port = httpx.URL(url).port
    n = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            n += 1
    return n


# Many callers without batching each keep a connection busy. httpx keeps 20 idle
# connections by default and closes the others as they come back, and while it does,
# its pool can close a connection it has just handed to another caller
# (encode/httpcore#1110, in httpcore 1.0.9): that call fails with EBADF or waits out its
# timeout. The client keeps as many idle connections as it may open, so that the pool
# never closes one for being surplus; each test checks that more than 20 and no more
# than its bound are open once the callers are done, and that it replaced few.
needs_proc_net = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net/tcp")
CALLERS, CYCLES = 64, 10
BOUND = LIMITS.max_connections or 0
REPLACED = 4


@needs_proc_net
def test_many_threads_keep_their_connections(own_daemon: Callable[..., Daemon]) -> None:
    d = own_daemon()
    # Every caller first waits on a key another client holds, so that the pool opens
    # every connection it may, however fast the daemon answers; the key completes once
    # they are all open.
    gate = fresh_key("conns-gate")
    with idemd.Client(d.url, batching=False, retries=0) as c:
        opened = _count_connections(c._api.get_httpx_client())
        failures: list[BaseException] = []
        start = threading.Barrier(CALLERS)

        def worker(n: int) -> None:
            try:
                start.wait(timeout=scale(60))
                c.claim(gate, wait=30)
                for i in range(CYCLES):
                    key = fresh_key(f"conns-{n}-{i}")
                    cl = c.claim(key)
                    c.complete(key, cl.token, idemd.Response(204))
            except BaseException as err:
                failures.append(err)

        with idemd.Client(d.url, batching=False, retries=0) as gatekeeper:
            held = gatekeeper.claim(gate)
            pool = [threading.Thread(target=worker, args=(n,)) for n in range(CALLERS)]
            for t in pool:
                t.start()
            # The gatekeeper's own connection and every one the callers' pool may open.
            wait_until(
                "every connection of the pool to be open",
                lambda: _established_to(d.url) >= BOUND + 1,
                deadline=20,
            )
            gatekeeper.complete(gate, held.token, idemd.Response(204))
        for t in pool:
            t.join()
        assert failures == []
        assert 20 < _established_to(d.url) <= BOUND
        # A connection the pool closed for being surplus is replaced at once, dozens of
        # times in a run like this one. On a loaded machine a connection may also end
        # for another reason now and then (the pool replaces one it finds broken), so a
        # few replacements are allowed.
        assert opened() <= BOUND + REPLACED


# httpcore's pool checks whether an idle connection was closed by the server by reading
# its state and then its socket; a request can go out and be answered on that connection
# in between, and the pool then closes it under the request (EBADF). The window is a
# thread switch wide, so the test makes the interpreter switch threads every 10 µs.
def test_pool_never_closes_a_connection_in_use(own_daemon: Callable[..., Daemon]) -> None:
    d = own_daemon()
    transport = idemd._transport.RetryTransport(timeout=scale(30), retries=0, backoff=0.01)
    client = httpx.Client(transport=transport, base_url=d.url)
    failures: list[BaseException] = []
    start = threading.Barrier(CALLERS)

    def worker() -> None:
        try:
            start.wait(timeout=scale(60))
            for _ in range(200):
                client.get("/healthz").raise_for_status()
        except BaseException as err:
            failures.append(err)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        pool = [threading.Thread(target=worker) for _ in range(CALLERS)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        client.close()
    assert failures == []


@needs_proc_net
def test_many_tasks_keep_their_connections(own_daemon: Callable[..., Daemon]) -> None:
    d = own_daemon()

    async def main() -> None:
        async with idemd.AsyncClient(d.url, batching=False, retries=0) as c:
            opened = _count_connections(c._api.get_async_httpx_client())

            async def worker(n: int) -> None:
                for i in range(CYCLES):
                    key = fresh_key(f"aconns-{n}-{i}")
                    cl = await c.claim(key)
                    await c.complete(key, cl.token, idemd.Response(204))

            await asyncio.gather(*(worker(n) for n in range(CALLERS)))
            assert 20 < _established_to(d.url) <= BOUND
            assert opened() <= BOUND + REPLACED

    asyncio.run(main())
