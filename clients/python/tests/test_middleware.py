"""The behaviour table of docs/middleware.md, row by row, over real HTTP: the ASGI
middleware in a Starlette app served by uvicorn, the WSGI middleware in a Flask and a
Django app served by werkzeug's threaded server, each against a real idemd. Every test
runs once per framework and expects the same answers."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from apps import BIG, LARGE, Orders, django_app, flask_app, starlette_app
from conftest import Daemon, Moving, fresh_key, wait_until
from proxy import GateProxy
from slowdown import scale
from werkzeug.serving import make_server

import idemd
from idemd import asgi, wsgi
from idemd._middleware import Incident, fingerprint, idemd_key

FRAMEWORKS = ["starlette", "flask", "django"]

#: One HTTP client for the tests' requests: making one per request costs more than the
#: request (it loads the CA bundle). A connection per request, as a server may close one
#: after a failed request.
http = httpx.Client(timeout=scale(60), headers={"Connection": "close"})


@dataclass
class Served:
    url: str
    state: Orders
    framework: str
    incidents: list[str] = field(default_factory=list)
    #: The error of each incident, in the same order.
    errors: list[BaseException | None] = field(default_factory=list)

    def expect_incidents(self, kinds: list[str]) -> None:
        """The incidents reported so far are ``kinds``. The hook runs after the answer is
        written, so it may come a moment after the client has the answer."""
        wait_until(f"incidents {kinds}", lambda: len(self.incidents) >= len(kinds))
        assert self.incidents == kinds

    def post(
        self,
        path: str = "/orders",
        body: str = '{"item":"book","qty":1}',
        key: str | None = None,
        user: str | None = "user-1",
        content_type: str = "application/json",
        **headers: str,
    ) -> httpx.Response:
        h = {"Content-Type": content_type, **headers}
        if key is not None:
            h["Idempotency-Key"] = key
        if user is not None:
            h["X-User"] = user
        return http.post(self.url + path, content=body.encode(), headers=h)


def _asgi_user(scope: Any) -> str | None:
    for k, v in scope["headers"]:
        if k == b"x-user":
            return str(v.decode())
    return None


def _wsgi_user(environ: Any) -> str | None:
    user = environ.get("HTTP_X_USER")
    return str(user) if user else None


class _Uvicorn:
    def __init__(self, app: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_until("uvicorn to start", lambda: self.server.started)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(scale(30))
        self.sock.close()


class _Werkzeug:
    def __init__(self, app: Any) -> None:
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(scale(30))
        self.server.server_close()


ServeFn = Callable[..., Served]


@pytest.fixture(params=FRAMEWORKS)
def serve(request: pytest.FixtureRequest, daemon: Daemon) -> Iterator[ServeFn]:
    """Start the orders service of one framework behind its middleware, with options."""
    framework: str = request.param
    servers: list[_Uvicorn | _Werkzeug] = []

    def start(
        idemd_url: str = daemon.url,
        retries: int = 3,
        sealing: idemd.Sealing | None = None,
        token: str | None = None,
        **options: Any,
    ) -> Served:
        served = Served("", Orders(), framework)

        def on_incident(_: Any, incident: Incident) -> None:
            served.errors.append(incident.error)
            served.incidents.append(incident.kind)

        options.setdefault("on_incident", on_incident)
        server: _Uvicorn | _Werkzeug
        if framework == "starlette":
            app = starlette_app(served.state)
            app.add_middleware(
                asgi.IdempotencyMiddleware,
                client=idemd.AsyncClient(idemd_url, retries=retries, sealing=sealing, token=token),
                scope=_asgi_user,
                **options,
            )
            server = _Uvicorn(app)
        else:
            inner = flask_app(served.state) if framework == "flask" else django_app(served.state)
            server = _Werkzeug(
                wsgi.IdempotencyMiddleware(
                    inner,
                    idemd.Client(idemd_url, retries=retries, sealing=sealing, token=token),
                    scope=_wsgi_user,
                    **options,
                )
            )
        servers.append(server)
        served.url = server.url
        return served

    yield start
    for server in servers:
        server.stop()


def test_replays_byte_for_byte(serve: ServeFn) -> None:
    """C1, C2, P1, P2: the first request runs; a retry gets its status, stored headers
    and body back, marked, without cookies or headers not listed."""
    s = serve()
    key = fresh_key("replay")
    first = s.post(key=key)
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert first.headers["set-cookie"] == "session=secret"
    second = s.post(key=key)
    assert (second.status_code, second.content) == (201, first.content)
    assert second.headers["location"] == first.headers["location"]
    assert second.headers["content-type"] == first.headers["content-type"]
    assert second.headers["idempotent-replayed"] == "true"
    assert "set-cookie" not in second.headers
    assert "x-not-stored" not in second.headers
    # The same JSON with other member order and spacing is the same request.
    third = s.post(key=key, body='{ "qty": 1,\n "item": "book" }')
    assert (third.status_code, third.content) == (201, first.content)
    # A bare key and its sf-string are the same key.
    fourth = s.post(key=f'"{key}"')
    assert (fourth.status_code, fourth.content) == (201, first.content)
    assert s.state.runs["orders"] == 1


def test_scopes_never_share_answers(serve: ServeFn) -> None:
    """Promise 2: another user with the same key and body runs the handler for itself;
    M4: a request whose scope cannot be told is refused before the handler."""
    s = serve()
    key = fresh_key("scope")
    mine = s.post(key=key, user="user-1")
    theirs = s.post(key=key, user="user-2")
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["run"] != theirs.json()["run"]
    nobody = s.post(key=key, user=None)
    assert nobody.status_code == 500
    assert nobody.json()["code"] == "idempotency_scope_missing"
    assert s.state.runs["orders"] == 2
    s.expect_incidents(["scope_missing"])


def test_refuses_a_changed_request(serve: ServeFn) -> None:
    """C4: the key reused with another body or another query is 422, never a replay."""
    s = serve()
    key = fresh_key("changed")
    s.post(key=key, body='{"item":"book"}')
    for path, body in (("/orders", '{"item":"pen"}'), ("/orders?status=201", '{"item":"book"}')):
        r = s.post(path, body=body, key=key)
        assert r.status_code == 422
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "fingerprint_mismatch"
    assert s.state.runs["orders"] == 1


def test_in_flight_duplicate_gets_409(serve: ServeFn) -> None:
    """C3: a duplicate while the first request runs gets 409 with Retry-After."""
    s = serve()
    s.state.block = True
    key = fresh_key("busy")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(s.post, key=key)
        wait_until("the first request to run", lambda: s.state.runs["orders"] == 1)
        dup = s.post(key=key)
        assert dup.status_code == 409
        assert dup.json()["code"] == "in_progress"
        assert int(dup.headers["retry-after"]) >= 1
        s.state.gate.set()
        assert first.result().status_code == 201
    assert s.state.runs["orders"] == 1


def test_storm_runs_the_handler_once(serve: ServeFn) -> None:
    """C3 with wait: 30 identical requests at once run the handler once and all get its
    answer."""
    s = serve(wait=20)
    s.state.block = True
    key = fresh_key("storm")
    with ThreadPoolExecutor(30) as pool:
        replies = [pool.submit(s.post, key=key) for _ in range(30)]
        wait_until("the first request to run", lambda: s.state.runs["orders"] == 1)
        s.state.gate.set()
        answers = [r.result() for r in replies]
    assert s.state.runs["orders"] == 1
    assert {(a.status_code, a.content) for a in answers} == {(201, answers[0].content)}
    assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 29


@pytest.mark.parametrize(
    ("status", "stored"),
    [
        (201, True),
        (302, True),
        (402, True),
        (400, False),
        (401, False),
        (409, False),
        (429, False),
        (503, False),
    ],
)
def test_which_answers_are_stored(serve: ServeFn, status: int, stored: bool) -> None:
    """R1-R3: 2xx, 3xx and 402 are results; other 4xx and 5xx release the key, and the
    retry runs the handler again."""
    s = serve()
    key = fresh_key(f"status-{status}")
    first = s.post(f"/orders?status={status}", key=key)
    assert first.status_code == status
    again = s.post(f"/orders?status={status}", key=key)
    assert again.status_code == status
    assert (again.headers.get("idempotent-replayed") == "true") is stored
    assert s.state.runs["orders"] == (1 if stored else 2)


def test_an_exception_releases_the_key(serve: ServeFn) -> None:
    """R4 (R3 where the framework turns the exception into a 500 itself)."""
    s = serve()
    key = fresh_key("boom")
    assert s.post("/boom", key=key).status_code == 500
    retry = s.post("/boom", key=key)
    assert retry.status_code == 201
    assert "idempotent-replayed" not in retry.headers
    assert s.state.runs["boom"] == 2


@pytest.mark.parametrize(("status", "runs"), [(201, 1), (503, 2)])
def test_an_exception_after_the_status(serve: ServeFn, status: int, runs: int) -> None:
    """R15: an exception after the status and the first chunk went out. A status to store
    keeps 409 response_not_stored (never the partial body, never a second run); a 5xx
    releases the key, as R3."""
    s = serve()
    key = fresh_key("late-boom")
    path = f"/late-boom?status={status}"
    with pytest.raises(httpx.HTTPError):
        s.post(path, key=key).read()

    def settled() -> bool:
        r = s.post(path, key=key)
        return r.status_code != 409 or r.json()["code"] != "in_progress"

    if status == 201:
        wait_until("the key to be settled", settled)
        replay = s.post(path, key=key)
        assert (replay.status_code, replay.json()["code"]) == (409, "response_not_stored")
        assert replay.headers["idempotent-replayed"] == "true"
        s.expect_incidents(["result_not_stored"])
    else:

        def retried() -> bool:
            with contextlib.suppress(httpx.HTTPError):  # the retry ran, and was cut short too
                s.post(path, key=key)
            return s.state.runs["late-boom"] >= 2

        wait_until("a retry to run the handler", retried)
    assert s.state.runs["late-boom"] == runs


def test_requests_it_does_not_touch(serve: ServeFn) -> None:
    """M1, M2: no key, or a method not covered, passes through unprotected."""
    s = serve()
    s.post(key=None)
    s.post(key=None)
    key = fresh_key("get")
    for _ in range(2):
        assert http.get(s.url + "/orders", headers={"Idempotency-Key": key, "X-User": "u"}).status_code == 201
    assert s.state.runs["orders"] == 4


def test_refuses_keys_it_cannot_read(serve: ServeFn) -> None:
    """M2 with require_key, M3, M6."""
    s = serve(require_key=True, max_body=100)
    missing = s.post(key=None)
    assert (missing.status_code, missing.json()["code"]) == (400, "missing_idempotency_key")
    for bad in ("a b", '"unterminated', '"k";p=1', "k" * 256, "a,b"):
        r = s.post(key=bad)
        assert (r.status_code, r.json()["code"]) == (400, "invalid_idempotency_key"), bad
    two_lines = http.post(
        s.url + "/orders",
        content=b"{}",
        headers=[("Idempotency-Key", "same"), ("Idempotency-Key", "same"), ("X-User", "user-1")],
    )
    assert (two_lines.status_code, two_lines.json()["code"]) == (400, "invalid_idempotency_key")
    big = s.post(key=fresh_key("big"), body="x" * 101)
    assert (big.status_code, big.json()["code"]) == (413, "payload_too_large")
    assert s.state.runs["orders"] == 0


def test_when_idemd_cannot_be_reached(serve: ServeFn, own_daemon: Callable[..., Daemon]) -> None:
    """C5: fail closed with 503 and Retry-After; with fail_open the handler runs
    unprotected."""
    d = own_daemon()
    closed = serve(idemd_url=d.url, retries=0)
    opened = serve(idemd_url=d.url, retries=0, fail_open=True)
    d.kill()
    r = closed.post(key=fresh_key("down"))
    assert (r.status_code, r.json()["code"]) == (503, "idempotency_unavailable")
    assert int(r.headers["retry-after"]) >= 1
    assert closed.state.runs["orders"] == 0
    closed.expect_incidents(["unavailable"])
    assert opened.post(key=fresh_key("down")).status_code == 201
    assert opened.state.runs["orders"] == 1
    opened.expect_incidents(["fail_open"])


def test_when_idemd_refuses(serve: ServeFn, own_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """C6: an error answer from idemd (here 401, a token it does not know) is never an
    outage: 503 and no run, even with fail_open."""
    auth = tmp_path / "auth.yaml"
    other = hashlib.sha256(b"a token this service does not have").hexdigest()
    auth.write_text(
        f"tenants:\n  team: {{}}\ntokens:\n  - tenant: team\n    scopes: [use]\n    sha256: {other}\n"
    )
    d = own_daemon("--auth-file", str(auth))
    s = serve(idemd_url=d.url, fail_open=True)
    r = s.post(key=fresh_key("refused"))
    assert (r.status_code, r.json()["code"]) == (503, "idempotency_unavailable")
    assert s.state.runs["orders"] == 0
    s.expect_incidents(["idemd_refused"])


def test_when_the_key_is_moving(serve: ServeFn, moving: Moving) -> None:
    """C6: a key whose record is being moved to another store (503 store_moved) is not
    free: a retry is 503 with Retry-After and does not run the handler, even with
    fail_open, which would run a finished operation again."""
    s = serve(idemd_url=moving.daemon.url, retries=0, fail_open=True)
    key = fresh_key("moved-order")
    assert s.post(key=key, user="alice", body='{"amount":1}').status_code == 201
    assert s.state.runs["orders"] == 1
    moving.mark(idemd_key("alice", key))
    for _ in range(3):
        r = s.post(key=key, user="alice", body='{"amount":1}')
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "idempotency_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        assert "idempotent-replayed" not in r.headers
    assert s.state.runs["orders"] == 1
    s.expect_incidents(["idemd_refused"] * 3)
    assert [(type(e).__name__, getattr(e, "code", None)) for e in s.errors] == [
        ("Problem", "store_moved")
    ] * 3


def test_at_the_tenants_quota(serve: ServeFn, own_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """C7: a tenant at its quota of stored keys is refused new keys, 503
    idempotency_quota_exceeded with idemd's Retry-After and no run, even with fail_open."""
    token = "q" * 64
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tenants:\n  team: {max_records: 1}\ntokens:\n  - tenant: team\n    scopes: [use]\n"
        f"    sha256: {hashlib.sha256(token.encode()).hexdigest()}\n"
    )
    d = own_daemon("--auth-file", str(auth))
    capped = idemd.Client(d.url, token=token, retries=0)
    kept = fresh_key("kept")
    claim = capped.claim(kept)
    assert claim.token
    capped.complete(kept, claim.token, idemd.Response(status=200))
    with pytest.raises(idemd.QuotaExceeded) as refused:
        capped.claim(fresh_key("direct"))
    assert refused.value.status == 429
    s = serve(idemd_url=d.url, fail_open=True, token=token)
    r = s.post(key=fresh_key("over-quota"))
    assert (r.status_code, r.json()["code"]) == (503, "idempotency_quota_exceeded")
    assert int(r.headers["retry-after"]) >= 1
    assert s.state.runs["orders"] == 0
    s.expect_incidents(["quota_exceeded"])


