"""consume's verdicts for queue consumers: one table in every language (docs/queues.md)."""

from __future__ import annotations

import asyncio

from conftest import Daemon, free_port, fresh_key
from proxy import GateProxy
from slowdown import scale

import idemd


def test_acks_a_handled_message_and_its_redelivery(daemon: Daemon) -> None:
    key = idemd.step_key(fresh_key("req"), "charge")
    runs: list[idemd.Lease] = []
    with idemd.Client(daemon.url) as c:
        assert c.consume(key, runs.append) == idemd.Verdict("ack", ran=True)
        assert c.consume(key, runs.append) == idemd.Verdict("ack", ran=False)
    assert len(runs) == 1
    assert (runs[0].key, runs[0].attempt, runs[0].recovered) == (key, 1, False)


def test_requeues_what_another_consumer_holds(daemon: Daemon) -> None:
    key = idemd.step_key(fresh_key("req"), "charge")
    runs: list[idemd.Lease] = []
    with idemd.Client(daemon.url) as c:
        c.claim(key, lease=20)
        v = c.consume(key, runs.append)
    assert (v.action, v.ran, runs) == ("requeue", False, [])
    assert isinstance(v.error, idemd.InProgress)
    assert v.delay >= 10


def test_requeues_a_transient_failure(daemon: Daemon) -> None:
    key = idemd.step_key(fresh_key("req"), "charge")
    boom = RuntimeError("the database is down")

    def fail(_: idemd.Lease) -> None:
        raise boom

    with idemd.Client(daemon.url) as c:
        v = c.consume(key, fail)
        assert (v.action, v.ran, v.error) == ("requeue", True, boom)
        assert v.delay > 0
        assert c.consume(key, lambda _: None) == idemd.Verdict("ack", ran=True)


def test_dead_letters_a_permanent_failure(daemon: Daemon) -> None:
    key = idemd.step_key(fresh_key("req"), "charge")
    runs: list[idemd.Lease] = []

    def decline(held: idemd.Lease) -> None:
        runs.append(held)
        raise idemd.Permanent(idemd.Response(402), "card declined")

    with idemd.Client(daemon.url) as c:
        v = c.consume(key, decline)
        assert (v.action, v.ran) == ("dead-letter", True)
        again = c.consume(key, decline)
    assert (again.action, again.ran) == ("dead-letter", False)
    assert isinstance(again.error, idemd.Failed)
    assert len(runs) == 1


def test_never_runs_without_idemd() -> None:
    runs: list[idemd.Lease] = []
    with idemd.Client(f"http://127.0.0.1:{free_port()}", retries=0) as c:
        v = c.consume(idemd.step_key(fresh_key("req"), "charge"), runs.append)
    assert (v.action, v.ran, runs) == ("requeue", False, [])
    assert isinstance(v.error, idemd.Unavailable)


def test_requeues_an_unstored_outcome(cut_proxy: GateProxy) -> None:
    def work(_: idemd.Lease) -> None:
        cut_proxy.cut = True  # the work is done, but its outcome cannot be stored

    with idemd.Client(cut_proxy.url, retries=0, timeout=scale(2)) as c:
        v = c.consume(idemd.step_key(fresh_key("req"), "charge"), work)
    assert (v.action, v.ran) == ("requeue", True)
    assert v.error is not None


def test_async_consume_follows_the_same_table(daemon: Daemon) -> None:
    async def main() -> None:
        key = idemd.step_key(fresh_key("req"), "charge")
        seen: list[idemd.AsyncLease] = []

        async def work(held: idemd.AsyncLease) -> None:
            seen.append(held)

        async def decline(_: idemd.AsyncLease) -> None:
            raise idemd.Permanent(idemd.Response(402))

        async with idemd.AsyncClient(daemon.url) as c:
            assert await c.consume(key, work) == idemd.Verdict("ack", ran=True)
            assert await c.consume(key, work) == idemd.Verdict("ack", ran=False)
            assert (seen[0].key, seen[0].attempt, seen[0].recovered) == (key, 1, False)
            other = idemd.step_key(fresh_key("req"), "charge")
            await c.claim(other, lease=20)
            held = await c.consume(other, work)
            assert (held.action, held.ran) == ("requeue", False)
            declined = idemd.step_key(fresh_key("req"), "charge")
            assert (await c.consume(declined, decline)).action == "dead-letter"
        assert len(seen) == 1

    asyncio.run(main())


def test_step_key() -> None:
    k = fresh_key("req")
    assert idemd.step_key(k, "charge") == idemd.step_key(k, "charge")
    assert idemd.step_key(k, "charge") != idemd.step_key(k, "email")
    assert idemd.step_key("a", "bc") != idemd.step_key("ab", "c")
    # The same key in every idemd client.
    assert (
        idemd.step_key("req-1", "charge")
        == "msg-828aedf1c68eb588f35320345076e88dc90193e8a33ddf7b632f66ea0d1e46e8"
    )
    assert idemd.MESSAGE_HEADER == "idemd-key"
