"""Natural batching: the claims, completes, releases and extends a client makes while
one of its requests is in flight gather, and go out together as one POST /v1/batch when
it returns. There is no timer: a lone call waits for nothing.

:class:`Batcher` serves the threads of a :class:`idemd.Client`: the thread that finds
nothing in flight sends, and when its request returns it hands the calls that gathered
meanwhile to the first of their threads, which sends them as the next batch.
:class:`AsyncBatcher` serves an :class:`idemd.AsyncClient` with one sender task at a
time. Both answer each call exactly as it would be answered on its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal, Protocol, TypeVar

import httpx

from . import _wire
from ._errors import Problem, Unavailable, problem_class, transport_failure, unexpected_answer
from .idemapi import types as api_types
from .idemapi.models import (
    BatchItem,
    BatchItemResult,
    BatchRequest,
    BatchResults,
    ClaimAcquired,
    ClaimFinished,
    ClaimRequest,
    CompleteRequest,
    ExtendRequest,
    KeyRecord,
    LeaseExtended,
    ReleaseRequest,
)
from .idemapi.models import Problem as WireProblem

# The bounds of one batch. A call larger than MAX_ITEM_BYTES goes on its own, so that a
# batch stays far below any daemon's body limit (at least 64 KiB).
MAX_ITEMS = 128
MAX_BATCH_BYTES = 60 << 10
MAX_ITEM_BYTES = 16 << 10

Kind = Literal["claim", "complete", "release", "extend"]

#: The answers each kind of call accepts as a success.
ANSWERS: dict[Kind, tuple[type, ...]] = {
    "claim": (ClaimAcquired, ClaimFinished),
    "complete": (KeyRecord,),
    "release": (KeyRecord,),
    "extend": (LeaseExtended,),
}


@dataclass(eq=False)
class Operation:
    """One claim, complete, release or extend, as its single call's request body."""

    kind: Kind
    body: ClaimRequest | CompleteRequest | ReleaseRequest | ExtendRequest
    #: Seconds the call may take beyond the client's timeout: a claim's wait.
    wait: float = 0.0
    #: The size of the item in a batch's body; 0 until measured.
    size: int = 0

    def item(self) -> BatchItem:
        body = self.body
        if isinstance(body, ClaimRequest):
            return BatchItem(claim=body)
        if isinstance(body, CompleteRequest):
            return BatchItem(complete=body)
        if isinstance(body, ReleaseRequest):
            return BatchItem(release=body)
        return BatchItem(extend=body)

    def batchable(self) -> bool:
        """Whether the call may share a batch: a claim that waits would hold the whole
        batch back, and the daemon refuses it there; a large call goes alone."""
        if (
            isinstance(self.body, ClaimRequest)
            and isinstance(self.body.wait_ms, int)
            and self.body.wait_ms > 0
        ):
            return False
        # json.dumps with its default separators and ASCII escapes is never shorter than
        # what httpx sends, whichever version encodes it.
        self.size = len(json.dumps(self.item().to_dict())) + 1
        return self.size <= MAX_ITEM_BYTES


@dataclass(eq=False)
class Outcome:
    """A call's answer: the parsed success, or the exception to raise."""

    value: Any = None
    error: BaseException | None = None

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(frozen=True)
class Resend:
    """The daemon refused a batch as a whole in a way its calls alone would not be:
    send them one by one. ``unsupported`` says that it has no batch endpoint at all."""

    unsupported: bool


def batch_request(ops: Iterable[Operation]) -> BatchRequest:
    return BatchRequest(items=[op.item() for op in ops])


def answered(ops: list[Operation], answer: api_types.Response[Any]) -> list[Outcome] | Resend:
    """Each call's outcome from the daemon's answer to their batch."""
    status = int(answer.status_code)
    if status in (404, 405):
        # A daemon from before the batch endpoint.
        return Resend(unsupported=True)
    if status in (400, 413, 415):
        return Resend(unsupported=False)
    parsed = answer.parsed
    if isinstance(parsed, WireProblem):
        return [Outcome(error=_wire.problem(parsed, answer.headers)) for _ in ops]
    if status != 200 or not isinstance(parsed, BatchResults):
        return [Outcome(error=unexpected_answer(ValueError(f"the batch was answered {status}"))) for _ in ops]
    if len(parsed.results) != len(ops):
        err = ValueError(
            f"a batch of {len(ops)} calls was answered with {len(parsed.results)} results; "
            "is the base URL idemd's?"
        )
        return [Outcome(error=unexpected_answer(err)) for _ in ops]
    return [item_outcome(op, res) for op, res in zip(ops, parsed.results, strict=True)]