def test_streaming(serve: ServeFn) -> None:
    """R11: each chunk reaches the client as the handler sends it; the whole answer is
    stored once it ends, and replayed whole."""
    s = serve()
    key = fresh_key("stream")
    headers = {"Idempotency-Key": key, "X-User": "user-1", "Content-Type": "text/plain"}
    with http.stream("POST", s.url + "/stream", content=b"go", headers=headers) as r:
        chunks = r.iter_raw()
        # The first chunk arrives while the handler still holds the second.
        assert next(chunks).startswith(b"first\n")
        s.state.stream_gate.set()
        rest = b"".join(chunks)
    assert rest in (b"second\n", b"")
    replay = s.post("/stream", body="go", key=key, content_type="text/plain")
    assert (replay.status_code, replay.content, s.incidents) == (200, b"first\nsecond\n", [])
    assert replay.headers["idempotent-replayed"] == "true"
    assert s.state.runs["stream"] == 1


def test_streaming_cut_short(serve: ServeFn) -> None:
    """R6 for a stream the client leaves before its end. Whether the handler gets to
    finish depends on the server (uvicorn lets it write on; werkzeug stops iterating once
    a write fails, which may take a chunk or two): a finished answer is stored whole, an
    unfinished one as 409 response_not_stored. Never a partial body, never a second run."""
    s = serve()
    key = fresh_key("stream-cut")
    headers = {"Idempotency-Key": key, "X-User": "user-1", "Content-Type": "text/plain"}
    with http.stream("POST", s.url + "/stream", content=b"go", headers=headers) as r:
        assert next(r.iter_raw()).startswith(b"first\n")
    s.state.stream_gate.set()

    def settled() -> bool:
        r = s.post("/stream", body="go", key=key, content_type="text/plain")
        return r.status_code != 409 or r.json()["code"] != "in_progress"

    wait_until("the cut stream to be settled", settled)
    replay = s.post("/stream", body="go", key=key, content_type="text/plain")
    assert replay.headers["idempotent-replayed"] == "true"
    if replay.status_code == 200:
        assert replay.content == b"first\nsecond\n"
        s.expect_incidents([])
    else:
        assert (replay.status_code, replay.json()["code"]) == (409, "response_not_stored")
        s.expect_incidents(["result_not_stored"])
    assert s.state.runs["stream"] == 1


