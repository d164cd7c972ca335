"""The README's "From Python" snippets, run as they are written against a real idemd."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import httpx
from conftest import Daemon
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from test_middleware import _Uvicorn

import idemd
from idemd.asgi import IdempotencyMiddleware

README = Path(__file__).resolve().parents[3] / "README.md"


def snippets() -> list[str]:
    text = README.read_text()
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(found) == 3, "the README's From Python section changed: update this test"
    return found


def test_readme_snippets(daemon: Daemon) -> None:
    middleware, run, once = (s.replace("http://idemd.internal:8080", daemon.url) for s in snippets())
    effects: list[str] = []

    async def orders(request: Request) -> JSONResponse:
        effects.append("order")
        return JSONResponse({"id": 42}, 201)

    class Message:
        def topic(self) -> str:
            return "orders"

        def partition(self) -> int:
            return 3

        def offset(self) -> int:
            return 1042

    def send_welcome(lease: idemd.Lease) -> idemd.Response:
        effects.append("email")
        return idemd.Response(202, body=b"queued")

    def charge_card(order_id: str, cents: int) -> str:
        effects.append(f"charge {order_id} {cents}")
        return "ch_1"

    namespace: dict[str, Any] = {
        "idemd": idemd,
        "os": os,
        "IdempotencyMiddleware": IdempotencyMiddleware,
        "app": Starlette(routes=[Route("/orders", orders, methods=["POST"])]),
        "send_welcome": send_welcome,
        "charge_card": charge_card,
        "msg": Message(),
        "handle": lambda msg: effects.append(f"message {msg.offset()}"),
    }

    exec(run, namespace)
    exec(run, namespace)
    assert namespace["result"].replayed
    assert namespace["result"].response == idemd.Response(202, body=b"queued")
    assert namespace["charge"]("o-1", 500) == {"charge": "ch_1"}
    assert namespace["charge"]("o-1", 500) == {"charge": "ch_1"}
    exec(once, namespace)
    exec(once, namespace)
    assert effects == ["email", "charge o-1 500", "message 1042"]

    exec(middleware, namespace)
    app = namespace["app"]

    class User:
        identity = "user-42"

    class Authenticate:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            scope["user"] = User()
            await self.app(scope, receive, send)

    app.add_middleware(Authenticate)
    server = _Uvicorn(app)
    try:
        headers = {"Idempotency-Key": "readme-order-1"}
        answers = [
            httpx.post(server.url + "/orders", json={"item": "book"}, headers=headers) for _ in range(2)
        ]
    finally:
        server.stop()
    assert [a.status_code for a in answers] == [201, 201]
    assert answers[1].headers["idempotent-replayed"] == "true"
    assert effects.count("order") == 1
