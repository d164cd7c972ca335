"""The HTTP transports under the generated client: they resend a request whose answer
never came, bound each call's time, and turn an answer that is not idemd's (an error
page from a proxy) into a Problem before the generated code tries to parse it.

Every idemd call is safe to resend: a resent claim carries the same claim secret and
gets the same lease back, a resent complete or release is answered like the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import cast

import httpcore
import httpx

from ._errors import problem_class

#: Extra seconds a call may take beyond the client's timeout: a claim's wait.
_extra_time: contextvars.ContextVar[float] = contextvars.ContextVar("idemd_extra_time", default=0.0)


@contextlib.contextmanager
def extra_time(seconds: float) -> Iterator[None]:
    """Give the calls made inside the block ``seconds`` more than the client's timeout."""
    token = _extra_time.set(seconds)
    try:
        yield
    finally:
        _extra_time.reset(token)


class _Policy:
    def __init__(self, timeout: float | None, retries: int, backoff: float) -> None:
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def deadline(self) -> float | None:
        if self.timeout is None:
            return None
        return time.monotonic() + self.timeout + _extra_time.get()

    def prepare(self, request: httpx.Request, deadline: float | None) -> bool:
        """Bound the next attempt by what is left of the call's time; False when none is."""
        if deadline is None:
            request.extensions["timeout"] = {"connect": None, "read": None, "write": None, "pool": None}
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        request.extensions["timeout"] = {"connect": left, "read": left, "write": left, "pool": left}
        return True

    def pause(self, attempt: int, deadline: float | None) -> float | None:
        """How long to wait before resending, or None to give up."""
        if attempt >= self.retries:
            return None
        pause = self.backoff * (1 << attempt)
        if deadline is not None and time.monotonic() + pause >= deadline:
            return None
        return pause


# The connections to idemd: at most 32, and all of them kept when idle, for 90 s as the
# Go SDK does (idemd closes a connection idle for 2 minutes). httpx keeps 20 idle for 5 s
# by default and closes the others as they come back; while it does, httpcore 1.0.9 can
# close a connection its pool has just handed to another request
# (encode/httpcore#1110), which then fails with EBADF or waits out its timeout. With no
# connection ever surplus, the pool closes none for that reason (for the one other way it
# can close a connection in use, see _GuardedConnection). The bound
# stays small because each pass of httpcore's pool costs the square of its connections
# (64 kept idle nearly tripled the client's CPU per call with 64 threads and no
# batching); with batching, the default, a client rarely has more than two requests in
# flight.
LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=32, keepalive_expiry=90.0)


# httpcore's pool asks each connection on every pass whether it has expired, and an idle
# HTTP/1.1 connection whose socket is readable counts as closed by the server. The check
# reads the connection's state and then its socket, without the lock that a request
# takes to make the connection active: a pass on one thread can read "idle", lose the
# CPU while another thread's request goes out on that connection and its answer comes
# back, then find the answer readable and close the connection under the request, which
# fails with EBADF or waits out its timeout. The guard below counts the requests on a
# connection and checks expiry under the same lock, so that a connection in use is
# never taken for expired, and a request cannot start while the check runs.


class _GuardedConnection(httpcore.ConnectionInterface):
    def __init__(self, inner: httpcore.ConnectionInterface) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._requests = 0

    def handle_request(self, request: httpcore.Request) -> httpcore.Response:
        with self._lock:
            self._requests += 1
        try:
            response = self._inner.handle_request(request)
        except BaseException:
            self._finished()
            raise
        response.stream = _ClosingStream(cast("Iterable[bytes]", response.stream), self._finished)
        return response

    def _finished(self) -> None:
        with self._lock:
            self._requests -= 1

    def has_expired(self) -> bool:
        with self._lock:
            return self._requests == 0 and self._inner.has_expired()

    def is_idle(self) -> bool:
        with self._lock:
            return self._requests == 0 and self._inner.is_idle()

    def close(self) -> None:
        self._inner.close()

    def info(self) -> str:
        return self._inner.info()

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return self._inner.can_handle_request(origin)

    def is_available(self) -> bool:
        return self._inner.is_available()

    def is_closed(self) -> bool:
        return self._inner.is_closed()


