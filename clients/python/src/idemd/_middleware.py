"""What the ASGI and the WSGI middleware share: the Idempotency-Key header, the scope and
the idemd key, the fingerprint, the options, and the decisions of docs/middleware.md,
whose row numbers (M1, C3, R10, ...) the comments cite."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import rfc8785

from ._errors import IdemdError, LeaseExpired, LeaseLost, Unavailable
from ._seal import Sealing
from ._types import Response
from ._wire import RAW_RESULT_BYTES, stored_bytes

#: Every key the middleware claims begins with this; the service's own keys must not.
KEY_PREFIX = "idempotency-key:v1:"

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~:/0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_MAX_KEY = 255
_MAX_DEPTH = 128

#: Names never stored nor replayed: a cookie belongs to the first caller's session,
#: hop-by-hop and framing headers describe one connection (P2).
NEVER_STORED = frozenset(
    {
        "set-cookie",
        "set-cookie2",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "idempotent-replayed",
    }
)


class InvalidKey(ValueError):
    """The Idempotency-Key header cannot be read (M3); the message says why."""


def parse_key(field_lines: list[bytes]) -> str | None:
    """The key from the request's Idempotency-Key field lines, None when there are none.

    The value is an RFC 8941 String; a bare token is accepted as the same key. Raises
    InvalidKey for anything else, for parameters, and for more than one field line.
    """
    if not field_lines:
        return None
    if len(field_lines) > 1:
        raise InvalidKey("more than one Idempotency-Key field line")
    value = field_lines[0].strip(b" \t")
    if not value:
        raise InvalidKey("the Idempotency-Key is empty")
    if value.startswith(b'"'):
        key = _sf_string(value)
    else:
        bad = next((b for b in value if b not in _TOKEN), None)
        if bad is not None:
            raise InvalidKey(f"byte 0x{bad:02x} is not allowed in an unquoted key; quote the key")
        key = value
    if not 1 <= len(key) <= _MAX_KEY:
        raise InvalidKey(f"the key is {len(key)} bytes; it must be 1 to {_MAX_KEY}")
    return key.decode("ascii")


def _sf_string(value: bytes) -> bytes:
    out = bytearray()
    i = 1
    while i < len(value):
        c = value[i]
        if c == 0x5C:  # backslash
            if i + 1 >= len(value) or value[i + 1] not in b'"\\':
                raise InvalidKey('a backslash in a quoted key may only escape " or \\')
            out.append(value[i + 1])
            i += 2
            continue
        if c == 0x22:  # the closing quote
            if i != len(value) - 1:
                raise InvalidKey("nothing may follow the quoted key (parameters are not allowed)")
            return bytes(out)
        if not 0x20 <= c <= 0x7E:
            raise InvalidKey(f"byte 0x{c:02x} is not allowed in a quoted key")
        out.append(c)
        i += 1
    raise InvalidKey("the quoted key has no closing quote")


def _prefixed(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(8, "big") + p for p in parts)


def idemd_key(scope: str, key: str) -> str:
    """The key the middleware claims for ``key`` in ``scope``: hashed together, so that a
    replay never crosses scopes and a header never names the service's own keys."""
    digest = hashlib.sha256(_prefixed(scope.encode("utf-8"), key.encode("utf-8"))).hexdigest()
    return KEY_PREFIX + digest


#: The length of every derived key: KEY_PREFIX and a SHA-256 digest in hex.
DERIVED_KEY_BYTES = len(KEY_PREFIX) + 64


def check_key_prefix(prefix: str) -> None:
    """Refuses a key prefix that would make every idemd key the middleware claims one
    idemd refuses (over 255 bytes, or not UTF-8), which would answer 503 to every
    request."""
    if not isinstance(prefix, str):
        raise TypeError("key_prefix is a str")
    try:
        size = len(prefix.encode("utf-8"))
    except UnicodeError as err:
        raise ValueError("key_prefix is not valid UTF-8") from err
    if size + DERIVED_KEY_BYTES > _MAX_KEY:
        raise ValueError(
            f"key_prefix is {size} bytes; at most {_MAX_KEY - DERIVED_KEY_BYTES} fit before the "
            f"{DERIVED_KEY_BYTES} bytes of the derived key"
        )


