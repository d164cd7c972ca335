"""The lease reaches the code idemd runs: run, once and the idempotent decorator hand it
to the function (and idemd.current_lease() gives it), and the middlewares to the handler
(docs/middleware.md, L1 and L2; docs/effects.md)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import Daemon, free_port, fresh_key
from proxy import GateProxy
from slowdown import scale
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response as StarletteResponse
from starlette.routing import Route
from test_middleware import _Uvicorn, _Werkzeug

import idemd
from idemd import asgi, wsgi


def fields(lease: idemd.Lease | idemd.AsyncLease | None) -> tuple[str, int, bool] | None:
    return None if lease is None else (lease.key, lease.attempt, lease.recovered)


def deadline_loop(what: str, seconds: float = 30.0) -> Iterator[None]:
    """Yields until the deadline passes, then fails the test."""
    end = time.monotonic() + scale(seconds)
    while time.monotonic() < end:
        yield
    pytest.fail(f"timed out: {what}")


def test_run_and_once_hand_the_lease(daemon: Daemon) -> None:
    c = idemd.Client(daemon.url)
    key = fresh_key("lease-run")
    seen: list[tuple[idemd.Lease, idemd.Lease | idemd.AsyncLease | None]] = []

    def fn(lease: idemd.Lease) -> idemd.Response:
        seen.append((lease, idemd.current_lease()))
        return idemd.Response(200)

    c.run(key, fn)
    assert idemd.current_lease() is None
    assert [(fields(lease), current is lease) for lease, current in seen] == [((key, 1, False), True)]

    key = fresh_key("lease-once")
    leases: list[idemd.Lease] = []

    def failing(lease: idemd.Lease) -> None:
        leases.append(lease)
        raise RuntimeError("transient")

    with pytest.raises(RuntimeError):
        c.once(key, failing)
    assert c.once(key, leases.append)
    assert [fields(lease) for lease in leases] == [(key, 1, False), (key, 2, False)]


def test_the_idempotent_decorator_finds_its_lease(daemon: Daemon) -> None:
    c = idemd.Client(daemon.url)
    order = fresh_key("order")

    @c.idempotent("charge:{order_id}")
    def charge(order_id: str) -> dict[str, Any]:
        lease = idemd.current_lease()
        assert lease is not None
        return {"key": lease.key, "attempt": lease.attempt, "recovered": lease.recovered}

    assert charge(order) == {"key": f"charge:{order}", "attempt": 1, "recovered": False}


def test_async_run_and_decorator_hand_the_lease(daemon: Daemon) -> None:
    async def main() -> None:
        c = idemd.AsyncClient(daemon.url)
        key = fresh_key("lease-async")
        seen: list[tuple[tuple[str, int, bool] | None, bool]] = []

        async def fn(lease: idemd.AsyncLease) -> idemd.Response:
            seen.append((fields(lease), idemd.current_lease() is lease))
            return idemd.Response(200)

        await c.run(key, fn)
        assert seen == [((key, 1, False), True)]
        assert idemd.current_lease() is None

        order = fresh_key("order")

        @c.idempotent("charge:{order_id}")
        async def charge(order_id: str) -> list[Any]:
            lease = idemd.current_lease()
            assert lease is not None
            return [lease.key, lease.attempt, lease.recovered]

        assert await charge(order) == [f"charge:{order}", 1, False]

    asyncio.run(main())


def test_taking_over_a_stalled_holder_is_the_next_attempt_recovered(
    daemon: Daemon, cut_proxy: GateProxy
) -> None:
    key = fresh_key("lease-recovered")
    stalled = idemd.Client(cut_proxy.url, retries=0)
    holding, wake = threading.Event(), threading.Event()
    first: list[idemd.Lease] = []

    def stall(lease: idemd.Lease) -> idemd.Response:
        first.append(lease)
        cut_proxy.cut = True
        holding.set()
        wake.wait(scale(30))
        return idemd.Response(200, body=b"late")

    with ThreadPoolExecutor(1) as pool:
        holder: Future[idemd.Result] = pool.submit(stalled.run, key, stall, lease=0.3)
        assert holding.wait(scale(30))
        second: list[idemd.Lease] = []

        def take(lease: idemd.Lease) -> idemd.Response:
            second.append(lease)
            return idemd.Response(200)

        c = idemd.Client(daemon.url)
        for _ in deadline_loop("the key to be taken over"):
            try:
                c.run(key, take)
                break
            except idemd.InProgress:
                continue
        assert [fields(lease) for lease in first + second] == [(key, 1, False), (key, 2, True)]
        # No renewal reached idemd: the stalled holder reckoned its lease lost by its own
        # clock, before idemd handed the key over.
        assert first[0].lost.is_set()
        wake.set()
        with pytest.raises(idemd.LeaseExpired):
            holder.result(scale(30))


def test_async_takeover_is_recovered(daemon: Daemon, cut_proxy: GateProxy) -> None:
    async def main() -> None:
        key = fresh_key("lease-async-recovered")
        stalled = idemd.AsyncClient(cut_proxy.url, retries=0)
        holding, wake = asyncio.Event(), asyncio.Event()
        first: list[idemd.AsyncLease] = []

        async def stall(lease: idemd.AsyncLease) -> idemd.Response:
            first.append(lease)
            cut_proxy.cut = True
            holding.set()
            await wake.wait()
            return idemd.Response(200)

        holder = asyncio.ensure_future(stalled.run(key, stall, lease=0.3))
        await asyncio.wait_for(holding.wait(), scale(30))
        c = idemd.AsyncClient(daemon.url)
        second: list[idemd.AsyncLease] = []

        async def take(lease: idemd.AsyncLease) -> idemd.Response:
            second.append(lease)
            return idemd.Response(200)

        for _ in deadline_loop("the key to be taken over"):
            try:
                await c.run(key, take)
                break
            except idemd.InProgress:
                continue
        assert [fields(lease) for lease in first + second] == [(key, 1, False), (key, 2, True)]
        # The holder was cancelled at its local deadline, before idemd handed the key over.
        assert first[0].lost.is_set()
        with pytest.raises(idemd.LeaseExpired):
            await asyncio.wait_for(holder, scale(30))

    asyncio.run(main())


# The middlewares: a handler that records the lease it finds, by both ways of asking.

Seen = list[tuple[tuple[str, int, bool] | None, bool]]


def starlette_lease_app(seen: Seen, hold: threading.Event | None) -> Starlette:
    async def orders(request: Request) -> StarletteResponse:
        lease = getattr(request.state, "idemd_lease", None)
        seen.append((fields(lease), idemd.current_lease() is lease))
        if hold is not None and len(seen) == 1:
            await asyncio.to_thread(hold.wait, 30)
        return StarletteResponse(b"{}", 201, media_type="application/json")

    return Starlette(routes=[Route("/orders", orders, methods=["POST", "GET"])])


def flask_lease_app(seen: Seen, hold: threading.Event | None) -> Any:
    import flask

    app = flask.Flask("leases")

    @app.route("/orders", methods=["POST", "GET"])
    def orders() -> Any:
        lease = flask.request.environ.get("idemd.lease")
        seen.append((fields(lease), idemd.current_lease() is lease))
        if hold is not None and len(seen) == 1:
            hold.wait(scale(30))
        return flask.Response(b"{}", 201, mimetype="application/json")

    return app


Start = Callable[..., str]


@pytest.fixture(params=["starlette", "flask"])
def lease_app(request: pytest.FixtureRequest) -> Iterator[Start]:
    """Starts the recording service behind the middleware of one kind; returns its URL."""
    servers: list[_Uvicorn | _Werkzeug] = []

    def start(idemd_url: str, seen: Seen, hold: threading.Event | None = None, **options: Any) -> str:
        server: _Uvicorn | _Werkzeug
        if request.param == "starlette":
            app = starlette_lease_app(seen, hold)
            app.add_middleware(
                asgi.IdempotencyMiddleware,
                client=idemd.AsyncClient(idemd_url, retries=0),
                scope=lambda scope: dict(scope["headers"]).get(b"x-user", b"").decode(),
                **options,
            )
            server = _Uvicorn(app)
        else:
            server = _Werkzeug(
                wsgi.IdempotencyMiddleware(
                    flask_lease_app(seen, hold),
                    idemd.Client(idemd_url, retries=0),
                    scope=lambda environ: environ.get("HTTP_X_USER", ""),
                    **options,
                )
            )
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def post(url: str, key: str | None, method: str = "POST") -> httpx.Response:
    headers = {"Content-Type": "application/json", "X-User": "user-1"}
    if key is not None:
        headers["Idempotency-Key"] = f'"{key}"'
    return httpx.request(method, url + "/orders", content=b"{}", headers=headers, timeout=scale(30))


def test_middleware_hands_the_handler_its_lease(daemon: Daemon, lease_app: Start) -> None:
    seen: Seen = []
    url = lease_app(daemon.url, seen)
    key = fresh_key("mw-lease")
    assert post(url, key).status_code == 201
    assert post(url, key).headers["idempotent-replayed"] == "true"
    assert post(url, None).status_code == 201
    assert post(url, key, "GET").status_code == 201
    ikey = idemd.middleware_key("user-1", key)
    assert seen == [((ikey, 1, False), True), (None, True), (None, True)]


def test_middleware_takeover_is_recovered(daemon: Daemon, cut_proxy: GateProxy, lease_app: Start) -> None:
    seen: Seen = []
    hold = threading.Event()
    stalled_url = lease_app(cut_proxy.url, seen, hold, lease=0.3)
    url = lease_app(daemon.url, seen)
    key = fresh_key("mw-recovered")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, stalled_url, key)
        for _ in deadline_loop("the first request to run"):
            if seen:
                break
            time.sleep(0.005)
        cut_proxy.cut = True
        for _ in deadline_loop("a retry to take the key over"):
            answer = post(url, key)
            if answer.status_code != 409:
                assert answer.status_code == 201
                break
        cut_proxy.cut = False
        hold.set()
        first.result(scale(30))
    ikey = idemd.middleware_key("user-1", key)
    assert seen == [((ikey, 1, False), True), ((ikey, 2, True), True)]


def test_middleware_fail_open_runs_without_a_lease(lease_app: Start) -> None:
    seen: Seen = []
    url = lease_app(f"http://127.0.0.1:{free_port()}", seen, fail_open=True)
    assert post(url, fresh_key("mw-open")).status_code == 201
    assert seen == [(None, True)]
