"""WSGI middleware (Flask, Django, any PEP 3333 app) that makes handlers idempotent by
the ``Idempotency-Key`` request header, as docs/middleware.md describes row by row.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, idemd.Client(url), scope=user_of)

WSGI cannot stop a running handler: when the lease is lost (idemd answered that the key
was taken over, or no renewal was answered before the lease's local deadline),
``environ["idemd.lease"]`` (an :class:`idemd.Lease`) has its ``lost`` event set, and
nothing the handler returns afterwards is stored. A streaming answer (an iterable of
chunks) reaches the server chunk by chunk; a copy is kept, up to ``max_stored_bytes``,
and stored once the server has consumed the whole iterable (R11). An iterable the
server closes before its end (the client went away) ran but cannot be replayed whole:
``409 response_not_stored`` is stored for it, as for an answer too large to store (R10),
and for an exception raised after the first chunk of a result went out (R15).

WSGI servers join repeated header lines into one value with commas, so two
``Idempotency-Key`` lines arrive as one value that is refused like a list (M3).

WSGI tells an application nothing of its client before the answer is written, so a
duplicate whose claim waits (``wait``) keeps waiting, up to ``wait``, after its client
has gone; the ASGI middleware stops at the disconnect (C3a).
With a client given sealing (:class:`idemd.Sealing`), every answer the middleware
stores is sealed, ``409 response_not_stored`` included, and every replay opened; a
stored answer that does not open is answered ``502 stored_response_unsealable`` with
the incident ``replay_unsealable``, and the handler does not run (P5).
"""

from __future__ import annotations

import io
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from ._client import Client
from ._current import leased
from ._errors import IdemdError, LeaseLost, Problem, Unavailable, Unsealable
from ._lease import Keeper, Lease, claim_waited, local_deadline
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
from ._types import ReleaseMode, Response

ExcInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]


