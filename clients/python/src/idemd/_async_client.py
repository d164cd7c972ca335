"""The asynchronous client, for asyncio: the same calls as :class:`idemd.Client`."""

from __future__ import annotations

import asyncio
import datetime
import functools
import inspect
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import httpx

from . import _fork, _wire
from ._batch import ANSWERS, AsyncBatcher, Operation, Outcome, Resend, answered, batch_request, failed
from ._client import DEFAULT_LEASE, api_client, default_owner, json_response
from ._consume import Verdict, verdict_of
from ._current import leased
from ._errors import Failed, IdemdError, Permanent, Unsealable, transport_failure, unexpected_answer
from ._keys import KeySpec, key_for
from ._lease import AsyncKeeper, AsyncLease, claim_waited, local_deadline
from ._seal import Sealing
from ._transport import AsyncRetryTransport, extra_time
from ._types import AbandonedKey, AbandonedPage, Claim, Record, ReleaseMode, Response, Result
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

#: The single call of each kind of operation.
SINGLE: dict[str, Callable[..., Awaitable[Any]]] = {
    "claim": claim_api.asyncio_detailed,
    "complete": complete_api.asyncio_detailed,
    "release": release_api.asyncio_detailed,
    "extend": extend_api.asyncio_detailed,
}


class AsyncClient:
    """The asyncio client of one idemd; see :class:`idemd.Client` for the options.

    With ``batching``, calls gather behind the client's request in flight as they do
    with :class:`idemd.Client`; a caller cancelled while its call waits to be sent is
    left out of the batch, and one cancelled while its batch is in flight does not cut
    the batch off for the others (the call may then still take effect, as a call cut
    off on its own may)."""

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
        self._transport = AsyncRetryTransport(timeout, retries, backoff)
        self._api = api_client(base_url, token, self._transport)
        self.owner = owner or default_owner()
        self.timeout = timeout
        self.retention = retention
        self._batches = AsyncBatcher(self._single, self._post) if batching else None
        _fork.track(self)

    def _renew_after_fork(self) -> None:
        # As Client's; the inherited connections are also bound to the parent's event
        # loop, which does not run in the child.
        self._transport = self._transport.renewed()
        self._api = api_client(self._base_url, self._token, self._transport)
        if self._batches is not None:
            self._batches = self._batches.renewed()

    async def aclose(self) -> None:
        _fork.forget(self)
        await self._api.get_async_httpx_client().aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, fn: Callable[..., Awaitable[Any]], extra: float = 0.0, **kwargs: Any) -> Any:
        try:
            with extra_time(extra):
                return await fn(client=self._api, **kwargs)
        except httpx.HTTPError as err:
            raise transport_failure(err) from err
        except (ValueError, KeyError, TypeError) as err:
            raise unexpected_answer(err) from err

    async def _do(self, op: Operation) -> Any:
        """See :meth:`idemd.Client._do`."""
        if self._batches is None:
            return await self._single(op)
        return await self._batches.do(op)

    async def _single(self, op: Operation) -> Any:
        answer = await self._call(SINGLE[op.kind], extra=op.wait, body=op.body)
        return _wire.expect(answer, *ANSWERS[op.kind])

    async def _post(self, ops: list[Operation]) -> list[Outcome] | Resend:
        try:
            answer = await batch_api.asyncio_detailed(client=self._api, body=batch_request(ops))
        except Exception as err:
            return failed(ops, err)
        return answered(ops, answer)

    async def claim(
        self,
        key: str,
        *,
        fingerprint: str = "",
        lease: float | None = None,
        wait: float | None = None,
        owner: str | None = None,
        secret: str | None = None,
    ) -> Claim:
        """See :meth:`idemd.Client.claim`."""
        return await self._claim(key, fingerprint, lease, wait, owner, secret)

    async def _claim(
        self,
        key: str,
        fingerprint: str,
        lease: float | None,
        wait: float | None,
        owner: str | None = None,
        secret: str | None = None,
        release: bool = True,
    ) -> Claim:
        """See :meth:`idemd.Client._claim`."""
        body = _wire.claim_request(
            key, fingerprint, owner or self.owner, secret or _wire.new_secret(), lease, wait
        )
        parsed: ClaimAcquired | ClaimFinished = await self._do(Operation("claim", body, wait=wait or 0.0))
        try:
            return _wire.claim(parsed, key, self.sealing)
        except Unsealable as err:
            if release and isinstance(parsed, ClaimAcquired):
                try:
                    # Shielded: a cancelled caller must still free the lease it got.
                    await asyncio.shield(self.release(key, parsed.lease_token, "retry"))
                except IdemdError as release_err:
                    err.add_note(f"and releasing the key failed: {release_err}")
            raise

    async def complete(self, key: str, token: str, response: Response) -> None:
        """See :meth:`idemd.Client.complete`."""
        raw = _wire.put_result_args(key, token, response, self.retention, self.sealing)
        if raw is not None:
            _wire.expect(await self._call(put_result_api.asyncio_detailed, **raw), KeyRecord)
            return
        body = _wire.complete_request(key, token, response, self.retention, self.sealing)
        await self._do(Operation("complete", body))

    async def release(
        self, key: str, token: str, mode: ReleaseMode = "retry", response: Response | None = None
    ) -> None:
        """See :meth:`idemd.Client.release`."""
        body = _wire.release_request(key, token, mode, response, self.retention, self.sealing)
        await self._do(Operation("release", body))

    async def extend(self, key: str, token: str, lease: float) -> datetime.datetime:
        """See :meth:`idemd.Client.extend`."""
        body = _wire.extend_request(key, token, lease)
        out: LeaseExtended = await self._do(Operation("extend", body))
        return out.lease_expires_at

    async def record_recovery_point(self, key: str, token: str, name: str, data: bytes = b"") -> None:
        """See :meth:`idemd.Client.record_recovery_point`."""
        body = _wire.recovery_point_request(key, token, name, data, self.sealing)
        _wire.expect(await self._call(recovery_point_api.asyncio_detailed, body=body), KeyRecord)

    async def abandoned(
        self,
        *,
        prefix: str = "",
        older_than: float = 0.0,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> AbandonedPage:
        """See :meth:`idemd.Client.abandoned`."""
        answer = await self._call(
            abandoned_api.asyncio_detailed,
            prefix=prefix or UNSET,
            older_than_ms=_wire.older_than_ms(older_than),
            limit=UNSET if limit is None else limit,
            cursor=cursor or UNSET,
        )
        return _wire.abandoned_page(_wire.expect(answer, AbandonedKeys))

    async def abandoned_keys(
        self, *, prefix: str = "", older_than: float = 0.0, limit: int | None = None
    ) -> AsyncGenerator[AbandonedKey, None]:
        """See :meth:`idemd.Client.abandoned_keys`; an async generator."""
        cursor: str | None = None
        while True:
            page = await self.abandoned(prefix=prefix, older_than=older_than, limit=limit, cursor=cursor)
            for k in page.keys:
                yield k
            if page.next_cursor is None:
                return
            cursor = _wire.next_cursor(cursor, page)

    async def lookup(self, key: str) -> Record:
        """See :meth:`idemd.Client.lookup`."""
        parsed = _wire.expect(await self._call(lookup_api.asyncio_detailed, key=key), KeyRecord)
        return _wire.record(parsed, key, self.sealing)

    async def purge(self, key: str) -> None:
        """See :meth:`idemd.Client.purge`."""
        _wire.expect(await self._call(purge_api.asyncio_detailed, key=key))

    async def run(
        self,
        key: str,
        fn: Callable[[AsyncLease], Awaitable[Response]],
        *,
        fingerprint: str = "",
        lease: float = DEFAULT_LEASE,
        wait: float | None = None,
    ) -> Result:
        """Run the coroutine function ``fn`` at most once for ``key``, as
        :meth:`idemd.Client.run` does; a task renews the lease every ``lease / 3``
        seconds (sooner after a failure), and when the lease is lost, by idemd's answer
        or at its local deadline, ``fn`` is cancelled and :class:`LeaseLost` raised
        (:class:`LeaseExpired` for the deadline). Cancelling the caller cancels ``fn``
        and releases the key for a retry."""
        return await self._claim_and_run(key, fn, fingerprint, lease, wait)

    async def _claim_and_run(
        self,
        key: str,
        fn: Callable[[AsyncLease], Awaitable[Response]],
        fingerprint: str,
        lease: float,
        wait: float | None,
        release: bool = True,
    ) -> Result:
        """See :meth:`idemd.Client._claim_and_run`; without ``release``, a cancelled
        caller leaves the key pending too."""
        sent = time.monotonic()
        claim = await self._claim(key, fingerprint, lease, wait, release=release)
        if claim.outcome == "completed":
            return Result(claim.response or Response(), replayed=True)
        if claim.outcome == "failed":
            raise Failed(claim.response or Response())
        held = AsyncLease(
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
            lost = await keeper.renew_now()
            if lost is not None:
                raise lost
        return await self._run_leased(held, keeper, fn, release)

    def _keeper(self, held: AsyncLease, lease: float) -> AsyncKeeper:
        """What renews ``held`` for ``lease`` seconds at a time while its work runs."""
        return AsyncKeeper(held, lease, lambda: self.extend(held.key, held.token, lease))

    async def _run_leased(
        self,
        held: AsyncLease,
        keeper: AsyncKeeper,
        fn: Callable[[AsyncLease], Awaitable[Response]],
        release: bool = True,
    ) -> Result:
        with leased(held):  # the task takes a copy of the context, with the lease
            work = asyncio.ensure_future(fn(held))
        keeper.start(work)
        try:
            response = await work
        except Permanent as failure:
            lost = await keeper.stop()
            if lost is not None:
                raise lost from failure
            await asyncio.shield(self.release(held.key, held.token, "fail", failure.response))
            raise
        except asyncio.CancelledError as err:
            lost = await keeper.stop()
            current = asyncio.current_task()
            if lost is not None and not (current and current.cancelling()):
                # fn was cancelled because the lease was lost: the cause worth keeping is
                # the renewal's failure, if any, not the cancellation.
                raise lost from lost.__cause__
            if lost is None and release:
                await self._release_quietly(held, err)
            raise
        except BaseException as err:
            lost = await keeper.stop()
            if lost is not None:
                raise lost from err
            if release:
                await self._release_quietly(held, err)
            raise
        lost = await keeper.stop()
        if lost is not None:
            raise lost
        await asyncio.shield(self.complete(held.key, held.token, response))
        return Result(response, replayed=False)

    async def _release_quietly(self, held: AsyncLease, err: BaseException) -> None:
        # Shielded: a cancelled caller must still free the key it held.
        try:
            await asyncio.shield(self.release(held.key, held.token, "retry"))
        except IdemdError as release_err:
            err.add_note(f"and releasing the key failed: {release_err}")

    async def once(
        self,
        key: str,
        fn: Callable[[AsyncLease], Awaitable[object]],
        *,
        lease: float = DEFAULT_LEASE,
        wait: float | None = None,
    ) -> bool:
        """See :meth:`idemd.Client.once`; ``fn`` is a coroutine function."""

        async def body(held: AsyncLease) -> Response:
            await fn(held)
            return Response(200)

        return not (await self.run(key, body, lease=lease, wait=wait)).replayed

    async def consume(
        self,
        key: str,
        fn: Callable[[AsyncLease], Awaitable[object]],
        *,
        lease: float = DEFAULT_LEASE,
        wait: float | None = None,
    ) -> Verdict:
        """See :meth:`idemd.Client.consume`; ``fn`` is a coroutine function."""
        ran = False
        fn_error: BaseException | None = None

        async def body(held: AsyncLease) -> Response:
            nonlocal ran, fn_error
            ran = True
            try:
                await fn(held)
            except BaseException as err:
                fn_error = err
                raise
            return Response(200)

        try:
            await self.run(key, body, lease=lease, wait=wait)
        except Exception as err:
            return verdict_of(err, ran, fn_error)
        return Verdict("ack", ran=ran)

    def idempotent(
        self, key: KeySpec, *, lease: float = DEFAULT_LEASE, wait: float | None = None
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """See :meth:`idemd.Client.idempotent`; decorates a coroutine function."""

        def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
            signature = inspect.signature(fn)

            @functools.wraps(fn)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                async def body(_: AsyncLease) -> Response:
                    return json_response(await fn(*args, **kwargs))

                result = await self.run(key_for(key, signature, args, kwargs), body, lease=lease, wait=wait)
                decoded: T = json.loads(result.response.body)
                return decoded

            return wrapper

        return decorate