def test_an_answer_too_large_to_store(serve: ServeFn) -> None:
    """R10: the client gets the whole answer; later requests get 409
    response_not_stored, and the handler does not run again."""
    s = serve(max_stored_bytes=1000)
    key = fresh_key("big")
    first = s.post("/big", key=key)
    assert (first.status_code, first.content) == (200, BIG)
    again = s.post("/big", key=key)
    assert (again.status_code, again.json()["code"]) == (409, "response_not_stored")
    assert again.headers["idempotent-replayed"] == "true"
    assert s.state.runs["big"] == 1
    s.expect_incidents(["result_not_stored"])


def test_an_answer_idemd_refuses_to_store(serve: ServeFn, own_daemon: Callable[..., Daemon]) -> None:
    """R10, the other half: the answer fits max_stored_bytes but not the daemon's
    --max-response-bytes; the client still gets it, and 409 response_not_stored is kept."""
    d = own_daemon("--max-response-bytes", "1000")
    s = serve(idemd_url=d.url, max_stored_bytes=1 << 20)
    key = fresh_key("refused-big")
    first = s.post("/big", key=key)
    assert (first.status_code, first.content) == (200, BIG)
    again = s.post("/big", key=key)
    assert (again.status_code, again.json()["code"]) == (409, "response_not_stored")
    assert s.state.runs["big"] == 1
    s.expect_incidents(["result_not_stored"])


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_a_large_answer_with_a_blob_store(
    serve: ServeFn, own_daemon: Callable[..., Daemon], sealed: bool
) -> None:
    """R10a: a daemon with a blob store keeps a 20 MiB answer, which later requests get
    back byte for byte, sealed or not, with the middleware's defaults; the handler ran
    once."""
    d = own_daemon("--blob-store", "file:")
    sealing = _sealing("mw-large") if sealed else None
    s = serve(idemd_url=d.url, sealing=sealing)
    key = fresh_key("large")
    first = s.post("/large", key=key)
    assert first.status_code == 201
    assert first.content == LARGE
    again = s.post("/large", key=key)
    assert again.status_code == 201, again.text[:300]
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["content-type"] == "application/octet-stream"
    assert again.content == LARGE
    # Through another client, past any cache: what idemd keeps.
    other = serve(idemd_url=d.url, sealing=sealing)
    third = other.post("/large", key=key)
    assert third.status_code == 201, third.text[:300]
    assert third.content == LARGE
    assert s.state.runs["large"] == 1
    assert other.state.runs["large"] == 0
    assert s.incidents == []