class IdempotencyMiddleware:
    """Wraps a WSGI app. ``scope`` is required: a function of the WSGI environ returning
    whose request it is (the authenticated user or account), so that a replay never
    crosses users. The other options are those of docs/middleware.md; times are in seconds.

    ``key_prefix`` goes before every idemd key the middleware claims, which is then
    ``key_prefix + idemd.middleware_key(scope, key)`` (the derivation is unchanged), so
    that the keys of one service or route share a prefix that a :class:`idemd.Completer`
    selects them by; the handler's lease has the full key. A prefix that would make a
    key longer than idemd's 255 bytes (over 172 bytes), or that is not valid UTF-8, is
    refused here."""

    def __init__(
        self,
        app: WSGIApplication,
        client: Client,
        *,
        scope: Callable[[WSGIEnvironment], str | None],
        methods: Iterable[str] = ("POST", "PATCH"),
        require_key: bool = False,
        wait: float = 0.0,
        lease: float = 30.0,
        stored_headers: Iterable[str] = ("content-type", "location"),
        max_body: int = 10 << 20,
        max_stored_bytes: int = 64 << 20,
        store_status: Callable[[int], bool] = default_store_status,
        fail_open: bool = False,
        on_incident: Callable[[WSGIEnvironment, Incident], None] | None = None,
        key_prefix: str = "",
    ) -> None:
        self.app = app
        self.client = client
        self.options: Options[WSGIEnvironment] = Options(
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

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        o = self.options
        method = environ["REQUEST_METHOD"]
        if not o.applies_to(method):  # M1
            return self.app(environ, start_response)
        field = environ.get("HTTP_IDEMPOTENCY_KEY")
        try:
            key = parse_key([] if field is None else [field.encode("latin-1")])
        except InvalidKey as err:  # M3
            return _answer(
                start_response, problem(400, "invalid_idempotency_key", "Invalid Idempotency-Key", str(err))
            )
        if key is None:  # M2
            if o.require_key:
                return _answer(
                    start_response,
                    problem(
                        400,
                        "missing_idempotency_key",
                        "Idempotency-Key is required",
                        "this endpoint needs an Idempotency-Key header",
                    ),
                )
            return self.app(environ, start_response)
        principal = o.scope_of(environ)
        if principal is None:  # M4
            o.incident(environ, "scope_missing")
            return _answer(
                start_response,
                problem(
                    500,
                    "idempotency_scope_missing",
                    "Request scope unknown",
                    "the service could not tell whose request this is",
                ),
            )
        try:
            body = _read_body(environ, o.max_body)
        except _TooLarge:  # M6
            return _answer(
                start_response,
                problem(
                    413, "payload_too_large", "Request body too large", f"the body is over {o.max_body} bytes"
                ),
            )
        except OSError as err:  # M7
            return _answer(
                start_response, problem(400, "unreadable_body", "Unreadable request body", str(err))
            )
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))

        ikey = o.idemd_key(principal, key)
        path, query = _target(environ)
        digest = fingerprint(
            method,
            path,
            query,
            _latin1(environ.get("CONTENT_TYPE")),
            _latin1(environ.get("HTTP_CONTENT_ENCODING")),
            body,
        )
        sent = time.monotonic()
        try:
            claim = self.client.claim(ikey, fingerprint=digest, lease=o.lease, wait=o.wait or None)
        except Unsealable as err:  # P5
            o.incident(environ, "replay_unsealable", ikey, err)
            return _answer(start_response, unsealable())
        except IdemdError as err:  # C3-C6
            answer, kind = refusal(err, o.fail_open)
            if answer is None:
                o.incident(environ, "fail_open", ikey, err)
                return self.app(environ, start_response)
            if kind:
                o.incident(environ, kind, ikey, err)
            return _answer(start_response, answer)
        if claim.outcome != "acquired":  # C2
            answer = replay(claim.response)
            if answer.status == 502:
                o.incident(environ, "replay_invalid", ikey)
            return _answer(start_response, answer)
        held = Lease(
            ikey,
            claim.token,
            claim.attempt,
            claim.recovered,
            deadline=local_deadline(sent, o.lease),
            recovery_point=claim.recovery_point,
            client=self.client,
        )
        keeper = self.client._keeper(held, o.lease)
        if claim_waited(sent, o.lease):
            # The claim waited: the lease is renewed before the handler starts, so that it
            # does not start with its deadline near (R12 when it is lost meanwhile).
            lost = keeper.renew_now()
            if lost is not None:
                o.incident(environ, lease_incident(lost), ikey, lost)
                return _answer(start_response, taken_over())
        return _Leased(self, environ, start_response, held, keeper)


class _TooLarge(Exception):
    pass


def _latin1(value: str | None) -> bytes | None:
    return None if value is None else value.encode("latin-1")


def _read_body(environ: WSGIEnvironment, limit: int) -> bytes:
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH") or ""
    if length.isdigit():
        if int(length) > limit:
            raise _TooLarge
        body: bytes = stream.read(int(length))
        if len(body) < int(length):
            raise OSError("the body ended early")
        return body
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and no end marker: PEP 3333 says there is no body
    body = stream.read(limit + 1)
    if len(body) > limit:
        raise _TooLarge
    return body