def media_type(content_type: bytes | None) -> bytes:
    if content_type is None:
        return b""
    return content_type.split(b";", 1)[0].strip(b" \t").lower()


def _is_json(media: bytes) -> bool:
    return media == b"application/json" or media.endswith(b"+json")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate member names")
    return obj


def _depth(value: Any) -> int:
    """The nesting depth of arrays and objects, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d + 1)
        stack.extend((child, d + 1) for child in v)
    return deepest


def hashed_body(media: bytes, content_encoding: bytes | None, body: bytes) -> tuple[bytes, bool]:
    """The bytes the fingerprint hashes for the body, and whether they are its RFC 8785
    canonical form (a JSON body that is I-JSON) rather than the body as received."""
    encoding = (content_encoding or b"").strip(b" \t").lower()
    if not body or not _is_json(media) or encoding not in (b"", b"identity"):
        return body, False
    try:
        value = json.loads(
            body.decode("utf-8"),
            parse_constant=_refuse_constant,
            parse_int=float,
            object_pairs_hook=_no_duplicates,
        )
        if _depth(value) > _MAX_DEPTH:
            return body, False
        return rfc8785.dumps(value), True
    except (ValueError, RecursionError, rfc8785.CanonicalizationError, UnicodeError):
        return body, False


def fingerprint(
    method: str,
    path: bytes,
    query: bytes,
    content_type: bytes | None,
    content_encoding: bytes | None,
    body: bytes,
) -> str:
    """The digest the middleware claims with: method, path and query as sent, media type,
    and the body (canonical JSON where it is I-JSON), each length-prefixed."""
    media = media_type(content_type)
    hashed, _ = hashed_body(media, content_encoding, body)
    digest = hashlib.sha256(_prefixed(method.encode("ascii"), path, query, media, hashed)).hexdigest()
    return "sha256:" + digest


IncidentKind = Literal[
    "unavailable",
    "fail_open",
    "idemd_refused",
    "quota_exceeded",
    "scope_missing",
    "result_not_stored",
    "complete_failed",
    "release_failed",
    "lease_lost",
    "lease_expired",
    "replay_invalid",
    "replay_unsealable",
]


@dataclass(frozen=True)
class Incident:
    """A case where the middleware could not do what it promised, or could not protect a
    request; ``kind`` is stable, meant for a metric label."""

    kind: IncidentKind
    idemd_key: str = ""
    error: BaseException | None = None


def lease_incident(lost: LeaseLost) -> IncidentKind:
    """The incident for a lease lost while the handler ran (R12): ``lease_expired`` when
    no renewal was answered before the lease's local deadline (idemd unreachable),
    ``lease_lost`` when idemd answered that the key was taken over."""
    return "lease_expired" if isinstance(lost, LeaseExpired) else "lease_lost"


def default_store_status(status: int) -> bool:
    """Results are 2xx, 3xx and 402; other 4xx mean the operation did not run (R1, R2)."""
    return 200 <= status <= 399 or status == 402


R = TypeVar("R")


@dataclass
class Options(Generic[R]):
    """The middleware's options (docs/middleware.md, *Options*); R is the request type
    handed to ``scope`` and ``on_incident`` (an ASGI scope, a WSGI environ)."""

    scope: Callable[[R], str | None]
    methods: Iterable[str] = ("POST", "PATCH")
    require_key: bool = False
    wait: float = 0.0
    lease: float = 30.0
    stored_headers: Iterable[str] = ("content-type", "location")
    max_body: int = 10 << 20
    max_stored_bytes: int = 64 << 20
    store_status: Callable[[int], bool] = default_store_status
    fail_open: bool = False
    on_incident: Callable[[R, Incident], None] | None = None
    key_prefix: str = ""
    _stored: frozenset[str] = field(init=False, default=frozenset())
    _methods: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        if not callable(self.scope):
            raise TypeError(
                "scope is required: a function of the request naming whose request it is "
                "(the authenticated user or account); pass a constant only if answers are not private"
            )
        stored = frozenset(h.lower() for h in self.stored_headers)
        refused = stored & NEVER_STORED
        if refused:
            raise ValueError(f"these headers are never stored: {', '.join(sorted(refused))}")
        self._stored = stored
        self._methods = frozenset(m.upper() for m in self.methods)
        # idemd refuses every claim outside the contract's limits: such a middleware
        # would answer 503 to every request.
        if not 0 <= self.wait <= 30:
            raise ValueError("wait is at most 30 seconds")
        if not 0.1 <= self.lease <= 3600:
            raise ValueError("lease is 0.1 to 3600 seconds")
        check_key_prefix(self.key_prefix)

    def idemd_key(self, scope: str, key: str) -> str:
        """The key claimed for ``key`` in ``scope``: the key prefix, then the derived key."""
        return self.key_prefix + idemd_key(scope, key)

    def applies_to(self, method: str) -> bool:
        return method.upper() in self._methods

    def stores(self, name: str) -> bool:
        return name.lower() in self._stored

    def incident(
        self, request: R, kind: IncidentKind, key: str = "", error: BaseException | None = None
    ) -> None:
        if self.on_incident is None:
            return
        # A hook that fails must not change the answer.
        with contextlib.suppress(Exception):
            self.on_incident(request, Incident(kind, key, error))

    def scope_of(self, request: R) -> str | None:
        """The request's scope, or None when the function gives nothing usable (M4)."""
        try:
            scope = self.scope(request)
        except Exception:
            return None
        if not isinstance(scope, str) or not scope:
            return None
        try:
            scope.encode("utf-8")
        except UnicodeError:
            return None
        return scope


