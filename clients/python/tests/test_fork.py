"""Forking a process that holds a client, as gunicorn --preload, uWSGI, Celery's prefork
pool and multiprocessing's 'fork' start method do: the child calls through the client it
inherited while the parent goes on with the same client. Each test forks with
multiprocessing's fork context; the child reports through a pipe and is killed if it has
not reported by the deadline, so that a hang fails the test instead of stalling it."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import threading
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from conftest import Daemon, fresh_key, wait_until
from proxy import GateProxy
from slowdown import scale

import idemd

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform"),
    # Python 3.12 and later warn that forking a process with threads may deadlock the
    # child: the very case these tests pin down.
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
]

#: How long a child may take to report, and the bound of every wait on the parent's side.
DEADLINE = scale(60.0)
#: Keys each process goes through in the tests of concurrent use, after each of FORKS forks.
ROUNDS = 50
FORKS = 3

T = TypeVar("T")
FORK = multiprocessing.get_context("fork")


class Child:
    """A forked child running ``work``; :meth:`result` is what it returned."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._receiver, sender = FORK.Pipe(duplex=False)

        def main() -> None:
            try:
                report: tuple[str, object] = ("returned", work())
            except BaseException:
                report = ("raised", traceback.format_exc())
            sender.send(report)

        self._process = FORK.Process(target=main, daemon=True)
        self._process.start()
        sender.close()

    def result(self) -> Any:
        if not self._receiver.poll(DEADLINE):
            self.kill()
            pytest.fail(f"the child did not report within {DEADLINE} s: its calls hang")
        try:
            how, what = self._receiver.recv()
        except EOFError:
            self._process.join(DEADLINE)
            pytest.fail(f"the child exited with {self._process.exitcode} without reporting")
        self._process.join(DEADLINE)
        if self._process.is_alive():
            self.kill()
            pytest.fail("the child did not exit after reporting")
        if how == "raised":
            pytest.fail(f"the child raised:\n{what}")
        return what

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join(DEADLINE)


def lifecycle(client: idemd.Client, key: str) -> list[str]:
    """Claims, completes, replays and looks up key; the answers that are not key's."""
    wrong: list[str] = []
    claim = client.claim(key, fingerprint=key)
    if claim.outcome != "acquired":
        wrong.append(f"{key}: claimed {claim.outcome}")
    client.complete(key, claim.token, idemd.Response(201, body=key.encode()))
    replay = client.claim(key, fingerprint=key)
    if replay.response is None or replay.response.body != key.encode():
        wrong.append(f"{key}: replayed {replay.response}")
    record = client.lookup(key)
    if record.key != key or record.response is None or record.response.body != key.encode():
        wrong.append(f"{key}: looked up {record.key} with {record.response}")
    return wrong


async def async_lifecycle(client: idemd.AsyncClient, key: str) -> list[str]:
    """:func:`lifecycle` with an AsyncClient."""
    wrong: list[str] = []
    claim = await client.claim(key, fingerprint=key)
    if claim.outcome != "acquired":
        wrong.append(f"{key}: claimed {claim.outcome}")
    await client.complete(key, claim.token, idemd.Response(201, body=key.encode()))
    replay = await client.claim(key, fingerprint=key)
    if replay.response is None or replay.response.body != key.encode():
        wrong.append(f"{key}: replayed {replay.response}")
    record = await client.lookup(key)
    if record.key != key or record.response is None or record.response.body != key.encode():
        wrong.append(f"{key}: looked up {record.key} with {record.response}")
    return wrong


def rounds(client: idemd.Client, who: str) -> list[str]:
    wrong: list[str] = []
    for _ in range(ROUNDS):
        wrong += lifecycle(client, fresh_key(f"{who}-{os.getpid()}"))
    return wrong


async def async_rounds(client: idemd.AsyncClient, who: str) -> list[str]:
    wrong: list[str] = []
    for _ in range(ROUNDS):
        wrong += await async_lifecycle(client, fresh_key(f"{who}-{os.getpid()}"))
    return wrong