def test_a_large_answer_without_a_blob_store(serve: ServeFn) -> None:
    """R10a: without a blob store idemd refuses a 20 MiB answer (over its
    --max-response-bytes), which is response_not_stored."""
    s = serve()
    key = fresh_key("large-no-blobs")
    first = s.post("/large", key=key)
    assert first.status_code == 201
    assert first.content == LARGE
    wait_until("an incident", lambda: len(s.incidents) > 0)
    assert s.incidents == ["result_not_stored"], s.errors
    again = s.post("/large", key=key)
    assert (again.status_code, again.json()["code"]) == (409, "response_not_stored")
    assert s.state.runs["large"] == 1


def test_idemd_lost_while_the_handler_runs(serve: ServeFn, own_daemon: Callable[..., Daemon]) -> None:
    """R13: idemd goes away while the handler runs; the client still gets its answer and
    the incident says the result was not stored."""
    d = own_daemon()
    s = serve(idemd_url=d.url, retries=0)
    s.state.block = True
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(s.post, key=fresh_key("idemd-lost"))
        wait_until("the handler to run", lambda: s.state.runs["orders"] == 1)
        d.kill()
        s.state.gate.set()
        assert first.result().status_code == 201
    s.expect_incidents(["complete_failed"])


def test_lease_lost_while_the_handler_runs(serve: ServeFn, daemon: Daemon) -> None:
    """R12: the key is purged while the handler runs, so the next renewal finds the lease
    gone. ASGI cancels the handler and answers 409 lease_lost; WSGI cannot stop it, so it
    tells the handler through environ["idemd.lease"] and the handler's answer goes out.
    Either way nothing is stored and the incident is reported. The lease is long enough
    for the renewal to be answered well before its local deadline (test_lease_expired)."""
    s = serve(lease=1.0)
    key = fresh_key("lost")
    admin = idemd.Client(daemon.url)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(s.post, "/slow", key=key)
        wait_until("the handler to run", lambda: s.state.runs["slow"] == 1)
        admin.purge(idemd.middleware_key("user-1", key))
        r = first.result()
    if s.framework == "starlette":
        assert (r.status_code, r.json()["code"]) == (409, "lease_lost")
        assert r.headers["retry-after"] == "1"
    else:
        assert (r.status_code, r.content) == (201, b"too late")
    s.expect_incidents(["lease_lost"])
    with pytest.raises(idemd.NotFound):
        admin.lookup(idemd.middleware_key("user-1", key))