@dataclass(frozen=True)
class Answer:
    """An answer the middleware writes itself."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def problem(status: int, code: str, title: str, detail: str, retry_after: float | None = None) -> Answer:
    headers = [("content-type", "application/problem+json")]
    if retry_after is not None:
        headers.append(("retry-after", str(max(1, math.ceil(retry_after)))))
    body = json.dumps(
        {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    ).encode()
    headers.append(("content-length", str(len(body))))
    return Answer(status, headers, body)


def taken_over() -> Answer:
    """The answer when the lease was lost before the handler wrote anything (R12)."""
    return problem(409, "lease_lost", "Request taken over", "the lease was lost", 1)


NOT_STORED = Response(
    409,
    {"content-type": ["application/problem+json"]},
    json.dumps(
        {
            "type": "about:blank",
            "title": "Response not stored",
            "status": 409,
            "detail": "the request with this Idempotency-Key was processed, but its response could not be "
            "kept; do not send it again",
            "code": "response_not_stored",
        }
    ).encode(),
)


def replay(stored: Response | None) -> Answer:
    """The answer for a stored response (P1-P3)."""
    if stored is None or not 200 <= stored.status <= 599:
        return problem(
            502,
            "stored_response_invalid",
            "Stored response cannot be replayed",
            "the answer stored for this Idempotency-Key cannot be replayed",
        )
    headers = [
        (name.lower(), value)
        for name, values in stored.headers.items()
        if name.lower() not in NEVER_STORED
        for value in values
    ]
    headers.append(("idempotent-replayed", "true"))
    headers.append(("content-length", str(len(stored.body))))
    return Answer(stored.status, headers, stored.body)


def unsealable() -> Answer:
    """The answer when the stored answer does not open (P5): the operation ran, so the
    handler must not run again, and an envelope is nothing the client can use."""
    return problem(
        502,
        "stored_response_unsealable",
        "Stored response cannot be opened",
        "the answer stored for this Idempotency-Key is sealed with a key this service does not hold, "
        "or does not open",
    )


def refusal(err: IdemdError, fail_open: bool) -> tuple[Answer | None, IncidentKind | None]:
    """What to answer for a claim that did not acquire (C3-C7): an answer, or None to run
    the handler unprotected (fail-open), and the incident to report."""
    from ._errors import FingerprintMismatch, InProgress, Problem, QuotaExceeded

    if isinstance(err, InProgress):
        return problem(
            409,
            "in_progress",
            "Request in progress",
            "a request with this Idempotency-Key is being processed",
            err.retry_after or 1,
        ), None
    if isinstance(err, FingerprintMismatch):
        return problem(
            422,
            "fingerprint_mismatch",
            "Idempotency-Key reused",
            "this Idempotency-Key was used with a different request",
        ), None
    retry_after = err.retry_after if isinstance(err, Problem) and err.retry_after else 1
    if isinstance(err, QuotaExceeded):
        # C7: the tenant is at its quota of stored keys; an answer, never failed open.
        return problem(
            503,
            "idempotency_quota_exceeded",
            "Idempotency quota exceeded",
            "the request was not run: the service keeps as many Idempotency-Keys as idemd allows it "
            "until some expire",
            retry_after,
        ), "quota_exceeded"
    if isinstance(err, Unavailable):
        if fail_open:
            return None, "fail_open"
        kind: IncidentKind = "unavailable"
    else:
        kind = "idemd_refused"
    return problem(
        503,
        "idempotency_unavailable",
        "Idempotency service unavailable",
        "the request was not run: its Idempotency-Key could not be checked",
        retry_after,
    ), kind


class Recorder:
    """Keeps a copy of the answer as it passes through: the final status (1xx ignored,
    R8), the stored headers, and the body up to the limit (R10)."""

    def __init__(self, options: Options[Any]) -> None:
        self._options = options
        self.status: int | None = None
        self.headers: dict[str, list[str]] = {}
        self.body = bytearray()
        self.size = 0
        self.too_large = False

    def start(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        if status < 200:
            return
        self.status = status
        for name, value in headers:
            lower = name.lower()
            if self._options.stores(lower):
                self.headers.setdefault(lower, []).append(value)
                self._count(len(lower) + len(value))

    def write(self, chunk: bytes) -> None:
        if self.too_large or not chunk:
            return
        self._count(len(chunk))
        if not self.too_large:
            self.body += chunk

    def _count(self, n: int) -> None:
        self.size += n
        if self.size > self._options.max_stored_bytes:
            self.too_large = True
            self.body = bytearray()

    def response(self) -> Response:
        return Response(self.status or 200, self.headers, bytes(self.body))


Finish = Literal["complete", "release", "not_stored"]


def finish(recorder: Recorder, options: Options[Any]) -> Finish:
    """What to do with the key once the handler has ended without an exception (R1-R3,
    R5, R6, R10): a handler that wrote no status did no work (R5)."""
    status = recorder.status
    if status is None or status >= 500:
        return "release"
    if not options.store_status(status):
        return "release"
    if recorder.too_large:
        return "not_stored"
    return "complete"


def cut_short(recorder: Recorder, options: Options[Any], status_sent: bool) -> Finish:
    """What to do with the key once the handler has raised (R4, R15). Before its status
    went out nothing was answered, and a retry may run it. After a status to store, the
    work started and part of a success reached the client: running it again could do it
    twice, and the part written is no answer to replay."""
    if status_sent and finish(recorder, options) != "release":
        return "not_stored"
    return "release"


def sent_raw(response: Response, sealing: Sealing | None) -> bool:
    """Whether the client sends ``response`` as raw bytes (what is stored of it, its
    body or its sealed envelope, over RAW_RESULT_BYTES). A
    daemon without a blob store refuses such a body over its --max-response-bytes with
    413 before reading it and closes the connection, which the client may then see as a
    transport failure rather than the 413. A large result whose upload fails so is
    response_not_stored (R10a) rather than left claimed (R13): the handler ran, and a
    retry after the lease ran out would run it again."""
    return stored_bytes(response, sealing) > RAW_RESULT_BYTES
