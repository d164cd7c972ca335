"""One small orders service written three times, for Starlette (ASGI), Flask and Django
(WSGI), each behind the idemd middleware of its kind. The tests drive all three over
real HTTP and expect the same answers from each."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
from slowdown import scale
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response as StarletteResponse
from starlette.responses import StreamingResponse
from starlette.routing import Route


class Orders:
    """What the handlers share with the test: how often each ran, and a gate that holds
    them until the test opens it (bounded, so that a test that forgets cannot hang)."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.block = False
        #: How long a held handler waits for the gate at most.
        self.hold_limit = scale(20.0)
        self.stream_gate = threading.Event()
        self.quiet_done = threading.Event()
        #: The types of the messages the quiet handler received, in order.
        self.quiet_heard: list[str] = []
        #: The status the resume handler answers with.
        self.resume_status = 201

    def run(self, path: str) -> int:
        with self.lock:
            self.runs[path] += 1
            return self.runs[path]

    def hold(self) -> None:
        if self.block:
            self.gate.wait(self.hold_limit)


def order(n: int, body: bytes, status: int) -> tuple[int, dict[str, str], bytes]:
    headers = {
        "Content-Type": "application/json",
        "Location": f"/orders/{n}",
        "Set-Cookie": "session=secret",
        "X-Not-Stored": "x",
    }
    return status, headers, json.dumps({"run": n, "request": body.decode("utf-8", "replace")}).encode()


BIG = b"x" * 4000
#: What /large answers: 20 MiB of random bytes, the same on every run.
LARGE = os.urandom(20 << 20)


def resumed(key: str, point: Any, status: int) -> tuple[int, dict[str, str], bytes]:
    """The answer of the resume handler: the lease's key and the recovery point its
    lease started from, which the test reads back."""
    body = {"key": key, "resumed": None if point is None else [point.name, point.data.decode()]}
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


def starlette_app(state: Orders) -> Starlette:
    async def orders(request: Request) -> StarletteResponse:
        n = state.run("orders")
        await anyio.to_thread.run_sync(state.hold)
        status, headers, body = order(n, await request.body(), int(request.query_params.get("status", 201)))
        return StarletteResponse(body, status, headers)

    async def boom(request: Request) -> StarletteResponse:
        if state.run("boom") == 1:
            raise RuntimeError("handler failed")
        return StarletteResponse(b"ok", 201)

    async def stream(request: Request) -> StreamingResponse:
        state.run("stream")

        async def chunks() -> Any:
            yield b"first\n"
            await anyio.to_thread.run_sync(state.stream_gate.wait, 20)
            yield b"second\n"

        return StreamingResponse(chunks(), media_type="text/plain")

    async def big(request: Request) -> StarletteResponse:
        state.run("big")
        return StarletteResponse(BIG, 200, media_type="text/plain")

    async def large(request: Request) -> StarletteResponse:
        state.run("large")
        return StarletteResponse(LARGE, 201, media_type="application/octet-stream")

    async def slow(request: Request) -> StarletteResponse:
        state.run("slow")
        await asyncio.sleep(scale(20))  # cancelled when the lease is lost
        return StarletteResponse(b"too late", 201)

    async def quiet(scope: Any, receive: Any, send: Any) -> None:
        """A handler that notices its client is gone and returns without answering."""
        state.run("quiet")
        while True:
            state.quiet_heard.append((await receive())["type"])
            if state.quiet_heard[-1] == "http.disconnect":
                break
        state.quiet_done.set()

    class Quiet:  # a class, so that Starlette routes to it as a plain ASGI app
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await quiet(scope, receive, send)

    async def resume(request: Request) -> StarletteResponse:
        """Records a recovery point under its lease and says where the lease started."""
        state.run("resume")
        lease = request.state.idemd_lease
        await lease.checkpoint("handled", b"by starlette")
        status, headers, body = resumed(lease.key, lease.recovery_point, state.resume_status)
        return StarletteResponse(body, status, headers)

    class LateBoom:
        """R15: raises after its status and part of its body went out."""

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            state.run("late-boom")
            status = int(dict(_query(scope)).get("status", "201"))
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": b'{"partial":', "more_body": True})
            raise RuntimeError("handler failed after its status")

    return Starlette(
        routes=[
            Route("/slow", slow, methods=["POST"]),
            Route("/quiet", Quiet(), methods=["POST"]),
            Route("/orders", orders, methods=["POST", "GET"]),
            Route("/boom", boom, methods=["POST"]),
            Route("/stream", stream, methods=["POST"]),
            Route("/big", big, methods=["POST"]),
            Route("/large", large, methods=["POST"]),
            Route("/late-boom", LateBoom(), methods=["POST"]),
            Route("/resume", resume, methods=["POST"]),
        ]
    )


def _query(scope: Any) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(scope.get("query_string", b"").decode("latin-1"))


def late_chunks(message: str) -> Iterator[bytes]:
    """R15: a WSGI answer whose first chunk went out before the handler raised."""
    yield b'{"partial":'
    raise RuntimeError(message)


