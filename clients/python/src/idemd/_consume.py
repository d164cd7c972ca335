"""What a queue consumer does with each delivery: one table in every idemd client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._errors import Failed, FingerprintMismatch, InProgress, Permanent

#: The delay of a requeue whose cause does not say when to try again, in seconds.
REQUEUE_DELAY = 1.0


@dataclass(frozen=True)
class Verdict:
    """What ``consume`` decided for one delivery.

    ``action`` is ``"ack"`` to remove the message (handled now or by an earlier
    delivery), ``"requeue"`` to have it delivered again after ``delay`` seconds (not
    handled; never dropped), or ``"dead-letter"`` to remove it to the broker's
    dead-letter queue where it has one (failed for good, the failure stored). ``ran``
    says that the function ran for this delivery; ``error`` is why the message was not
    acknowledged.
    """

    action: Literal["ack", "requeue", "dead-letter"]
    delay: float = 0.0
    ran: bool = False
    error: BaseException | None = None


def verdict_of(error: Exception, ran: bool, fn_error: BaseException | None) -> Verdict:
    """The verdict for a delivery whose run raised ``error``. ``fn_error`` is what the
    function raised: run raises it again once it finished the key as the error asks
    (the failure stored, or the key released)."""
    if not ran:
        if isinstance(error, (Failed, FingerprintMismatch)):
            return Verdict("dead-letter", error=error)
        delay = error.retry_after if isinstance(error, InProgress) and error.retry_after else REQUEUE_DELAY
        return Verdict("requeue", delay=delay, error=error)
    if error is fn_error and isinstance(error, Permanent):
        return Verdict("dead-letter", ran=True, error=error)
    return Verdict("requeue", delay=REQUEUE_DELAY, ran=True, error=error)