class Loop:
    """An event loop running in a thread of its own, as a server's loop runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def start(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.start(coro).result(DEADLINE)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(DEADLINE)
        self.loop.close()


@pytest.fixture
def proxy(daemon: Daemon) -> Iterator[GateProxy]:
    """A proxy in front of the shared daemon that holds the first request it receives."""
    gate = GateProxy(daemon.url)
    yield gate
    gate.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


def test_a_child_forked_while_a_batch_is_in_flight_calls_through_the_same_client(
    proxy: GateProxy,
) -> None:
    client = idemd.Client(proxy.url)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(client.claim, fresh_key("held"))
        wait_until("the held claim to reach the proxy", lambda: proxy.count() == 1)
        try:
            # Without a fresh batcher, the child's calls would queue behind a batch
            # whose thread does not exist in the child, and wait for ever.
            child = Child(lambda: lifecycle(client, fresh_key(f"child-{os.getpid()}")))
            assert child.result() == []
        finally:
            proxy.open()
        assert held.result(DEADLINE).outcome == "acquired"
    assert lifecycle(client, fresh_key("parent")) == []
    client.close()


def test_a_child_forked_while_another_thread_holds_the_batchers_lock_calls_through_the_same_client(
    daemon: Daemon,
) -> None:
    client = idemd.Client(daemon.url)
    assert client._batches is not None
    locked, leave = threading.Event(), threading.Event()

    def hold() -> None:
        assert client._batches is not None
        with client._batches._lock:
            locked.set()
            leave.wait(DEADLINE)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(DEADLINE)
        child = Child(lambda: lifecycle(client, fresh_key(f"child-{os.getpid()}")))
        assert child.result() == []
    finally:
        leave.set()
        holder.join(DEADLINE)
    assert lifecycle(client, fresh_key("parent")) == []
    client.close()


def test_parent_and_child_get_only_their_own_answers_over_an_inherited_pool(daemon: Daemon) -> None:
    # Without resends, a connection of the parent's that the child broke fails a call.
    client = idemd.Client(daemon.url, timeout=scale(20.0), retries=0)
    # Sharing a connection goes wrong only when both processes use it at once, which
    # the timing decides: each fork is a fresh chance.
    for _ in range(FORKS):
        # The pool keeps this call's connection alive for the next: the child inherits it.
        assert lifecycle(client, fresh_key("before-fork")) == []
        start = FORK.Barrier(2)

        def work(start: Any = start) -> list[str]:
            # What the child dropped of the parent's is collected before the parent goes on.
            gc.collect()
            start.wait(DEADLINE)
            return rounds(client, "child")

        child = Child(work)
        try:
            start.wait(DEADLINE)
            assert rounds(client, "parent") == []
            assert child.result() == []
        finally:
            child.kill()
    client.close()


def in_new_loop(work: Callable[[], Awaitable[T]]) -> Callable[[], T]:
    """Work for a child that runs its own event loop, as a forked async worker does."""

    def run() -> T:
        async def main() -> T:
            return await work()

        return asyncio.run(main())

    return run


def test_a_child_forked_while_an_async_batch_is_in_flight_calls_through_the_same_client(
    proxy: GateProxy, loop: Loop
) -> None:
    client = idemd.AsyncClient(proxy.url)
    held = loop.start(client.claim(fresh_key("held")))
    wait_until("the held claim to reach the proxy", lambda: proxy.count() == 1)
    try:
        # Without a fresh batcher, the child's calls would wait for a sender task of the
        # parent's event loop, which never runs in the child.
        child = Child(in_new_loop(lambda: async_lifecycle(client, fresh_key(f"child-{os.getpid()}"))))
        assert child.result() == []
    finally:
        proxy.open()
    assert held.result(DEADLINE).outcome == "acquired"
    assert loop.run(async_lifecycle(client, fresh_key("parent"))) == []
    loop.run(client.aclose())


def test_parent_and_child_get_only_their_own_answers_over_an_inherited_async_pool(
    daemon: Daemon, loop: Loop
) -> None:
    client = idemd.AsyncClient(daemon.url, timeout=scale(20.0), retries=0)
    assert loop.run(async_lifecycle(client, fresh_key("before-fork"))) == []
    start = FORK.Barrier(2)

    async def work() -> list[str]:
        gc.collect()
        start.wait(DEADLINE)
        return await async_rounds(client, "child")

    child = Child(in_new_loop(work))
    try:
        start.wait(DEADLINE)
        assert loop.run(async_rounds(client, "parent")) == []
        assert child.result() == []
    finally:
        child.kill()
    loop.run(client.aclose())