def test_lease_expired_while_the_handler_runs(serve: ServeFn, daemon: Daemon) -> None:
    """R12 with the link to idemd cut right after the claim: no renewal is answered, so
    the lease ends at its local deadline, as lost. ASGI cancels the handler and answers
    409 lease_lost; WSGI tells the handler through its lease and its answer goes out.
    Nothing is stored, the key is not released (idemd lets it run out), and the incident
    is lease_expired."""
    proxy = GateProxy(daemon.url, hold=(), cut_after=1)
    try:
        s = serve(idemd_url=proxy.url, retries=0, lease=0.3)
        key = fresh_key("expired")
        r = s.post("/slow", key=key)
        if s.framework == "starlette":
            assert (r.status_code, r.json()["code"]) == (409, "lease_lost")
            assert r.headers["retry-after"] == "1"
        else:
            assert (r.status_code, r.content) == (201, b"too late")
        s.expect_incidents(["lease_expired"])
        assert proxy.paths() == ["/v1/claim"]
        record = idemd.Client(daemon.url).lookup(idemd.middleware_key("user-1", key))
        assert (record.state, record.response) == ("pending", None)
    finally:
        proxy.close()


def _raw_post(server: _Uvicorn, path: str, key: str, body: bytes) -> socket.socket:
    """Sends user-1's POST of body with key on a connection of its own, which the caller
    closes to play a client that leaves; nothing of the answer is read."""
    conn = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    conn.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\nX-User: user-1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    return conn


