"""The synchronous client."""

from __future__ import annotations

import datetime
import functools
import inspect
import json
import time
from collections.abc import Callable, Generator
from typing import Any, ParamSpec, TypeVar

import httpx

from . import _fork, _wire
from ._batch import ANSWERS, Batcher, Operation, Outcome, Resend, answered, batch_request, failed
from ._consume import Verdict, verdict_of
from ._current import leased
from ._errors import Failed, IdemdError, Permanent, Unsealable, transport_failure, unexpected_answer
from ._keys import KeySpec, key_for
from ._lease import Keeper, Lease, claim_waited, local_deadline
from ._seal import Sealing
from ._transport import RetryTransport, extra_time
from ._types import AbandonedKey, AbandonedPage, Claim, Record, ReleaseMode, Response, Result
from .idemapi import AuthenticatedClient
from .idemapi import Client as ApiClient
from .idemapi.api.claims import batch as batch_api
from .idemapi.api.claims import claim as claim_api
from .idemapi.api.claims import complete as complete_api
from .idemapi.api.claims import extend as extend_api
from .idemapi.api.claims import put_result as put_result_api
from .idemapi.api.claims import record_recovery_point as recovery_point_api
from .idemapi.api.claims import release as release_api
from .idemapi.api.records import list_abandoned as abandoned_api
from .idemapi.api.records import lookup as lookup_api
from .idemapi.api.records import purge as purge_api
from .idemapi.models import AbandonedKeys, ClaimAcquired, ClaimFinished, KeyRecord, LeaseExtended
from .idemapi.types import UNSET

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_LEASE = 30.0


def api_client(
    base_url: str, token: str | None, transport: httpx.BaseTransport | httpx.AsyncBaseTransport
) -> ApiClient | AuthenticatedClient:
    args: dict[str, Any] = {"transport": transport}
    if token:
        return AuthenticatedClient(base_url=base_url, token=token, httpx_args=args)
    return ApiClient(base_url=base_url, httpx_args=args)


def default_owner() -> str:
    return "py-" + _wire.new_secret()[:16]


#: The single call of each kind of operation.
SINGLE: dict[str, Callable[..., Any]] = {
    "claim": claim_api.sync_detailed,
    "complete": complete_api.sync_detailed,
    "release": release_api.sync_detailed,
    "extend": extend_api.sync_detailed,
}


