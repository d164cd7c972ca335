"""Client of idemd, the idempotency service.

:class:`Client` and :class:`AsyncClient` make the calls (claim, complete, release,
extend, record a recovery point, list the abandoned keys, lookup, purge), run a function
at most once per key (``run``, ``once``, the ``idempotent`` decorator), and raise one
exception class per outcome a caller branches on. :class:`Completer` and
:class:`AsyncCompleter` finish the keys that holders left pending. :mod:`idemd.asgi`
and :mod:`idemd.wsgi` make web handlers idempotent by their ``Idempotency-Key`` header.
A client given :class:`Sealing` (a tenant and a :class:`KeyRing`) seals the results and
recovery points it stores and opens them when they come back; one that does not open
raises :class:`Unsealable`.
The code generated from the contract is :mod:`idemd.idemapi`.
"""

from ._async_client import AsyncClient
from ._client import Client
from ._completer import AsyncCompleter, Completer, CompleterStats
from ._consume import Verdict
from ._current import current_lease
from ._errors import (
    Failed,
    FingerprintMismatch,
    IdemdError,
    InProgress,
    LeaseExpired,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    Permanent,
    Problem,
    QuotaExceeded,
    Unavailable,
    Unsealable,
)
from ._keys import MESSAGE_HEADER, message_key, step_key
from ._lease import AsyncLease, Lease
from ._middleware import Incident
from ._middleware import idemd_key as middleware_key
from ._seal import KeyRing, Sealing, SealKey
from ._types import (
    AbandonedKey,
    AbandonedPage,
    Claim,
    Outcome,
    Record,
    RecoveryPoint,
    ReleaseMode,
    Response,
    Result,
)
from ._wire import new_secret

__all__ = [
    "MESSAGE_HEADER",
    "AbandonedKey",
    "AbandonedPage",
    "AsyncClient",
    "AsyncCompleter",
    "AsyncLease",
    "Claim",
    "Client",
    "Completer",
    "CompleterStats",
    "Failed",
    "FingerprintMismatch",
    "IdemdError",
    "InProgress",
    "Incident",
    "KeyRing",
    "Lease",
    "LeaseExpired",
    "LeaseLost",
    "NotFound",
    "Outcome",
    "PayloadTooLarge",
    "Permanent",
    "Problem",
    "QuotaExceeded",
    "Record",
    "RecoveryPoint",
    "ReleaseMode",
    "Response",
    "Result",
    "SealKey",
    "Sealing",
    "Unavailable",
    "Unsealable",
    "Verdict",
    "current_lease",
    "message_key",
    "middleware_key",
    "new_secret",
    "step_key",
]