class _ClosingStream:
    """A response body that calls ``done`` once, when it is closed."""

    def __init__(self, inner: Iterable[bytes], done: Callable[[], None]) -> None:
        self._inner = inner
        self._done: Callable[[], None] | None = done

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    def close(self) -> None:
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


class _GuardedPool(httpcore.ConnectionPool):
    def create_connection(self, origin: httpcore.Origin) -> httpcore.ConnectionInterface:
        return _GuardedConnection(super().create_connection(origin))


def _http_transport(ssl_context: ssl.SSLContext) -> httpx.HTTPTransport:
    """httpx's transport over a pool of guarded connections, with LIMITS."""
    transport = httpx.HTTPTransport(verify=ssl_context, limits=LIMITS)
    transport._pool = _GuardedPool(
        ssl_context=ssl_context,
        max_connections=LIMITS.max_connections,
        max_keepalive_connections=LIMITS.max_keepalive_connections,
        keepalive_expiry=LIMITS.keepalive_expiry,
    )
    return transport


class RetryTransport(httpx.BaseTransport):
    def __init__(
        self, timeout: float | None, retries: int, backoff: float, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        # The TLS settings are made once (loading the CA bundle takes some 20 ms) and
        # shared with the transports renewed in forked children.
        self._ssl_context = ssl_context or httpx.create_ssl_context()
        self._inner = _http_transport(self._ssl_context)
        self._policy = _Policy(timeout, retries, backoff)

    def renewed(self) -> RetryTransport:
        """A transport with the same settings and a connection pool of its own."""
        p = self._policy
        return RetryTransport(p.timeout, p.retries, p.backoff, self._ssl_context)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = self._policy.deadline()
        attempt = 0
        while True:
            if not self._policy.prepare(request, deadline):
                raise httpx.TimeoutException("idemd call timed out", request=request)
            try:
                response = self._inner.handle_request(request)
                response.read()
                check_answer(response)
                return response
            except httpx.TransportError:
                pause = self._policy.pause(attempt, deadline)
                if pause is None:
                    raise
            time.sleep(pause)
            attempt += 1

    def close(self) -> None:
        self._inner.close()


class AsyncRetryTransport(httpx.AsyncBaseTransport):
    def __init__(
        self, timeout: float | None, retries: int, backoff: float, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._ssl_context = ssl_context or httpx.create_ssl_context()
        self._inner = httpx.AsyncHTTPTransport(verify=self._ssl_context, limits=LIMITS)
        self._policy = _Policy(timeout, retries, backoff)

    def renewed(self) -> AsyncRetryTransport:
        """See :meth:`RetryTransport.renewed`."""
        p = self._policy
        return AsyncRetryTransport(p.timeout, p.retries, p.backoff, self._ssl_context)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        deadline = self._policy.deadline()
        attempt = 0
        while True:
            if not self._policy.prepare(request, deadline):
                raise httpx.TimeoutException("idemd call timed out", request=request)
            try:
                response = await self._inner.handle_async_request(request)
                await response.aread()
                check_answer(response)
                return response
            except httpx.TransportError:
                pause = self._policy.pause(attempt, deadline)
                if pause is None:
                    raise
            await asyncio.sleep(pause)
            attempt += 1

    async def aclose(self) -> None:
        await self._inner.aclose()


_PROBLEM_MEMBERS = ("type", "title", "status", "code")


def check_answer(response: httpx.Response) -> None:
    """Raise a Problem for an error answer that is not idemd's problem+json, which the
    generated code could not parse."""
    if response.status_code < 300:
        return
    media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type in ("application/problem+json", "application/json"):
        try:
            doc = json.loads(response.content)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and all(m in doc for m in _PROBLEM_MEMBERS):
            return
    status = response.status_code
    detail = response.content[:200].decode("utf-8", "replace").strip()
    cls = problem_class(status, "")
    raise cls(status, title=response.reason_phrase, detail=detail, retry_after=retry_after_header(response))


def retry_after_header(response: httpx.Response) -> float | None:
    try:
        return float(int(response.headers.get("retry-after", "")))
    except ValueError:
        return None