@pytest.mark.parametrize("wait", [0, 30])
def test_asgi_client_gone_before_an_answer(daemon: Daemon, wait: int) -> None:
    """R5: the client goes away and the handler returns without answering: nothing ran to
    completion, so the key is released for the retry, never stored as an empty 200. With
    a wait, the middleware listened for the disconnect while it claimed: the handler still
    receives its body, then the disconnect, each once."""
    state = Orders()
    app = starlette_app(state)
    app.add_middleware(
        asgi.IdempotencyMiddleware, client=idemd.AsyncClient(daemon.url), scope=_asgi_user, wait=wait
    )
    server = _Uvicorn(app)
    key = fresh_key("gone")
    try:
        with _raw_post(server, "/quiet", key, b"{}"):
            wait_until("the handler to run", lambda: state.runs["quiet"] == 1)
        wait_until("the handler to see the client gone", state.quiet_done.is_set)
        assert state.quiet_heard == ["http.request", "http.disconnect"]
        admin = idemd.Client(daemon.url)
        wait_until(
            "the key to be released",
            lambda: admin.lookup(idemd.middleware_key("user-1", key)).state == "released",
        )
    finally:
        server.stop()


def _claim_waiters(d: Daemon) -> str:
    """idemd's gauge of claims waiting on a key."""
    for line in httpx.get(d.url + "/metrics").text.splitlines():
        if line.startswith("idemd_claim_waiters "):
            return line.split(" ", 1)[1].strip()
    pytest.fail("idemd's /metrics has no idemd_claim_waiters")


def test_asgi_wait_ends_when_the_client_leaves(own_daemon: Callable[..., Daemon]) -> None:
    """C3a: a duplicate waiting on the key stops waiting when its client leaves. Its call to
    idemd is given up, so idemd's waiter goes away at once rather than after the wait, and
    its handler never runs."""
    d = own_daemon()
    state = Orders()
    state.block = True
    # Longer than the test's deadlines: the first request ends only when the test says.
    state.hold_limit = scale(60)
    app = starlette_app(state)
    app.add_middleware(asgi.IdempotencyMiddleware, client=idemd.AsyncClient(d.url), scope=_asgi_user, wait=30)
    server = _Uvicorn(app)
    key = fresh_key("wait-gone")
    body = b'{"item":"book"}'
    headers = {"Idempotency-Key": key, "X-User": "user-1", "Content-Type": "application/json"}
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(http.post, server.url + "/orders", content=body, headers=headers)
            wait_until("the first request to run", lambda: state.runs["orders"] == 1)
            with _raw_post(server, "/orders", key, body):
                wait_until("idemd to see the duplicate wait", lambda: _claim_waiters(d) == "1")
            # Well within the 30 s wait: the wait must end because the client left, not
            # because it ran out.
            wait_until("idemd's waiter to go", lambda: _claim_waiters(d) == "0", deadline=20)
            assert state.runs["orders"] == 1
            state.gate.set()
            answer = first.result()
            assert answer.status_code == 201
            assert "idempotent-replayed" not in answer.headers
        record = idemd.Client(d.url).lookup(idemd.middleware_key("user-1", key))
        assert (record.state, record.attempt) == ("completed", 1)
        again = http.post(server.url + "/orders", content=body, headers=headers)
        assert again.status_code == 201
        assert again.headers["idempotent-replayed"] == "true"
        assert state.runs["orders"] == 1
    finally:
        state.gate.set()
        server.stop()


def test_a_record_it_cannot_replay(serve: ServeFn, daemon: Daemon) -> None:
    """P3: a finished record without an answer (not written by a middleware) is 502
    stored_response_invalid, never an empty success, and the handler does not run."""
    s = serve()
    key = fresh_key("invalid")
    digest = fingerprint("POST", b"/orders", b"", b"application/json", None, b'{"item":"book","qty":1}')
    c = idemd.Client(daemon.url)
    ikey = idemd.middleware_key("user-1", key)
    c.release(ikey, c.claim(ikey, fingerprint=digest).token, "fail")
    r = s.post(key=key)
    assert (r.status_code, r.json()["code"]) == (502, "stored_response_invalid")
    assert s.state.runs["orders"] == 0
    s.expect_incidents(["replay_invalid"])