def failed(ops: list[Operation], err: Exception) -> list[Outcome] | Resend:
    """Each call's outcome when posting their batch raised ``err``."""
    if isinstance(err, Problem):
        # An answer that is not idemd's, turned into a Problem by the transport.
        if err.status in (404, 405):
            return Resend(unsupported=True)
        if err.status in (400, 413, 415):
            return Resend(unsupported=False)
        return [Outcome(error=copy_problem(err)) for _ in ops]
    if isinstance(err, httpx.HTTPError):
        return [Outcome(error=chained(transport_failure(err), err)) for _ in ops]
    if isinstance(err, ValueError | KeyError | TypeError):
        return [Outcome(error=chained(unexpected_answer(err), err)) for _ in ops]
    return [Outcome(error=err) for _ in ops]


def item_outcome(op: Operation, res: BatchItemResult) -> Outcome:
    """An item's result as its single call's would be."""
    if isinstance(res.problem, WireProblem):
        return Outcome(error=_wire.problem(res.problem))
    status = res.status
    if status >= 300:
        try:
            title = HTTPStatus(status).phrase
        except ValueError:
            title = ""
        return Outcome(error=problem_class(status, "")(status, title=title))
    member: Any = None
    if op.kind == "claim":
        member = res.acquired if status == 201 else res.finished if status == 200 else None
    elif op.kind == "extend":
        member = res.extended if status == 200 else None
    elif status == 200:
        member = res.record
    if not isinstance(member, ANSWERS[op.kind]):
        err = ValueError(f"a batch item was answered {status} without its answer; is the base URL idemd's?")
        return Outcome(error=unexpected_answer(err))
    return Outcome(value=member)


def copy_problem(p: Problem) -> Problem:
    """A Problem of its own for each caller of a batch, so that raising it in one
    caller's thread does not grow another's traceback."""
    out = type(p)(p.status, p.code, p.title, p.detail, p.type, p.retry_after)
    out.__cause__ = p.__cause__
    return out


E = TypeVar("E", bound=BaseException)


def chained(err: E, cause: BaseException) -> E:
    err.__cause__ = cause
    return err


class Queued(Protocol):
    op: Operation

    def gone(self) -> bool: ...


Q = TypeVar("Q", bound=Queued)


def take(queue: deque[Q]) -> list[Q]:
    """Takes the calls of the next batch off the front of the queue, leaving out those
    whose caller has gone."""
    calls: list[Q] = []
    size = 0
    while queue and len(calls) < MAX_ITEMS:
        call = queue[0]
        if call.gone():
            queue.popleft()
            continue
        if size + call.op.size > MAX_BATCH_BYTES and calls:
            break
        size += call.op.size
        calls.append(queue.popleft())
    return calls


@dataclass(eq=False)
class Call:
    """A call of a :class:`idemd.Client` waiting in the queue. Its thread sleeps on
    ``wake`` until the call is answered (``outcome`` is set) or it is its turn to send
    (``outcome`` is still None)."""

    op: Operation
    outcome: Outcome | None = None
    wake: threading.Event = field(default_factory=threading.Event)

    def gone(self) -> bool:
        return False


class Batcher:
    """Gathers the calls of one :class:`idemd.Client`. At most one of its requests is in
    flight; the thread that sends one answers every call in it."""

    def __init__(
        self,
        single: Callable[[Operation], Any],
        post: Callable[[list[Operation]], list[Outcome] | Resend],
    ) -> None:
        self._single = single
        self._post = post
        self._lock = threading.Lock()
        self._queue: deque[Call] = deque()
        self._sending = False
        #: Set once the daemon answered a batch as an unknown endpoint.
        self.unsupported = False

    def renewed(self) -> Batcher:
        """A batcher with nothing in flight, for a forked child: the threads of the
        calls this one holds are not there. What it learnt of the daemon is kept."""
        fresh = Batcher(self._single, self._post)
        fresh.unsupported = self.unsupported
        return fresh

    @property
    def queued(self) -> int:
        """How many calls wait for the request in flight to return."""
        with self._lock:
            return len(self._queue)

    def do(self, op: Operation) -> Any:
        """Runs op: in a batch when it can share one, on its own otherwise; returns its
        parsed answer or raises as the single call does."""
        if self.unsupported or not op.batchable():
            return self._single(op)
        call = Call(op)
        with self._lock:
            self._queue.append(call)
            lead = not self._sending
            self._sending = True
        if not lead:
            call.wake.wait()
        if call.outcome is None:
            self._lead()
        assert call.outcome is not None
        return call.outcome.unwrap()

    def _lead(self) -> None:
        # This thread's call is at the front of the queue, so it is in the batch taken.
        with self._lock:
            calls = take(self._queue)
        try:
            self._send(calls)
        except Exception as err:
            for call in calls:
                if call.outcome is None:
                    call.outcome = Outcome(error=err)
        except BaseException:
            # This thread was interrupted; the others' calls may or may not have been sent.
            for call in calls:
                if call.outcome is None:
                    call.outcome = Outcome(
                        error=Unavailable(0, title="transport failure", detail="the batch was interrupted")
                    )
            raise
        finally:
            with self._lock:
                if self._queue:
                    # The first call that gathered meanwhile sends the next batch.
                    self._queue[0].wake.set()
                else:
                    self._sending = False
            for call in calls:
                call.wake.set()

    def _send(self, calls: list[Call]) -> None:
        if len(calls) > 1 and not self.unsupported:
            outcomes = self._post([call.op for call in calls])
            if not isinstance(outcomes, Resend):
                for call, outcome in zip(calls, outcomes, strict=True):
                    call.outcome = outcome
                return
            if outcomes.unsupported:
                self.unsupported = True
        for call in calls:
            call.outcome = self._alone(call.op)

    def _alone(self, op: Operation) -> Outcome:
        try:
            return Outcome(value=self._single(op))
        except Exception as err:
            return Outcome(error=err)


