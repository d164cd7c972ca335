"""ASGI middleware (Starlette, FastAPI, any ASGI 3 app) that makes handlers idempotent
by the ``Idempotency-Key`` request header, as docs/middleware.md describes row by row.

    app.add_middleware(IdempotencyMiddleware, client=idemd.AsyncClient(url), scope=user_of)

A streaming answer (``StreamingResponse``, server-sent events) reaches the client chunk
by chunk as the handler sends it; a copy is kept, up to ``max_stored_bytes``, and stored
when the handler sends its last chunk (R11). An answer that never ends (the handler
returns or is stopped before its last chunk, e.g. because the client went away) ran
but cannot be replayed whole: ``409 response_not_stored`` is stored for it, as for an
answer too large to store (R10). So is an exception raised after the status of a
result went out (R15); after a 5xx, or before any status, the key is released (R4).
With a client given sealing (:class:`idemd.Sealing`), every answer the middleware
stores is sealed, ``409 response_not_stored`` included, and every replay opened; a
stored answer that does not open is answered ``502 stored_response_unsealable`` with
the incident ``replay_unsealable``, and the handler does not run (P5).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from ._async_client import AsyncClient
from ._current import leased
from ._errors import IdemdError, LeaseLost, Problem, Unavailable, Unsealable
from ._lease import AsyncKeeper, AsyncLease, claim_waited, local_deadline
from ._middleware import (
    NOT_STORED,
    Answer,
    Incident,
    InvalidKey,
    Options,
    Recorder,
    cut_short,
    default_store_status,
    fingerprint,
    finish,
    lease_incident,
    parse_key,
    problem,
    refusal,
    replay,
    sent_raw,
    taken_over,
    unsealable,
)
from ._types import Claim

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Unreadable(Exception):
    pass


class _TooLarge(Exception):
    pass


class IdempotencyMiddleware:
    """Wraps an ASGI app. ``scope`` is required: a function of the ASGI scope returning
    whose request it is (the authenticated user or account), so that a replay never
    crosses users; it runs after any authentication middleware placed outside this one.
    The other options are those of docs/middleware.md; times are in seconds.

    ``key_prefix`` goes before every idemd key the middleware claims, which is then
    ``key_prefix + idemd.middleware_key(scope, key)`` (the derivation is unchanged), so
    that the keys of one service or route share a prefix that a :class:`idemd.Completer`
    selects them by; the handler's lease has the full key. A prefix that would make a
    key longer than idemd's 255 bytes (over 172 bytes), or that is not valid UTF-8, is
    refused here."""

    def __init__(
        self,
        app: ASGIApp,
        client: AsyncClient,
        *,
        scope: Callable[[Scope], str | None],
        methods: Iterable[str] = ("POST", "PATCH"),
        require_key: bool = False,
        wait: float = 0.0,
        lease: float = 30.0,
        stored_headers: Iterable[str] = ("content-type", "location"),
        max_body: int = 10 << 20,
        max_stored_bytes: int = 64 << 20,
        store_status: Callable[[int], bool] = default_store_status,
        fail_open: bool = False,
        on_incident: Callable[[Scope, Incident], None] | None = None,
        key_prefix: str = "",
    ) -> None:
        self.app = app
        self.client = client
        self.options: Options[Scope] = Options(
            scope=scope,
            methods=methods,
            require_key=require_key,
            wait=wait,
            lease=lease,
            stored_headers=stored_headers,
            max_body=max_body,
            max_stored_bytes=max_stored_bytes,
            store_status=store_status,
            fail_open=fail_open,
            on_incident=on_incident,
            key_prefix=key_prefix,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        o = self.options
        if scope["type"] != "http" or not o.applies_to(scope["method"]):  # M1
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
        try:
            key = parse_key([v for k, v in headers if k.lower() == b"idempotency-key"])
        except InvalidKey as err:  # M3
            await _answer(send, problem(400, "invalid_idempotency_key", "Invalid Idempotency-Key", str(err)))
            return
        if key is None:  # M2
            if o.require_key:
                await _answer(
                    send,
                    problem(
                        400,
                        "missing_idempotency_key",
                        "Idempotency-Key is required",
                        "this endpoint needs an Idempotency-Key header",
                    ),
                )
                return
            await self.app(scope, receive, send)
            return
        principal = o.scope_of(scope)
        if principal is None:  # M4
            o.incident(scope, "scope_missing")
            await _answer(
                send,
                problem(
                    500,
                    "idempotency_scope_missing",
                    "Request scope unknown",
                    "the service could not tell whose request this is",
                ),
            )
            return
        try:
            body = await _read_body(receive, o.max_body)
        except _TooLarge:  # M6
            await _answer(
                send,
                problem(
                    413, "payload_too_large", "Request body too large", f"the body is over {o.max_body} bytes"
                ),
            )
            return
        except _Unreadable:  # M7
            await _answer(
                send, problem(400, "unreadable_body", "Unreadable request body", "the client went away")
            )
            return

        replayed = _Replaying(body, receive)
        try:
            await self._claim_and_run(scope, replayed, send, principal, key, body, headers)
        finally:
            replayed.close()

    async def _claim_and_run(
        self,
        scope: Scope,
        replayed_receive: _Replaying,
        send: Send,
        principal: str,
        key: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        o = self.options
        ikey = o.idemd_key(principal, key)
        digest = fingerprint(
            scope["method"],
            scope.get("raw_path") or scope["path"].encode("utf-8"),
            scope.get("query_string", b""),
            _first(headers, b"content-type"),
            _first(headers, b"content-encoding"),
            body,
        )
        sent = time.monotonic()
        try:
            claim = await self._claim(ikey, digest, replayed_receive)
        except Unsealable as err:  # P5
            if replayed_receive.gone():
                return
            await _answer(send, unsealable())
            o.incident(scope, "replay_unsealable", ikey, err)
            return
        except IdemdError as err:  # C3-C6
            if replayed_receive.gone():  # C3a: nobody is there to answer
                return
            answer, kind = refusal(err, o.fail_open)
            if answer is None:
                await self.app(scope, replayed_receive, send)
                o.incident(scope, "fail_open", ikey, err)
                return
            await _answer(send, answer)
            if kind:
                o.incident(scope, kind, ikey, err)
            return
        if claim is None:  # C3a: the client left while the claim waited; nothing ran
            return
        if claim.outcome != "acquired":  # C2
            answer = replay(claim.response)
            await _answer(send, answer)
            if answer.status == 502:
                o.incident(scope, "replay_invalid", ikey)
            return
        held = AsyncLease(
            ikey,
            claim.token,
            claim.attempt,
            claim.recovered,
            deadline=local_deadline(sent, o.lease),
            recovery_point=claim.recovery_point,
            client=self.client,
        )
        if replayed_receive.gone():
            # The client left as the lease came: nothing ran, and a retry may run it.
            await self._release(scope, held)
            return
        keeper = self.client._keeper(held, o.lease)
        if claim_waited(sent, o.lease):
            # The claim waited: the lease is renewed before the handler starts, so that it
            # does not start with its deadline near (R12 when it is lost meanwhile).
            lost = await keeper.renew_now()
            if lost is not None:
                await _answer(send, taken_over())
                o.incident(scope, lease_incident(lost), held.key, lost)
                return
        await self._run(scope, replayed_receive, send, held, keeper)

    async def _claim(self, ikey: str, digest: str, replayed: _Replaying) -> Claim | None:
        """Claims the key; None when the client left while the claim waited (C3a).

        A claim that waits may wait up to 30 s, so the middleware listens for the client's
        disconnect meanwhile, and gives the claim up when it comes: idemd's waiter goes
        with it. A lease idemd granted as the client left never arrives and runs out,
        which keeps at most once. A claim that does not wait is answered at once; it
        outlives its client, and a lease it took is given back."""
        o = self.options
        claiming = self.client.claim(ikey, fingerprint=digest, lease=o.lease, wait=o.wait or None)
        if not o.wait:
            return await claiming
        claim = asyncio.ensure_future(claiming)
        either: list[asyncio.Future[Any]] = [claim, replayed.listen()]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            claim.cancel()  # this request is being cancelled itself (a server shutting down)
            raise
        if claim.done() or not replayed.gone():
            return await claim
        claim.cancel()
        # Wait for the cancelled call to end, so that its connection to idemd is closed.
        await asyncio.wait([claim])
        if not claim.cancelled():
            claim.exception()  # the answer came too late for anyone: retrieved, dropped
        return None

    async def _run(
        self, scope: Scope, receive: Receive, send: Send, held: AsyncLease, keeper: AsyncKeeper
    ) -> None:
        o = self.options
        recorder = Recorder(o)
        started = settled = False

        async def settle(ended: bool) -> None:
            """Store the answer or free the key, once: before the last body message goes
            out, so that a client that has the whole answer finds the key settled. It runs
            as a task of its own, so that a cancellation of the handler (a framework's
            cancel scope when the client goes away) cannot leave it half done."""
            nonlocal settled
            settled = True
            lost = keeper.end()

            async def settling() -> None:
                await keeper.stopped()
                if lost is not None:  # R12
                    o.incident(scope, lease_incident(lost), held.key, lost)
                    return
                await self._settle(scope, held, recorder, ended)

            await asyncio.shield(asyncio.ensure_future(settling()))

        async def recording_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                recorder.start(
                    int(message["status"]),
                    ((k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", ())),
                )
            elif message["type"] == "http.response.body" and not settled:
                recorder.write(bytes(message.get("body", b"")))
                if not message.get("more_body", False):
                    await settle(ended=True)
            await send(message)

        # L1: the handler finds its lease in the request's state (Starlette's
        # request.state.idemd_lease) and with idemd.current_lease().
        state = scope.setdefault("state", {})
        state["idemd_lease"] = held
        with leased(held):  # the task takes a copy of the context, with the lease
            work = asyncio.ensure_future(self.app(scope, receive, recording_send))
        keeper.start(work)
        try:
            await work
        except BaseException as err:
            if settled:
                raise
            settled = True
            lost = keeper.end()
            await asyncio.shield(asyncio.ensure_future(keeper.stopped()))
            current = asyncio.current_task()
            cancelled_by_lease = isinstance(err, asyncio.CancelledError) and not (
                current and current.cancelling()
            )
            if lost is not None:  # R12: the handler was cancelled
                o.incident(scope, lease_incident(lost), held.key, lost)
                if not cancelled_by_lease:
                    raise
                if not started:
                    await _answer(send, taken_over())
                return
            if cut_short(recorder, o, started) == "not_stored":  # R15
                await self._not_stored(scope, held)
            else:
                await self._release(scope, held)  # R4
            raise
        if settled:
            return
        # The handler returned without finishing its answer: it wrote nothing (R5), or
        # it stopped in the middle of a stream.
        await settle(ended=False)
        if held.lost.is_set() and not started:
            await _answer(send, taken_over())

    async def _settle(self, scope: Scope, held: AsyncLease, recorder: Recorder, ended: bool) -> None:
        o = self.options
        decision = finish(recorder, o)
        if decision == "complete" and not ended:
            decision = "not_stored"
        if decision == "release":  # R2, R3, R5
            await self._release(scope, held)
            return
        if decision == "complete":  # R1
            response = recorder.response()
            try:
                await asyncio.shield(self.client.complete(held.key, held.token, response))
                return
            except LeaseLost as err:
                o.incident(scope, "lease_lost", held.key, err)
                return
            except Unavailable as err:
                if not sent_raw(response, self.client.sealing):  # R13
                    o.incident(scope, "complete_failed", held.key, err)
                    return
            except Problem as err:
                if err.status not in (400, 413):  # R13
                    o.incident(scope, "complete_failed", held.key, err)
                    return
            except IdemdError as err:
                o.incident(scope, "complete_failed", held.key, err)
                return
        await self._not_stored(scope, held)  # R10

    async def _not_stored(self, scope: Scope, held: AsyncLease) -> None:
        """The handler ran but its answer cannot be replayed; say so to later requests."""
        try:
            await asyncio.shield(self.client.release(held.key, held.token, "fail", NOT_STORED))
        except IdemdError as err:
            self.options.incident(scope, "release_failed", held.key, err)
        self.options.incident(scope, "result_not_stored", held.key)

    async def _release(self, scope: Scope, held: AsyncLease) -> None:
        try:
            await asyncio.shield(self.client.release(held.key, held.token, "retry"))
        except IdemdError as err:  # R14
            self.options.incident(scope, "release_failed", held.key, err)


def _first(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


async def _read_body(receive: Receive, limit: int) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Unreadable
        body += message.get("body", b"")
        if len(body) > limit:
            raise _TooLarge
        if not message.get("more_body", False):
            return bytes(body)


class _Replaying:
    """The receive handed to the app: the body already read, then what the client sends
    next (a disconnect). While a claim waits, the middleware listens for that message
    itself (see listen); the app then gets the very message the middleware heard, or
    waits for it, so that none is lost or heard twice."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: bytes | None = body
        self._receive = receive
        self._pending: asyncio.Future[Message] | None = None

    def listen(self) -> asyncio.Future[Message]:
        """The client's next message, received once, for the middleware and the app."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._receive())
        return self._pending

    def gone(self) -> bool:
        """Whether the client was heard to disconnect."""
        p = self._pending
        return (
            p is not None
            and p.done()
            and not p.cancelled()
            and p.exception() is None
            and p.result()["type"] == "http.disconnect"
        )

    async def __call__(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        if self._pending is not None:
            # Shielded: an app that stops waiting (a cancel scope) leaves the message here
            # for its next receive.
            message = await asyncio.shield(self._pending)
            self._pending = None
            return message
        return await self._receive()

    def close(self) -> None:
        """Stops listening once the request is done with."""
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()


async def _answer(send: Send, answer: Answer) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers],
        }
    )
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})