class Client:
    """A client of one idemd, safe to share between threads.

    ``timeout`` bounds each call in seconds, resends included (a claim that waits gets
    its wait on top); ``retries`` is how many times a call is resent after a transport
    failure (a refused or reset connection, no answer in time); ``owner`` labels the
    claims for operators and grants nothing; ``retention`` is how long results are kept,
    in seconds (None leaves it to the daemon); ``token`` is an API token, sent as
    ``Authorization: Bearer``.

    With ``batching`` (the default), calls made at the same time share HTTP requests: a
    claim that does not wait, a complete, release or extend goes out at once when none
    of this client's batches is in flight, and the calls made meanwhile go out together
    as one ``POST /v1/batch`` when it returns, each answered as it would be alone. No
    timer delays a lone call. A daemon without the batch endpoint is detected on the
    first batch, and calls go one by one from then on.

    With ``sealing`` (:class:`Sealing`: a tenant and a :class:`KeyRing`), the headers
    and body of every result the client stores, and the data of every recovery point it
    records, are sealed with keys idemd never sees, and opened when they come back
    (docs/sealing.md). One that does not open raises :class:`Unsealable`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float | None = 10.0,
        retries: int = 3,
        owner: str | None = None,
        retention: float | None = None,
        backoff: float = 0.05,
        batching: bool = True,
        sealing: Sealing | None = None,
    ) -> None:
        if sealing is not None and not isinstance(sealing, Sealing):
            raise TypeError("sealing is an idemd.Sealing")
        self._base_url = base_url
        self._token = token
        self.sealing = sealing
        self._transport = RetryTransport(timeout, retries, backoff)
        self._api = api_client(base_url, token, self._transport)
        self.owner = owner or default_owner()
        self.timeout = timeout
        self.retention = retention
        self._batches = Batcher(self._single, self._post) if batching else None
        _fork.track(self)

    def _renew_after_fork(self) -> None:
        # The inherited httpx client, its pool and connections are left unclosed for the
        # garbage collector (see _fork). A new httpx client also brings a new cookie jar,
        # whose lock a thread of the parent may have held.
        self._transport = self._transport.renewed()
        self._api = api_client(self._base_url, self._token, self._transport)
        if self._batches is not None:
            self._batches = self._batches.renewed()

    def close(self) -> None:
        _fork.forget(self)
        self._api.get_httpx_client().close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[..., Any], extra: float = 0.0, **kwargs: Any) -> Any:
        try:
            with extra_time(extra):
                return fn(client=self._api, **kwargs)
        except httpx.HTTPError as err:
            raise transport_failure(err) from err
        except (ValueError, KeyError, TypeError) as err:
            raise unexpected_answer(err) from err

    def _do(self, op: Operation) -> Any:
        """Runs a claim, complete, release or extend, in a batch when it can share one;
        returns its parsed answer or raises as the single call does."""
        if self._batches is None:
            return self._single(op)
        return self._batches.do(op)

    def _single(self, op: Operation) -> Any:
        answer = self._call(SINGLE[op.kind], extra=op.wait, body=op.body)
        return _wire.expect(answer, *ANSWERS[op.kind])

    def _post(self, ops: list[Operation]) -> list[Outcome] | Resend:
        try:
            answer = batch_api.sync_detailed(client=self._api, body=batch_request(ops))
        except Exception as err:
            return failed(ops, err)
        return answered(ops, answer)

    def claim(
        self,
        key: str,
        *,
        fingerprint: str = "",
        lease: float | None = None,
        wait: float | None = None,
        owner: str | None = None,
        secret: str | None = None,
    ) -> Claim:
        """Ask for the lease on ``key`` for ``lease`` seconds (the daemon's 30 s when None).

        Raises :class:`InProgress` when another caller holds a live lease (with ``wait``,
        after waiting up to that many seconds for it to finish) and
        :class:`FingerprintMismatch` when the key was used with another fingerprint, and
        :class:`Unsealable` when the result it replays, or the recovery point of the
        lease it acquired, does not open (that lease is then released for a retry).
        ``secret`` replaces the claim's own fresh secret: a claim carrying the live
        lease's secret gets that lease back, so never derive it from anything that a
        redelivery of the same job shares.
        """
        return self._claim(key, fingerprint, lease, wait, owner, secret)

    def _claim(
        self,
        key: str,
        fingerprint: str,
        lease: float | None,
        wait: float | None,
        owner: str | None = None,
        secret: str | None = None,
        release: bool = True,
    ) -> Claim:
        """claim; a lease acquired with a recovery point that does not open is released
        for a retry with ``release``, and left pending under its lease without."""
        # The secret is made once per call, so that every resend of this claim carries it.
        body = _wire.claim_request(
            key, fingerprint, owner or self.owner, secret or _wire.new_secret(), lease, wait
        )
        parsed: ClaimAcquired | ClaimFinished = self._do(Operation("claim", body, wait=wait or 0.0))
        try:
            return _wire.claim(parsed, key, self.sealing)
        except Unsealable as err:
            if release and isinstance(parsed, ClaimAcquired):
                try:
                    self.release(key, parsed.lease_token, "retry")
                except IdemdError as release_err:
                    err.add_note(f"and releasing the key failed: {release_err}")
            raise

    def complete(self, key: str, token: str, response: Response) -> None:
        """Store the result of the operation the lease was for; repeating it is safe.
        Raises :class:`LeaseLost` when the lease was taken over."""
        raw = _wire.put_result_args(key, token, response, self.retention, self.sealing)
        if raw is not None:
            _wire.expect(self._call(put_result_api.sync_detailed, **raw), KeyRecord)
            return
        body = _wire.complete_request(key, token, response, self.retention, self.sealing)
        self._do(Operation("complete", body))

    def release(
        self, key: str, token: str, mode: ReleaseMode = "retry", response: Response | None = None
    ) -> None:
        """Give the lease back: ``retry`` frees the key, ``fail`` stores ``response`` as a
        terminal failure that later claims replay."""
        body = _wire.release_request(key, token, mode, response, self.retention, self.sealing)
        self._do(Operation("release", body))

    def extend(self, key: str, token: str, lease: float) -> datetime.datetime:
        """Renew the lease for ``lease`` seconds from now; returns when it now runs out."""
        body = _wire.extend_request(key, token, lease)
        out: LeaseExtended = self._do(Operation("extend", body))
        return out.lease_expires_at

    def record_recovery_point(self, key: str, token: str, name: str, data: bytes = b"") -> None:
        """Record a recovery point for ``key`` under the lease ``token``: ``name`` (1 to
        128 bytes of UTF-8) and ``data`` (at most the daemon's
        ``--max-recovery-point-bytes``, 4096 by default). It replaces the point recorded
        before; the next acquisition of the key receives it in ``Claim.recovery_point``.
        Raises :class:`LeaseLost` when ``token`` is no longer the key's lease or the key
        is not pending, :class:`NotFound` when the key is gone, and
        :class:`PayloadTooLarge` for data over the limit. Repeating it is safe. Work that
        runs under a lease records through it instead (:meth:`Lease.checkpoint`), which
        also marks the lease lost when idemd says it is.

        It always goes as a request of its own: a batch has no item for it."""
        body = _wire.recovery_point_request(key, token, name, data, self.sealing)
        _wire.expect(self._call(recovery_point_api.sync_detailed, body=body), KeyRecord)

    def abandoned(
        self,
        *,
        prefix: str = "",
        older_than: float = 0.0,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> AbandonedPage:
        """A page of the abandoned-keys feed: this tenant's keys under ``prefix`` that are
        pending under a lease that ran out at least ``older_than`` seconds ago, their
        holders having died or been cut off. ``limit`` bounds the page (1 to 1000; idemd's
        100 when None); ``cursor`` is the ``next_cursor`` of the page before, read with the
        same prefix. A page may hold fewer keys than its limit, even none, and still have
        a ``next_cursor``: read until it is None, or iterate :meth:`abandoned_keys`.

        To finish a key, claim it with its ``fingerprint`` (the claim decides who
        finishes it: one renewed or taken over since the page was read raises
        :class:`InProgress`), or let a :class:`Completer` do it."""
        answer = self._call(
            abandoned_api.sync_detailed,
            prefix=prefix or UNSET,
            older_than_ms=_wire.older_than_ms(older_than),
            limit=UNSET if limit is None else limit,
            cursor=cursor or UNSET,
        )
        return _wire.abandoned_page(_wire.expect(answer, AbandonedKeys))

    def abandoned_keys(
        self, *, prefix: str = "", older_than: float = 0.0, limit: int | None = None
    ) -> Generator[AbandonedKey, None, None]:
        """Every key of the abandoned-keys feed, page after page, each page read as the
        iteration reaches it (``limit`` is the size of a page). A page that cannot be read
        raises its error from the iteration."""
        cursor: str | None = None
        while True:
            page = self.abandoned(prefix=prefix, older_than=older_than, limit=limit, cursor=cursor)
            yield from page.keys
            if page.next_cursor is None:
                return
            cursor = _wire.next_cursor(cursor, page)

    def lookup(self, key: str) -> Record:
        """The record of ``key``; :class:`NotFound` when there is none, and
        :class:`Unsealable` when its result or recovery point does not open."""
        parsed = _wire.expect(self._call(lookup_api.sync_detailed, key=key), KeyRecord)
        return _wire.record(parsed, key, self.sealing)

    def purge(self, key: str) -> None:
        """Delete the record of ``key`` (the token needs the admin scope)."""
        _wire.expect(self._call(purge_api.sync_detailed, key=key))

    def run(
        self,
        key: str,
        fn: Callable[[Lease], Response],
        *,
        fingerprint: str = "",
        lease: float = DEFAULT_LEASE,
        wait: float | None = None,
    ) -> Result:
        """Run ``fn`` at most once for ``key`` and store the response it returns.

        When the key is already done, the stored response comes back with ``replayed``
        true and ``fn`` does not run. While ``fn`` runs, a thread renews the lease every
        ``lease / 3`` seconds, and sooner after a renewal fails. If a renewal finds the
        lease gone, or none is answered before the lease's local deadline (the claim's
        send plus 95 % of the lease, moved on by each renewal answered), ``lease.lost``
        is set and ``run`` raises :class:`LeaseLost` (:class:`LeaseExpired` for the
        deadline) instead of storing anything; the key is left for idemd to hand over.
        ``fn`` gets the lease, with its ``attempt``, whether it was ``recovered`` from a
        holder whose lease ran out, and the time it has ``remaining()``; so does
        :func:`idemd.current_lease` while ``fn`` runs. A claim that waited for more than
        a third of the lease is renewed once before ``fn`` starts.

        A stored response that does not open (sealed with a key the client's ring does
        not hold, changed in the store, or plain under ``require_sealed``) raises
        :class:`Unsealable` and ``fn`` does not run: the key is done.

        An exception from ``fn`` releases the key for a retry and propagates; a
        :class:`Permanent` one stores its response as a terminal failure instead, and
        later calls raise :class:`Failed` with it. ``fn``'s lease starts from the
        ``recovery_point`` an earlier holder recorded, if one did, and records its own
        with ``lease.checkpoint``.
        """
        return self._claim_and_run(key, fn, fingerprint, lease, wait)

    def _claim_and_run(
        self,
        key: str,
        fn: Callable[[Lease], Response],
        fingerprint: str,
        lease: float,
        wait: float | None,
        release: bool = True,
    ) -> Result:
        """run, with what an exception of ``fn`` does to the key: with ``release`` it is
        freed for the caller's retry; without, it is left pending under the lease, which
        runs out, and the abandoned-keys feed lists it again (a Completer's way: a key
        released would drop out of the feed it works from)."""
        sent = time.monotonic()
        claim = self._claim(key, fingerprint, lease, wait, release=release)
        if claim.outcome == "completed":
            return Result(claim.response or Response(), replayed=True)
        if claim.outcome == "failed":
            raise Failed(claim.response or Response())
        held = Lease(
            key,
            claim.token,
            claim.attempt,
            claim.recovered,
            deadline=local_deadline(sent, lease),
            recovery_point=claim.recovery_point,
            client=self,
        )
        keeper = self._keeper(held, lease)
        if claim_waited(sent, lease):
            lost = keeper.renew_now()
            if lost is not None:
                raise lost
        return self._run_leased(held, keeper, fn, release)

    def _keeper(self, held: Lease, lease: float) -> Keeper:
        """What renews ``held`` for ``lease`` seconds at a time while its work runs."""
        return Keeper(held, lease, lambda: self.extend(held.key, held.token, lease))

    def _run_leased(
        self, held: Lease, keeper: Keeper, fn: Callable[[Lease], Response], release: bool = True
    ) -> Result:
        keeper.start()
        try:
            with leased(held):
                response = fn(held)
        except Permanent as failure:
            lost = keeper.stop()
            if lost is not None:
                raise lost from failure
            self.release(held.key, held.token, "fail", failure.response)
            raise
        except BaseException as err:
            lost = keeper.stop()
            if lost is not None:
                raise lost from err
            if not release:
                raise
            try:
                self.release(held.key, held.token, "retry")
            except IdemdError as release_err:
                err.add_note(f"and releasing the key failed: {release_err}")
            raise
        lost = keeper.stop()
        if lost is not None:
            raise lost
        self.complete(held.key, held.token, response)
        return Result(response, replayed=False)

    def once(
        self,
        key: str,
        fn: Callable[[Lease], object],
        *,
        lease: float = DEFAULT_LEASE,
        wait: float | None = None,
    ) -> bool:
        """Run ``fn`` at most once per message key, for consumers of brokers that deliver
        at least once; True when it ran now, False when an earlier delivery did. An
        exception releases the key, so the next delivery runs ``fn`` again; another
        consumer running the key raises :class:`InProgress`: leave the message for
        redelivery. Make the key with :func:`message_key`."""

        def body(held: Lease) -> Response:
            fn(held)
            return Response(200)

        return not self.run(key, body, lease=lease, wait=wait).replayed

    def consume(
        self,
        key: str,
        fn: Callable[[Lease], object],
        *,
        lease: float = DEFAULT_LEASE,
        wait: float | None = None,
    ) -> Verdict:
        """Run ``fn`` at most once for a message's key and say what to do with the
        delivery, by the same rules in every idemd client:

        - ``fn`` ran and its result is stored, or an earlier delivery ran it: ``"ack"``.
        - Another consumer holds the key: ``"requeue"``, after the time its lease has
          left (or wait for it with ``wait``); never drop the message.
        - ``fn`` raised: the key is released and the message requeued.
        - ``fn`` raised :class:`Permanent`: the failure is stored and the message
          dead-lettered; a later delivery of it is dead-lettered without running ``fn``.
        - idemd could not be asked, or did not store the outcome: ``"requeue"``. ``fn``
          does not run without a lease.

        ``fn`` gets the lease: a ``recovered`` one means that a consumer died holding
        the key, so the work may be done in part and ``fn`` must fence or reconcile its
        effects. Make the key with :func:`step_key` or :func:`message_key`.
        """
        ran = False
        fn_error: BaseException | None = None

        def body(held: Lease) -> Response:
            nonlocal ran, fn_error
            ran = True
            try:
                fn(held)
            except BaseException as err:
                fn_error = err
                raise
            return Response(200)

        try:
            self.run(key, body, lease=lease, wait=wait)
        except Exception as err:
            return verdict_of(err, ran, fn_error)
        return Verdict("ack", ran=ran)

    def idempotent(
        self, key: KeySpec, *, lease: float = DEFAULT_LEASE, wait: float | None = None
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorate a function to run at most once per key made from its arguments:
        ``key`` is a template formatted with them by name (``"charge:{order_id}"``) or a
        function of the same arguments. The return value is stored as JSON, so it must
        be JSON-serialisable, and a later call gets it back decoded from JSON. The function
        finds its lease with :func:`idemd.current_lease`."""

        def decorate(fn: Callable[P, T]) -> Callable[P, T]:
            signature = inspect.signature(fn)

            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                def body(_: Lease) -> Response:
                    return json_response(fn(*args, **kwargs))

                result = self.run(key_for(key, signature, args, kwargs), body, lease=lease, wait=wait)
                decoded: T = json.loads(result.response.body)
                return decoded

            return wrapper

        return decorate


def json_response(value: object) -> Response:
    return Response(200, {"Content-Type": ["application/json"]}, json.dumps(value).encode())
