"""GateProxy: a loopback HTTP proxy in front of a real idemd that records every request
and holds chosen ones until the test opens them, so that a test can gather a client's
calls behind a request in flight without sleeping; or drops every request while cut,
so that a holder's renewals stop reaching idemd while its work goes on; or slows every
request down, as a distant or loaded idemd would."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus

import httpx
from slowdown import scale

#: How long a held request waits for its gate at most, so that a failing test ends.
HOLD_LIMIT = scale(60.0)

_HOP_BY_HOP = ("content-length", "content-encoding", "transfer-encoding", "connection", "date", "server")


@dataclass(frozen=True)
class Received:
    """A request the proxy received: its path, for a batch how many items it held, and
    when it came in on the time.monotonic() clock."""

    path: str
    items: int
    at: float = 0.0


class GateProxy:
    """Forwards to ``target``; the requests whose index (0 for the first) is in ``hold``
    wait until :meth:`open` lets them through. With ``batch_status``, the proxy answers
    POST /v1/batch with that status itself instead of forwarding it: 404 as a daemon from
    before the batch endpoint does, 413 as one with a smaller body limit. With
    ``cut_after``, the link is cut once that many requests have gone through, before the
    last of them is answered, so that no other request can follow it. ``delay`` is how
    long each request waits before it goes on to idemd, in seconds."""

    def __init__(
        self,
        target: str,
        hold: Iterable[int] = (0,),
        batch_status: int | None = None,
        cut_after: int | None = None,
        delay: float = 0.0,
    ) -> None:
        self.received: list[Received] = []
        #: While set, every request is dropped unanswered, as by a cut link.
        self.cut = False
        #: How many requests were dropped while the link was cut.
        self.dropped = 0
        self._cut_after = cut_after
        self._delay = delay
        self._target = target
        self._batch_status = batch_status
        self._lock = threading.Lock()
        self._gates = {index: threading.Event() for index in hold}
        self._upstream = httpx.Client(timeout=scale(30))
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The status line and headers go out in one write and the body in another:
            # with Nagle's algorithm the body would wait for the client's delayed ACK.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                proxy._forward(self)

            def do_POST(self) -> None:
                proxy._forward(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def open(self, index: int = 0) -> None:
        """Lets the request with this index through."""
        self._gates[index].set()

    def paths(self) -> list[str]:
        """The paths received, a batch written with its number of items."""
        with self._lock:
            return [f"{r.path} of {r.items}" if r.path == "/v1/batch" else r.path for r in self.received]

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def close(self) -> None:
        for gate in self._gates.values():
            gate.set()
        self._server.shutdown()
        self._server.server_close()
        self._upstream.close()

    def _forward(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        if self.cut:
            with self._lock:
                self.dropped += 1
            handler.close_connection = True
            return
        items = 0
        if handler.path == "/v1/batch":
            items = len(json.loads(body).get("items", []))
        with self._lock:
            index = len(self.received)
            self.received.append(Received(handler.path, items, time.monotonic()))
            if index + 1 == self._cut_after:
                self.cut = True
        gate = self._gates.get(index)
        if gate is not None and not gate.wait(HOLD_LIMIT):
            raise TimeoutError(f"request {index} was held for {HOLD_LIMIT} s")
        if self._batch_status is not None and handler.path == "/v1/batch":
            status = self._batch_status
            code = {404: "not_found", 413: "payload_too_large"}.get(status, "invalid_request")
            problem = {
                "type": f"urn:idemd:problem:{code}",
                "title": HTTPStatus(status).phrase,
                "status": status,
                "code": code,
            }
            self._answer(
                handler, status, {"Content-Type": "application/problem+json"}, json.dumps(problem).encode()
            )
            return
        if self._delay:
            time.sleep(self._delay)  # the latency the proxy plays, not a wait for anything
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", *_HOP_BY_HOP)}
        answer = self._upstream.request(
            handler.command, self._target + handler.path, content=body or None, headers=headers
        )
        out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
        self._answer(handler, answer.status_code, out, answer.content)

    @staticmethod
    def _answer(
        handler: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes
    ) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