def flask_app(state: Orders) -> Any:
    import flask

    app = flask.Flask("orders")

    @app.route("/orders", methods=["POST", "GET"])
    def orders() -> Any:
        n = state.run("orders")
        state.hold()
        status, headers, body = order(n, flask.request.get_data(), int(flask.request.args.get("status", 201)))
        return flask.Response(body, status, headers)

    @app.post("/boom")
    def boom() -> Any:
        if state.run("boom") == 1:
            raise RuntimeError("handler failed")
        return flask.Response(b"ok", 201)

    @app.post("/stream")
    def stream() -> Any:
        state.run("stream")

        def chunks() -> Iterator[bytes]:
            yield b"first\n"
            state.stream_gate.wait(scale(20))
            yield b"second\n"

        return flask.Response(chunks(), 200, mimetype="text/plain")

    @app.post("/big")
    def big() -> Any:
        state.run("big")
        return flask.Response(BIG, 200, mimetype="text/plain")

    @app.post("/large")
    def large() -> Any:
        state.run("large")
        return flask.Response(LARGE, 201, mimetype="application/octet-stream")

    @app.post("/late-boom")
    def late_boom() -> Any:
        state.run("late-boom")
        status = int(flask.request.args.get("status", 201))
        return flask.Response(
            late_chunks("handler failed after its status"), status, mimetype="application/json"
        )

    @app.post("/resume")
    def resume() -> Any:
        state.run("resume")
        lease = flask.request.environ["idemd.lease"]
        lease.checkpoint("handled", b"by flask")
        status, headers, body = resumed(lease.key, lease.recovery_point, state.resume_status)
        return flask.Response(body, status, headers)

    @app.post("/slow")
    def slow() -> Any:
        state.run("slow")
        flask.request.environ["idemd.lease"].lost.wait(scale(20))
        return flask.Response(b"too late", 201)

    return app.wsgi_app


_django_state: Orders | None = None


def django_app(state: Orders) -> Any:
    """Django, configured in code with this module's views and URLs."""
    global _django_state
    _django_state = state
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="test-only",
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
            DATABASES={},
            LOGGING_CONFIG=None,
        )
        django.setup()
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


def _dstate() -> Orders:
    assert _django_state is not None
    return _django_state


def _django_orders(request: Any) -> Any:
    from django.http import HttpResponse

    state = _dstate()
    n = state.run("orders")
    state.hold()
    status, headers, body = order(n, request.body, int(request.GET.get("status", 201)))
    return HttpResponse(body, status=status, headers=headers)


def _django_boom(request: Any) -> Any:
    from django.http import HttpResponse

    if _dstate().run("boom") == 1:
        raise RuntimeError("handler failed")
    return HttpResponse(b"ok", status=201)


def _django_stream(request: Any) -> Any:
    from django.http import StreamingHttpResponse

    state = _dstate()
    state.run("stream")

    def chunks() -> Iterator[bytes]:
        yield b"first\n"
        state.stream_gate.wait(scale(20))
        yield b"second\n"

    return StreamingHttpResponse(chunks(), content_type="text/plain")


def _django_late_boom(request: Any) -> Any:
    from django.http import StreamingHttpResponse

    _dstate().run("late-boom")
    status = int(request.GET.get("status", 201))
    return StreamingHttpResponse(
        late_chunks("handler failed after its status"), status=status, content_type="application/json"
    )


def _django_big(request: Any) -> Any:
    from django.http import HttpResponse

    _dstate().run("big")
    return HttpResponse(BIG, content_type="text/plain")


def _django_large(request: Any) -> Any:
    from django.http import HttpResponse

    _dstate().run("large")
    return HttpResponse(LARGE, status=201, content_type="application/octet-stream")


def _django_slow(request: Any) -> Any:
    from django.http import HttpResponse

    _dstate().run("slow")
    request.META["idemd.lease"].lost.wait(scale(20))
    return HttpResponse(b"too late", status=201)


def _django_resume(request: Any) -> Any:
    from django.http import HttpResponse

    state = _dstate()
    state.run("resume")
    lease = request.META["idemd.lease"]
    lease.checkpoint("handled", b"by django")
    status, headers, body = resumed(lease.key, lease.recovery_point, state.resume_status)
    return HttpResponse(body, status=status, headers=headers)


def _urls() -> list[Any]:
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    return [
        path("orders", csrf_exempt(_django_orders)),
        path("boom", csrf_exempt(_django_boom)),
        path("stream", csrf_exempt(_django_stream)),
        path("big", csrf_exempt(_django_big)),
        path("large", csrf_exempt(_django_large)),
        path("slow", csrf_exempt(_django_slow)),
        path("late-boom", csrf_exempt(_django_late_boom)),
        path("resume", csrf_exempt(_django_resume)),
    ]


def __getattr__(name: str) -> Any:
    # Django reads urlpatterns from ROOT_URLCONF once it is configured.
    if name == "urlpatterns":
        return _urls()
    raise AttributeError(name)
