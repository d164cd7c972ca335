"""The exceptions the client raises, one class per outcome a caller branches on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._types import Response


class IdemdError(Exception):
    """Base of every exception this package raises."""


class Problem(IdemdError):
    """An RFC 9457 problem answered by idemd, or, with an empty code, an error page from
    something in front of it (a proxy, a load balancer).

    Codes the client does not know stay plain ``Problem``s: branch on ``status`` then.
    """

    def __init__(
        self,
        status: int,
        code: str = "",
        title: str = "",
        detail: str = "",
        type: str = "about:blank",
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.type = type
        #: Seconds after which trying again makes sense (in progress, unavailable,
        #: rate limited), or None.
        self.retry_after = retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        msg = f"idemd: {self.status} {self.title}".rstrip()
        if self.code:
            msg += f" ({self.code})"
        if self.detail:
            msg += f": {self.detail}"
        return msg


class InProgress(Problem):
    """Another caller holds a live lease on the key; ``retry_after`` says when it runs out."""


class FingerprintMismatch(Problem):
    """The key was first claimed with a different fingerprint (another payload)."""


class LeaseLost(Problem):
    """The lease is no longer held: it ran out and someone else took the key over, or
    the record was purged."""


class LeaseExpired(LeaseLost):
    """The lease ran out by the holder's own clock: no renewal was answered before its
    local deadline (idemd could not be reached), so idemd may have let another caller
    take the key over. Handled as the :class:`LeaseLost` it is; the class tells it apart
    from a lease_lost that idemd answered. Its status is 0, as no answer came, and its
    cause is the last renewal's failure, if one failed."""


class NotFound(Problem):
    """There is no record for the key."""


class PayloadTooLarge(Problem):
    """idemd refused a request for its size: a recovery point's data over the daemon's
    ``--max-recovery-point-bytes``, or a body over its limit. Nothing was recorded."""


class QuotaExceeded(Problem):
    """idemd refused a new key: the tenant keeps its quota of idemd's store, or more than
    its share of a store that is nearly full (status 429, code quota_exceeded). Keys
    already stored still replay; ``retry_after`` says when records expire, when idemd
    knows."""


class Unavailable(Problem):
    """idemd, its store or the network to it failed. The call may or may not have taken
    effect; resending it is safe. A transport failure has status 0 and the cause chained."""


class Failed(IdemdError):
    """The key's operation failed for good earlier: ``response`` is the stored failure."""

    def __init__(self, response: Response) -> None:
        self.response = response
        super().__init__(f"the operation failed permanently (stored status {response.status})")


UnsealableReason = Literal["unknown_key", "invalid", "not_sealed"]


class Unsealable(IdemdError):
    """A sealed result or recovery point that cannot be opened (docs/sealing.md):
    ``reason`` is ``unknown_key`` (sealed with a key the client's ring does not hold, or
    the client has no ring), ``invalid`` (not an envelope, or one that fails to open:
    changed in the store, moved to another key, tenant, status or point, or sealed with
    other bytes under the same id) or ``not_sealed`` (plain, and the client requires
    sealed ones). ``key_id`` is the id the envelope names, "" when it has none.

    The key is done and its answer unreadable here: ``run`` raises it and does not run
    the function; it is no reason to run the operation again."""

    def __init__(self, reason: UnsealableReason, key_id: str = "") -> None:
        self.reason: UnsealableReason = reason
        self.key_id = key_id
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.reason == "unknown_key":
            return f"idemd: the result is sealed with key {self.key_id!r}, which the key ring does not hold"
        if self.reason == "not_sealed":
            return "idemd: the result is not sealed, and the key ring requires sealed results"
        return "idemd: the sealed result does not open: tampered with, moved, or sealed with other key bytes"

    def __reduce__(self) -> tuple[type[Unsealable], tuple[UnsealableReason, str]]:
        return (Unsealable, (self.reason, self.key_id))


class Permanent(Exception):
    """Raise it from the function given to ``run`` for a failure that must not be retried
    (a declined card): its ``response`` is stored as the key's terminal failure and later
    calls get :class:`Failed` with it, instead of running the function again."""

    def __init__(self, response: Response, message: str = "") -> None:
        self.response = response
        super().__init__(message or f"permanent failure (status {response.status})")


_BY_CODE: dict[str, type[Problem]] = {
    "in_progress": InProgress,
    "fingerprint_mismatch": FingerprintMismatch,
    "lease_lost": LeaseLost,
    "not_found": NotFound,
    "payload_too_large": PayloadTooLarge,
    "store_unavailable": Unavailable,
    "not_replicated": Unavailable,
    "quota_exceeded": QuotaExceeded,
}


def unexpected_answer(err: Exception) -> Problem:
    """A success status whose body is not the answer the contract describes: something
    other than idemd answered (a proxy's page), or a daemon of another version."""
    return Problem(0, title="unexpected answer", detail=f"{type(err).__name__}: {err}")


def transport_failure(err: Exception) -> Unavailable:
    """No answer came: the connection failed or the call ran out of time."""
    return Unavailable(0, title="transport failure", detail=f"{type(err).__name__}: {err}")


def problem_class(status: int, code: str) -> type[Problem]:
    """The class for a problem: by its code, or, for an answer without one (not idemd's),
    Unavailable for the gateway statuses and PayloadTooLarge for a proxy's 413."""
    if code:
        return _BY_CODE.get(code, Problem)
    if status in (502, 503, 504):
        return Unavailable
    if status == 413:
        return PayloadTooLarge
    return Problem