def test_key_prefix(serve: ServeFn, daemon: Daemon) -> None:
    """key_prefix goes before the derived key: the handler's lease has the full key,
    which a lookup finds (and the key without the prefix is not there). The handler
    records a recovery point through its lease; a 500 releases the key for a retry, whose
    lease starts from that point, and the retry's result is stored under the full key."""
    s = serve(key_prefix="orders/v1/")
    key = fresh_key("prefix")
    full = "orders/v1/" + idemd.middleware_key("user-1", key)
    s.state.resume_status = 500
    first = s.post("/resume", key=key)
    assert first.status_code == 500
    assert first.json() == {"key": full, "resumed": None}
    admin = idemd.Client(daemon.url)
    released = admin.lookup(full)
    assert released.state == "released"
    assert released.recovery_point is not None
    assert (released.recovery_point.name, released.recovery_point.attempt) == ("handled", 1)
    assert released.recovery_point.data == f"by {s.framework}".encode()
    with pytest.raises(idemd.NotFound):
        admin.lookup(idemd.middleware_key("user-1", key))

    s.state.resume_status = 201
    again = s.post("/resume", key=key)
    assert again.status_code == 201
    assert again.json() == {"key": full, "resumed": ["handled", f"by {s.framework}"]}
    done = admin.lookup(full)
    assert (done.state, done.attempt, done.recovery_point) == ("completed", 2, None)
    replay = s.post("/resume", key=key)
    assert (replay.status_code, replay.content) == (201, again.content)
    assert replay.headers["idempotent-replayed"] == "true"
    assert s.state.runs["resume"] == 2


def _sealing(*ids: str) -> idemd.Sealing:
    keys = [idemd.SealKey(i, hashlib.sha256(i.encode()).digest()) for i in ids]
    return idemd.Sealing("default", idemd.KeyRing(keys))


def _raw_response(url: str, ikey: str) -> dict[str, Any]:
    record = http.get(f"{url}/v1/records/{ikey}").json()
    response: dict[str, Any] = record["response"]
    return response


def test_sealed_answers(serve: ServeFn, daemon: Daemon) -> None:
    """R1 and P1 under sealing: the answer is stored as an envelope, only its status
    readable, and replays identically. P5: a service whose ring lacks its key, and one
    without a ring, answer 502 stored_response_unsealable with the incident
    replay_unsealable carrying the error, and the handler does not run."""
    s = serve(sealing=_sealing("mw-old"))
    key = fresh_key("sealed")
    first = s.post(key=key)
    assert first.status_code == 201
    raw = _raw_response(daemon.url, idemd.middleware_key("user-1", key))
    assert set(raw) == {"status", "sealed"}
    assert raw["status"] == 201
    envelope = base64.b64decode(raw["sealed"])
    assert envelope.startswith(b"\xc1\x02\x06mw-old")
    assert first.content not in envelope
    assert b"/orders/1" not in envelope

    rotated = serve(sealing=_sealing("mw-new", "mw-old"))
    for service in (s, rotated):
        again = service.post(key=key)
        assert (again.status_code, again.content) == (201, first.content)
        assert again.headers["location"] == first.headers["location"]
        assert again.headers["content-type"] == first.headers["content-type"]
        assert again.headers["idempotent-replayed"] == "true"
        assert "set-cookie" not in again.headers
    assert s.state.runs["orders"] == 1
    assert rotated.state.runs["orders"] == 0

    for ring in (_sealing("mw-new"), None):
        other = serve(sealing=ring)
        refused = other.post(key=key)
        assert refused.status_code == 502
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["code"] == "stored_response_unsealable"
        assert "idempotent-replayed" not in refused.headers
        other.expect_incidents(["replay_unsealable"])
        err = other.errors[0]
        assert isinstance(err, idemd.Unsealable)
        assert (err.reason, err.key_id) == ("unknown_key", "mw-old")
        assert other.state.runs["orders"] == 0
    assert s.incidents == []


def test_sealed_not_stored_and_recovery_points(serve: ServeFn, daemon: Daemon) -> None:
    """R10 under sealing: the 409 response_not_stored the middleware stores is sealed
    too, and replays. The handler's recovery point is sealed in idemd, and the retry
    after a 500 starts from it opened."""
    s = serve(sealing=_sealing("mw-old"), max_stored_bytes=1000)
    key = fresh_key("sealed-big")
    assert s.post("/big", key=key).status_code == 200
    raw = _raw_response(daemon.url, idemd.middleware_key("user-1", key))
    assert set(raw) == {"status", "sealed"}
    assert raw["status"] == 409
    assert b"response_not_stored" not in base64.b64decode(raw["sealed"])
    again = s.post("/big", key=key)
    assert (again.status_code, again.json()["code"]) == (409, "response_not_stored")
    assert again.headers["idempotent-replayed"] == "true"
    s.expect_incidents(["result_not_stored"])

    key = fresh_key("sealed-resume")
    ikey = idemd.middleware_key("user-1", key)
    s.state.resume_status = 500
    assert s.post("/resume", key=key).status_code == 500
    point = http.get(f"{daemon.url}/v1/records/{ikey}").json()["recovery_point"]
    data = base64.b64decode(point["data"])
    assert point["name"] == "handled"
    assert data.startswith(b"\xc1\x02\x06mw-old")
    assert s.framework.encode() not in data
    # A service whose ring lacks the point's key runs nothing from it, and gives the
    # key back for a retry.
    other = serve(sealing=_sealing("mw-new"))
    refused = other.post("/resume", key=key)
    assert (refused.status_code, refused.json()["code"]) == (502, "stored_response_unsealable")
    other.expect_incidents(["replay_unsealable"])
    assert other.state.runs["resume"] == 0
    assert http.get(f"{daemon.url}/v1/records/{ikey}").json()["state"] == "released"
    s.state.resume_status = 201
    resumed = s.post("/resume", key=key)
    assert resumed.json() == {"key": ikey, "resumed": ["handled", f"by {s.framework}"]}
    assert set(_raw_response(daemon.url, ikey)) == {"status", "sealed"}
    # Django's views count in the state of the service started last.
    assert s.state.runs + other.state.runs == {"big": 1, "resume": 2}