def _target(environ: WSGIEnvironment) -> tuple[bytes, bytes]:
    """The path and the query as sent: REQUEST_URI or RAW_URI where the server gives one,
    else SCRIPT_NAME and PATH_INFO percent-encoded again."""
    uri = environ.get("REQUEST_URI") or environ.get("RAW_URI")
    if uri:
        raw = uri.encode("latin-1")
        if not raw.startswith(b"/"):  # absolute-form: drop the scheme and authority
            raw = b"/" + raw.split(b"://", 1)[-1].partition(b"/")[2]
        path, _, query = raw.partition(b"?")
        return path, query
    # PEP 3333 gives the decoded path's bytes as latin-1 characters.
    decoded = (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1")
    path = urllib.parse.quote(decoded, safe="/;=,:@!$&'()*+~")
    return path.encode("ascii"), environ.get("QUERY_STRING", "").encode("latin-1")


def _answer(start_response: StartResponse, answer: Answer) -> list[bytes]:
    start_response(f"{answer.status} {_reason(answer.status)}", answer.headers)
    return [answer.body]


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _Leased:
    """The app's answer, run under the lease: passed through as the server iterates it,
    recorded, and stored (or the key released) once the server closes it."""

    def __init__(
        self,
        mw: IdempotencyMiddleware,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        held: Lease,
        keeper: Keeper,
    ) -> None:
        self._mw = mw
        self._environ = environ
        self._held = held
        self._recorder = Recorder(mw.options)
        self._started = False
        self._ended = False
        self._length: int | None = None
        self._written = 0
        self._finished = False
        self._sent = False  # whether the status went out to the client
        self._keeper = keeper
        keeper.start()
        environ["idemd.lease"] = held  # L1
        self._start_response = start_response
        try:
            with leased(held):
                self._result = mw.app(environ, self._recording_start_response)
        except BaseException:
            self._fail()
            raise

    def _recording_start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None
    ) -> Callable[[bytes], object]:
        self._started = True
        self._recorder = Recorder(self._mw.options)  # a later call (with exc_info) replaces the answer
        length = next((v for k, v in headers if k.lower() == "content-length"), "")
        self._length = int(length) if length.isdigit() else None
        self._recorder.start(int(status.split(" ", 1)[0]), headers)
        write = self._start_response(status, headers, exc_info)

        def recording_write(chunk: bytes) -> object:
            self._sent = True
            self._recorder.write(chunk)
            return write(chunk)

        return recording_write

    def __iter__(self) -> Iterator[bytes]:
        # The key is settled before the client can have the whole answer: before the
        # chunk that completes a Content-Length, or before the iterable's end, after
        # which the server writes the last chunk of a chunked answer.
        try:
            for chunk in self._result:
                self._recorder.write(chunk)
                self._written += len(chunk)
                if self._length is not None and self._written >= self._length:
                    self._ended = True
                    self._finish()
                self._sent = True
                yield chunk
            self._ended = True
            self._finish()
        except GeneratorExit:
            raise
        except BaseException:
            self._fail()
            raise

    def close(self) -> None:
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        except BaseException:
            self._fail()
            raise
        self._finish()

    def _halt(self) -> bool:
        """Stop renewing; True when the lease was lost meanwhile (R12)."""
        lost = self._keeper.stop()
        if lost is not None:
            self._mw.options.incident(self._environ, lease_incident(lost), self._held.key, lost)
            return True
        return False

    def _fail(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._halt():
            return
        if cut_short(self._recorder, self._mw.options, self._sent) == "not_stored":  # R15
            self._not_stored()
        else:
            self._release("retry", None)  # R4

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._halt():
            return
        decision = finish(self._recorder, self._mw.options)
        if decision == "complete" and not self._ended:
            decision = "not_stored"
        if decision == "release":  # R2, R3, R5
            self._release("retry", None)
            return
        o, held = self._mw.options, self._held
        if decision == "complete":  # R1
            response = self._recorder.response()
            try:
                self._mw.client.complete(held.key, held.token, response)
                return
            except LeaseLost as err:
                o.incident(self._environ, "lease_lost", held.key, err)
                return
            except Unavailable as err:
                if not sent_raw(response, self._mw.client.sealing):  # R13
                    o.incident(self._environ, "complete_failed", held.key, err)
                    return
            except Problem as err:
                if err.status not in (400, 413):  # R13
                    o.incident(self._environ, "complete_failed", held.key, err)
                    return
            except IdemdError as err:
                o.incident(self._environ, "complete_failed", held.key, err)
                return
        self._not_stored()  # R10

    def _not_stored(self) -> None:
        """The handler ran but its answer cannot be replayed; say so to later requests."""
        self._release("fail", NOT_STORED)
        self._mw.options.incident(self._environ, "result_not_stored", self._held.key)

    def _release(self, mode: ReleaseMode, response: Response | None) -> None:
        try:
            self._mw.client.release(self._held.key, self._held.token, mode, response)
        except IdemdError as err:  # R14
            self._mw.options.incident(self._environ, "release_failed", self._held.key, err)