@dataclass(eq=False)
class AsyncCall:
    """A call of an :class:`idemd.AsyncClient` waiting in the queue; its caller awaits
    ``future``, which is cancelled when the caller is. ``context`` is the caller's, for
    the request of a call sent on its own."""

    op: Operation
    future: asyncio.Future[Any]
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    def gone(self) -> bool:
        return self.future.done()

    def settle(self, outcome: Outcome) -> None:
        if self.future.done():
            return
        if outcome.error is not None:
            self.future.set_exception(outcome.error)
        else:
            self.future.set_result(outcome.value)


class AsyncBatcher:
    """Gathers the calls of one :class:`idemd.AsyncClient`. One sender task at a time
    sends what gathered, batch after batch, and ends when nothing is left."""

    def __init__(
        self,
        single: Callable[[Operation], Coroutine[Any, Any, Any]],
        post: Callable[[list[Operation]], Awaitable[list[Outcome] | Resend]],
    ) -> None:
        self._single = single
        self._post = post
        self._queue: deque[AsyncCall] = deque()
        self._sender: asyncio.Task[None] | None = None
        #: Set once the daemon answered a batch as an unknown endpoint.
        self.unsupported = False

    def renewed(self) -> AsyncBatcher:
        """A batcher with nothing in flight, for a forked child: the sender task and
        the callers' futures this one holds belong to the parent's event loop."""
        fresh = AsyncBatcher(self._single, self._post)
        fresh.unsupported = self.unsupported
        return fresh

    @property
    def queued(self) -> int:
        """How many calls wait for the request in flight to return."""
        return sum(1 for call in self._queue if not call.gone())

    async def do(self, op: Operation) -> Any:
        """Runs op: in a batch when it can share one, on its own otherwise. A caller
        cancelled while its call is queued is left out of the batch; one cancelled
        while the batch is in flight does not cut it off for the others."""
        if self.unsupported or not op.batchable():
            return await self._single(op)
        call = AsyncCall(op, asyncio.get_running_loop().create_future())
        self._queue.append(call)
        if self._sender is None or self._sender.done():
            # The sender is nobody's own call: it runs in a context of its own, and
            # calls made before it starts go out with the first.
            self._sender = asyncio.create_task(self._run(), context=contextvars.Context())
        return await call.future

    async def _run(self) -> None:
        calls: list[AsyncCall] = []
        try:
            while True:
                calls = take(self._queue)
                if not calls:
                    self._sender = None
                    return
                try:
                    await self._send(calls)
                except Exception as err:
                    # Whatever went wrong, no call is left waiting and the loop goes on.
                    for call in calls:
                        call.settle(Outcome(error=err))
        except BaseException:
            # The sender was cancelled (its loop is closing): so are the calls it had.
            for call in [*calls, *self._queue]:
                call.future.cancel()
            self._queue.clear()
            self._sender = None
            raise

    async def _send(self, calls: list[AsyncCall]) -> None:
        if len(calls) > 1 and not self.unsupported:
            # The batch runs under the client's timeout, whichever of its callers leaves.
            outcomes = await self._post([call.op for call in calls])
            if not isinstance(outcomes, Resend):
                for call, outcome in zip(calls, outcomes, strict=True):
                    call.settle(outcome)
                return
            if outcomes.unsupported:
                self.unsupported = True
        for call in calls:
            await self._alone(call)

    async def _alone(self, call: AsyncCall) -> None:
        """Sends call on its own; its request is cut off if its caller is cancelled, as
        it would be had the caller sent it."""
        if call.gone():
            return
        request = asyncio.get_running_loop().create_task(self._single(call.op), context=call.context)
        try:
            await asyncio.wait([request, call.future], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            request.cancel()
            raise
        if not request.done():
            request.cancel()
            await asyncio.wait([request])
            return
        err = request.exception()
        call.settle(Outcome(error=err) if err is not None else Outcome(value=request.result()))