def test_key_prefix_is_checked_at_construction(daemon: Daemon) -> None:
    """A prefix that would make every key longer than idemd's 255 bytes, or that is not
    UTF-8, would answer 503 to every request: both middlewares refuse it."""

    def app(environ: Any, start_response: Any) -> list[bytes]:
        return []

    async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
        pass

    fits = "p" * (255 - len(idemd.middleware_key("s", "k")))
    assert len(fits) == 172
    for prefix, error in (
        (fits + "p", "173 bytes"),
        ("é" * 87, "174 bytes"),
        ("orders/\udc80", "UTF-8"),
    ):
        with pytest.raises(ValueError, match=error):
            wsgi.IdempotencyMiddleware(app, idemd.Client(daemon.url), scope=_wsgi_user, key_prefix=prefix)
        with pytest.raises(ValueError, match=error):
            asgi.IdempotencyMiddleware(
                asgi_app, idemd.AsyncClient(daemon.url), scope=_asgi_user, key_prefix=prefix
            )
    assert wsgi.IdempotencyMiddleware(app, idemd.Client(daemon.url), scope=_wsgi_user, key_prefix=fits)
    assert asgi.IdempotencyMiddleware(
        asgi_app, idemd.AsyncClient(daemon.url), scope=_asgi_user, key_prefix="é" * 86
    )


def test_construction_needs_a_scope_and_refuses_unsafe_headers(daemon: Daemon) -> None:
    """M5 and P2: no default scope; cookies and framing headers are never stored."""

    def app(environ: Any, start_response: Any) -> list[bytes]:
        return []

    client = idemd.Client(daemon.url)
    with pytest.raises(TypeError):
        wsgi.IdempotencyMiddleware(app, client)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        wsgi.IdempotencyMiddleware(app, client, scope=None)  # type: ignore[arg-type]
    for header in ("Set-Cookie", "transfer-encoding", "Content-Length"):
        with pytest.raises(ValueError, match=header.lower()):
            wsgi.IdempotencyMiddleware(app, client, scope=_wsgi_user, stored_headers=["content-type", header])
    # A wait or lease idemd refuses on every claim would answer 503 to every request.
    with pytest.raises(ValueError, match="wait"):
        wsgi.IdempotencyMiddleware(app, client, scope=_wsgi_user, wait=30.5)
    with pytest.raises(ValueError, match="wait"):
        wsgi.IdempotencyMiddleware(app, client, scope=_wsgi_user, wait=-1)
    for lease in (0.05, 3600.5):
        with pytest.raises(ValueError, match="lease"):
            wsgi.IdempotencyMiddleware(app, client, scope=_wsgi_user, lease=lease)
    wsgi.IdempotencyMiddleware(app, client, scope=_wsgi_user, wait=30, lease=3600)
    wsgi.IdempotencyMiddleware(app, client, scope=_wsgi_user, wait=0, lease=0.1)


def test_fastapi(daemon: Daemon) -> None:
    """FastAPI is Starlette: the same middleware, added the same way."""
    from fastapi import FastAPI

    runs = 0
    app = FastAPI()

    @app.post("/charges", status_code=201)
    async def charge(body: dict[str, int]) -> dict[str, int]:
        nonlocal runs
        runs += 1
        return {"charged": body["amount"], "run": runs}

    app.add_middleware(asgi.IdempotencyMiddleware, client=idemd.AsyncClient(daemon.url), scope=_asgi_user)
    server = _Uvicorn(app)
    try:
        key = fresh_key("fastapi")
        headers = {"Idempotency-Key": key, "X-User": "u"}
        answers = [http.post(server.url + "/charges", json={"amount": 5}, headers=headers) for _ in range(2)]
    finally:
        server.stop()
    assert [a.status_code for a in answers] == [201, 201]
    assert json.loads(answers[1].content) == {"charged": 5, "run": 1}
    assert answers[1].headers["idempotent-replayed"] == "true"
    assert runs == 1
