"""Sealed results and recovery points (docs/sealing.md) against a real idemd: what the
client stores is an envelope idemd and its store cannot read, what comes back opens to
exactly what was stored, and what does not open is an Unsealable error that runs
nothing again."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Daemon, fresh_key, wait_until
from slowdown import scale

import idemd

TENANT = "default"
SECRET = b'{"card":"4242 4242 4242 4242","email":"ada@example.com"}'
POINT = b"ch_secret_1\x00\xff"
RESULT = idemd.Response(
    201,
    {"Content-Type": ["application/json"], "Location": ["/orders/7"], "X-Trace": ["a", "b\u00e9"]},
    SECRET,
)


def key_of(key_id: str, salt: str = "") -> idemd.SealKey:
    """A key made from its id, so that every test builds the same ring."""
    return idemd.SealKey(key_id, hashlib.sha256((salt + key_id).encode()).digest())


OLD = key_of("k-old")
NEW = key_of("k-new")


def sealing(*keys: idemd.SealKey, require_sealed: bool = False, tenant: str = TENANT) -> idemd.Sealing:
    return idemd.Sealing(tenant, idemd.KeyRing(keys), require_sealed=require_sealed)


def raw_record(url: str, key: str) -> dict[str, Any]:
    """The record as idemd answers it, read without the client."""
    answer = httpx.get(f"{url}/v1/records/{urllib.parse.quote(key, safe='')}", timeout=scale(30))
    assert answer.status_code == 200, answer.text
    record: dict[str, Any] = answer.json()
    return record


def envelope_of(raw: dict[str, Any]) -> bytes:
    """The sealed response of a raw record, checked to carry only its status beside."""
    response = raw["response"]
    assert set(response) == {"status", "sealed"}, response
    envelope = base64.b64decode(response["sealed"])
    assert envelope[:2] == b"\xc1\x02"
    return envelope


def key_id_of(envelope: bytes) -> str:
    return envelope[3 : 3 + envelope[2]].decode("ascii")


def never(_: Any) -> idemd.Response:
    pytest.fail("the work ran for a key whose result does not open")


def complete(url: str, key: str, with_sealing: idemd.Sealing | None, response: idemd.Response) -> None:
    with idemd.Client(url, sealing=with_sealing) as c:
        c.complete(key, c.claim(key, fingerprint="fp").token, response)


# The ring and its options.


def test_a_ring_from_its_text_form() -> None:
    a, b, c = (base64.b64encode(key_of(i).key).decode() for i in ("a", "b.2", "c_3"))
    ring = idemd.KeyRing.parse(f"# made 2026-11\n a={a} , b.2={b}\n\n# old\nc_3 = {c}\n")
    assert ring.sealing_key_id == "a"
    assert ring.key_ids == ["a", "b.2", "c_3"]
    assert repr(ring) == "KeyRing(key_ids=['a', 'b.2', 'c_3'])"
    assert key_of("a").key.hex() not in repr(key_of("a"))
    # The text form and the keys make the same ring: one opens what the other sealed.
    sealed = idemd.Sealing(TENANT, ring).seal_point("k", "p", b"data")
    made = idemd.KeyRing([key_of("c_3"), key_of("a")])
    assert idemd.Sealing(TENANT, made).open_point("k", "p", sealed) == b"data"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "at least one key"),
        ("# only a comment\n", "at least one key"),
        ("k1", "not id=base64"),
        ("k1=not*base64", "not standard base64"),
        ("k1=" + base64.b64encode(b"short").decode(), "is 5 bytes"),
        ("=" + base64.b64encode(bytes(32)).decode(), "key id ''"),
        ("k/1=" + base64.b64encode(bytes(32)).decode(), "key id 'k/1'"),
        ("k" * 33 + "=" + base64.b64encode(bytes(32)).decode(), "1 to 32"),
        ("k1={0},k1={0}".format(base64.b64encode(bytes(32)).decode()), "in the ring twice"),
    ],
)
def test_a_ring_refuses_what_is_not_one(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        idemd.KeyRing.parse(text)


def test_sealing_options_are_checked() -> None:
    ring = idemd.KeyRing([OLD])
    with pytest.raises(ValueError, match="tenant is required"):
        idemd.Sealing("", ring)
    with pytest.raises(TypeError, match="KeyRing"):
        idemd.Sealing(TENANT, [OLD])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SealKey"):
        idemd.KeyRing([("k", bytes(32))])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Sealing"):
        idemd.Client("http://127.0.0.1:1", sealing=ring)  # type: ignore[arg-type]
    err = idemd.Unsealable("unknown_key", "k-old")
    assert isinstance(err, idemd.IdemdError)
    assert "'k-old'" in str(err)


# Results.


def test_a_sealed_result_round_trips(any_daemon: Daemon) -> None:
    """Completed and failed results are stored as envelopes, only their status readable;
    the sealing client's claim, lookup and run open them to exactly what was stored."""
    url = any_daemon.url
    done, failed = fresh_key("sealed-done"), fresh_key("sealed-failed")
    declined = idemd.Response(402, {"Content-Type": ["text/plain"]}, b"card 4242 declined")
    with idemd.Client(url, sealing=sealing(OLD)) as c:
        c.complete(done, c.claim(done, fingerprint="fp").token, RESULT)
        c.release(failed, c.claim(failed).token, "fail", declined)

        for key, status, body in ((done, 201, SECRET), (failed, 402, b"card 4242 declined")):
            raw = raw_record(url, key)
            assert raw["response"]["status"] == status
            envelope = envelope_of(raw)
            assert key_id_of(envelope) == "k-old"
            assert body not in envelope
            assert b"4242" not in envelope

        again = c.claim(done, fingerprint="fp")
        assert (again.outcome, again.response) == ("completed", RESULT)
        assert c.lookup(done).response == RESULT
        assert c.run(done, never, fingerprint="fp") == idemd.Result(RESULT, replayed=True)
        assert c.claim(failed).response == declined
        with pytest.raises(idemd.Failed) as refused:
            c.run(failed, never)
        assert refused.value.response == declined

    # A client without a ring cannot read it: unknown_key, naming the key.
    with idemd.Client(url) as plain:
        for call in (lambda: plain.lookup(done), lambda: plain.claim(done, fingerprint="fp")):
            with pytest.raises(idemd.Unsealable) as unopened:
                call()
            assert (unopened.value.reason, unopened.value.key_id) == ("unknown_key", "k-old")


def test_the_store_holds_no_plaintext(own_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """The embedded store's files hold the key and the envelope, never the body, the
    headers' values or the recovery point's data."""
    d = own_daemon()
    key, pending = fresh_key("store-bytes"), fresh_key("store-point")
    complete(d.url, key, sealing(OLD), RESULT)
    with idemd.Client(d.url, sealing=sealing(OLD)) as c:
        c.record_recovery_point(pending, c.claim(pending).token, "charged", POINT)
    d.kill()  # everything is on disk
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != "idemd.log")
    assert key.encode() in stored
    assert pending.encode() in stored
    for secret in (SECRET, b"4242", b"/orders/7", b"ch_secret_1"):
        assert secret not in stored


def test_a_rotated_ring_opens_what_the_old_one_sealed(daemon: Daemon) -> None:
    """Rotation: a result sealed with [old] replays through [new, old], which seals
    with new; a ring without old gets unknown_key naming it; another tenant's name, or
    other bytes under old's id, do not open it (invalid)."""
    old_key, new_key = fresh_key("rotate-old"), fresh_key("rotate-new")
    complete(daemon.url, old_key, sealing(OLD), RESULT)
    with idemd.Client(daemon.url, sealing=sealing(NEW, OLD)) as rotated:
        assert rotated.claim(old_key, fingerprint="fp").response == RESULT
        assert rotated.run(old_key, never, fingerprint="fp").response == RESULT
        rotated.complete(new_key, rotated.claim(new_key).token, RESULT)
    assert key_id_of(envelope_of(raw_record(daemon.url, new_key))) == "k-new"

    refusals = [
        (sealing(NEW), old_key, "unknown_key", "k-old"),
        (sealing(OLD), new_key, "unknown_key", "k-new"),
        (sealing(OLD, tenant="payments"), old_key, "invalid", "k-old"),
        (sealing(key_of("k-old", salt="other bytes")), old_key, "invalid", "k-old"),
    ]
    for ring, key, reason, key_id in refusals:
        with idemd.Client(daemon.url, sealing=ring) as c, pytest.raises(idemd.Unsealable) as refused:
            c.lookup(key)
        assert (refused.value.reason, refused.value.key_id) == (reason, key_id)


def test_run_once_with_the_wrong_ring_runs_nothing(daemon: Daemon) -> None:
    """run, once, the decorator and consume raise (or hand on) Unsealable for a stored
    result that does not open, and the work does not run: the key is done."""
    keys = {name: fresh_key(f"wrong-ring-{name}") for name in ("run", "once", "decorated", "consume")}
    right = idemd.Client(daemon.url, sealing=sealing(OLD))
    wrong = idemd.Client(daemon.url, sealing=sealing(NEW))
    runs: list[str] = []

    def work(name: str) -> Callable[[idemd.Lease], idemd.Response]:
        def fn(_: idemd.Lease) -> idemd.Response:
            runs.append(name)
            return RESULT

        return fn

    def decorate(client: idemd.Client) -> Callable[[str], dict[str, str]]:
        @client.idempotent(keys["decorated"] + ":{order}")
        def charge(order: str) -> dict[str, str]:
            runs.append("decorated")
            return {"charge": "ch_1", "order": order}

        return charge

    with right, wrong:
        assert right.run(keys["run"], work("run")).replayed is False
        assert right.once(keys["once"], work("once")) is True
        assert decorate(right)("7") == {"charge": "ch_1", "order": "7"}
        assert right.consume(keys["consume"], work("consume")).action == "ack"
        assert runs == ["run", "once", "decorated", "consume"]
        # The right ring replays them all without running anything.
        assert right.run(keys["run"], work("again")).response == RESULT
        assert right.once(keys["once"], work("again")) is False
        assert decorate(right)("7") == {"charge": "ch_1", "order": "7"}
        assert right.consume(keys["consume"], work("again")) == idemd.Verdict("ack")
        assert len(runs) == 4

        calls: list[Callable[[], object]] = [
            lambda: wrong.run(keys["run"], work("wrong")),
            lambda: wrong.once(keys["once"], work("wrong")),
            lambda: decorate(wrong)("7"),
        ]
        for call in calls:
            with pytest.raises(idemd.Unsealable) as refused:
                call()
            assert (refused.value.reason, refused.value.key_id) == ("unknown_key", "k-old")
        verdict = wrong.consume(keys["consume"], work("wrong"))
        assert (verdict.action, verdict.ran) == ("requeue", False)
        assert isinstance(verdict.error, idemd.Unsealable)
        assert len(runs) == 4


def test_async_client_seals_and_opens(daemon: Daemon) -> None:
    """AsyncClient: run stores an envelope and replays it; a wrong ring raises
    Unsealable from run, once and the decorator, consume requeues, and nothing runs."""
    key, once_key, decorated = fresh_key("async-sealed"), fresh_key("async-once"), fresh_key("async-dec")
    runs: list[str] = []

    async def fn(_: idemd.AsyncLease) -> idemd.Response:
        runs.append("run")
        return RESULT

    async def other(_: idemd.AsyncLease) -> idemd.Response:
        runs.append("other")
        return RESULT

    def decorate(client: idemd.AsyncClient) -> Callable[[], Any]:
        @client.idempotent(decorated)
        async def charge() -> str:
            runs.append("decorated")
            return "ch_1"

        return charge

    async def main() -> None:
        async with (
            idemd.AsyncClient(daemon.url, sealing=sealing(OLD)) as right,
            idemd.AsyncClient(daemon.url, sealing=sealing(NEW)) as wrong,
        ):
            assert (await right.run(key, fn)).replayed is False
            assert await right.once(once_key, fn) is True
            assert await decorate(right)() == "ch_1"
            assert (await right.run(key, other)) == idemd.Result(RESULT, replayed=True)
            assert (await right.lookup(key)).response == RESULT
            assert key_id_of(envelope_of(raw_record(daemon.url, key))) == "k-old"
            for call in (
                lambda: wrong.run(key, other),
                lambda: wrong.once(once_key, other),
                lambda: decorate(wrong)(),
                lambda: wrong.lookup(key),
            ):
                with pytest.raises(idemd.Unsealable) as refused:
                    await call()
                assert (refused.value.reason, refused.value.key_id) == ("unknown_key", "k-old")
            verdict = await wrong.consume(key, other)
            assert (verdict.action, verdict.ran, type(verdict.error)) == ("requeue", False, idemd.Unsealable)

    asyncio.run(main())
    assert runs == ["run", "run", "decorated"]


def test_require_sealed_refuses_a_plain_result(daemon: Daemon) -> None:
    """A plain result passes through a ring that does not require sealing, and is
    refused with not_sealed by one that does: claim, lookup and run, which runs
    nothing."""
    key = fresh_key("plain-result")
    complete(daemon.url, key, None, RESULT)
    with idemd.Client(daemon.url, sealing=sealing(OLD)) as lenient:
        assert lenient.claim(key, fingerprint="fp").response == RESULT
        assert lenient.lookup(key).response == RESULT
    with idemd.Client(daemon.url, sealing=sealing(OLD, require_sealed=True)) as strict:
        calls: list[Callable[[], object]] = [
            lambda: strict.claim(key, fingerprint="fp"),
            lambda: strict.lookup(key),
            lambda: strict.run(key, never, fingerprint="fp"),
        ]
        for call in calls:
            with pytest.raises(idemd.Unsealable) as refused:
                call()
            assert (refused.value.reason, refused.value.key_id) == ("not_sealed", "")


def rewrite(url: str, key: str, finish: str, response: dict[str, Any] | None) -> None:
    """Plays whoever can write the store: replaces the record of ``key`` by one of the
    same fingerprint finished by ``complete`` or a ``fail`` release with ``response``
    (none when None), an envelope copied as it is."""
    fingerprint = raw_record(url, key).get("fingerprint")
    with idemd.Client(url) as c:
        c.purge(key)

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = httpx.post(f"{url}{path}", json=body, timeout=scale(30))
        assert answer.is_success, answer.text
        found: dict[str, Any] = answer.json()
        return found

    claim = post("/v1/claim", {"key": key} | ({"fingerprint": fingerprint} if fingerprint else {}))
    finished: dict[str, Any] = {"key": key, "lease_token": claim["lease_token"]}
    if response is not None:
        finished["response"] = response
    if finish == "fail":
        post("/v1/release", finished | {"mode": "fail"})
    else:
        post("/v1/complete", finished)


@pytest.mark.parametrize(("stored", "swap_to"), [("fail", "complete"), ("complete", "fail")])
def test_an_envelope_does_not_open_under_the_other_outcome(daemon: Daemon, stored: str, swap_to: str) -> None:
    """A failure's envelope stored as a completed result of the same key and status, or
    a success's as a failure, is refused (invalid), and nothing runs."""
    key = fresh_key("sealed-outcome")
    with idemd.Client(daemon.url, sealing=sealing(OLD)) as c:
        token = c.claim(key, fingerprint="fp").token
        if stored == "fail":
            c.release(key, token, "fail", RESULT)
        else:
            c.complete(key, token, RESULT)
    before = raw_record(daemon.url, key)
    envelope = envelope_of(before)
    rewrite(daemon.url, key, swap_to, before["response"])
    after = raw_record(daemon.url, key)
    assert after["state"] == ("failed" if swap_to == "fail" else "completed")
    assert envelope_of(after) == envelope
    for strict in (True, False):
        with idemd.Client(daemon.url, sealing=sealing(OLD, require_sealed=strict)) as reader:
            calls: list[Callable[[], object]] = [
                lambda: reader.claim(key, fingerprint="fp"),
                lambda: reader.lookup(key),
                lambda: reader.run(key, never, fingerprint="fp"),
            ]
            for call in calls:
                with pytest.raises(idemd.Unsealable) as refused:
                    call()
                assert (refused.value.reason, refused.value.key_id) == ("invalid", "k-old")


def test_require_sealed_refuses_an_unsealed_failure(daemon: Daemon) -> None:
    """A sealing client stores a failure without a response sealed, which a ring that
    requires sealing replays as that failure; a failure without an envelope put in place
    of a sealed result is refused with not_sealed by claim, lookup, run, once and
    consume, sync and async, and nothing runs."""
    bare = fresh_key("sealed-bare-failure")
    with idemd.Client(daemon.url, sealing=sealing(OLD)) as c:
        c.release(bare, c.claim(bare).token, "fail")
    record = raw_record(daemon.url, bare)
    assert (record["state"], record["response"]["status"]) == ("failed", 500)
    assert key_id_of(envelope_of(record)) == "k-old"
    with idemd.Client(daemon.url, sealing=sealing(OLD, require_sealed=True)) as strict:
        claim = strict.claim(bare)
        assert (claim.outcome, claim.response) == ("failed", None)
        assert strict.lookup(bare).response is None
        with pytest.raises(idemd.Failed):
            strict.run(bare, never)

    key = fresh_key("sealed-unsealed-failure")
    with idemd.Client(daemon.url, sealing=sealing(OLD)) as c:
        c.complete(key, c.claim(key).token, RESULT)
    rewrite(daemon.url, key, "fail", None)
    swapped = raw_record(daemon.url, key)
    assert swapped["state"] == "failed"
    assert "response" not in swapped
    with idemd.Client(daemon.url, sealing=sealing(OLD, require_sealed=True)) as strict:
        calls: list[Callable[[], object]] = [
            lambda: strict.claim(key),
            lambda: strict.lookup(key),
            lambda: strict.run(key, never),
            lambda: strict.once(key, never),
        ]
        for call in calls:
            with pytest.raises(idemd.Unsealable) as refused:
                call()
            assert (refused.value.reason, refused.value.key_id) == ("not_sealed", "")
        verdict = strict.consume(key, never)
        assert (verdict.action, verdict.ran, type(verdict.error)) == ("requeue", False, idemd.Unsealable)

    async def never_async(_: idemd.AsyncLease) -> idemd.Response:
        pytest.fail("the work ran for a key whose result does not open")

    async def run_async() -> None:
        async with idemd.AsyncClient(daemon.url, sealing=sealing(OLD, require_sealed=True)) as strict:
            with pytest.raises(idemd.Unsealable) as refused:
                await strict.run(key, never_async)
            assert refused.value.reason == "not_sealed"
            assert (await strict.claim(bare)).response is None

    asyncio.run(run_async())
    with idemd.Client(daemon.url, sealing=sealing(OLD)) as lenient, pytest.raises(idemd.Failed):
        lenient.run(key, never)


# Recovery points.


def test_a_sealed_recovery_point_reaches_the_next_holder(daemon: Daemon) -> None:
    """A point recorded through a sealing lease is an envelope in idemd; the next holder
    (a run after the release for a retry) starts from its data, opened. A client without
    the key cannot start from it: its claim raises unknown_key and gives the lease back;
    a plain point under require_sealed is not_sealed."""
    key = fresh_key("sealed-point")
    seen: list[idemd.RecoveryPoint | None] = []
    with idemd.Client(daemon.url, sealing=sealing(OLD)) as c:

        def charge(held: idemd.Lease) -> idemd.Response:
            seen.append(held.recovery_point)
            held.checkpoint("charged", POINT)
            raise RuntimeError("the receipt failed after the charge")

        with pytest.raises(RuntimeError):
            c.run(key, charge)
        raw = raw_record(daemon.url, key)
        assert (raw["state"], raw["recovery_point"]["name"]) == ("released", "charged")
        data = base64.b64decode(raw["recovery_point"]["data"])
        assert data[:2] == b"\xc1\x02"
        assert key_id_of(data) == "k-old"
        assert POINT not in data
        point = c.lookup(key).recovery_point
        assert point is not None
        assert (point.name, point.data, point.attempt) == ("charged", POINT, 1)

    with idemd.Client(daemon.url, sealing=sealing(NEW)) as other, pytest.raises(idemd.Unsealable) as refused:
        other.run(key, never)
    assert (refused.value.reason, refused.value.key_id) == ("unknown_key", "k-old")
    after = raw_record(daemon.url, key)
    assert (after["state"], after["attempt"]) == ("released", 2)  # the lease went back at once

    # A client without a ring hands the data on as it is: the envelope.
    as_is: list[idemd.RecoveryPoint | None] = []

    def look(held: idemd.Lease) -> idemd.Response:
        as_is.append(held.recovery_point)
        raise RuntimeError("looked only")

    with idemd.Client(daemon.url) as plain, pytest.raises(RuntimeError):
        plain.run(key, look)
    assert as_is[0] is not None
    assert key_id_of(as_is[0].data) == "k-old"

    with idemd.Client(daemon.url, sealing=sealing(NEW, OLD)) as c:

        def resume(held: idemd.Lease) -> idemd.Response:
            seen.append(held.recovery_point)
            return RESULT

        assert c.run(key, resume).response == RESULT
    assert seen[0] is None
    resumed = seen[1]
    assert resumed is not None
    assert (resumed.name, resumed.data, resumed.attempt) == ("charged", POINT, 1)

    plain_key, marked_key = fresh_key("plain-point"), fresh_key("marked-point")
    with idemd.Client(daemon.url) as plain:
        plain.record_recovery_point(plain_key, plain.claim(plain_key).token, "charged", b"ch_plain")
        plain.record_recovery_point(marked_key, plain.claim(marked_key).token, "charged", b"\xc1 plain")
        # Data that starts with 0xC1 but is no envelope stays plain to a client without a ring.
        marked = plain.lookup(marked_key).recovery_point
        assert marked is not None
        assert marked.data == b"\xc1 plain"
    with idemd.Client(daemon.url, sealing=sealing(OLD)) as lenient:
        lenient_point = lenient.lookup(plain_key).recovery_point
        assert lenient_point is not None
        assert lenient_point.data == b"ch_plain"
        # To a ring, data that starts with 0xC1 is an envelope, and this one is none.
        with pytest.raises(idemd.Unsealable) as refused:
            lenient.lookup(marked_key)
        assert (refused.value.reason, refused.value.key_id) == ("invalid", "")
    with idemd.Client(daemon.url, sealing=sealing(OLD, require_sealed=True)) as strict:
        with pytest.raises(idemd.Unsealable) as refused:
            strict.lookup(plain_key)
        assert (refused.value.reason, refused.value.key_id) == ("not_sealed", "")


def abandon(url: str, key: str) -> None:
    """Leaves ``key`` pending with a sealed recovery point, its lease running out, and
    waits for the abandoned-keys feed to list it."""
    with idemd.Client(url, sealing=sealing(OLD)) as c:
        held = c.claim(key, lease=1)
        c.record_recovery_point(key, held.token, "charged", POINT)
        wait_until(
            f"{key} to be abandoned",
            lambda: any(k.key == key for k in c.abandoned_keys(prefix=key)),
        )


def test_the_completer_opens_points_and_seals_results(daemon: Daemon) -> None:
    """A completer with the wrong ring counts the key as an error, reports Unsealable
    and leaves the key pending for another; one with the ring runs its handler from the
    opened point and stores the result sealed. The same for AsyncCompleter."""
    key, async_key = fresh_key("completer-sealed"), fresh_key("completer-sealed-async")
    abandon(daemon.url, key)
    abandon(daemon.url, async_key)
    errors: list[tuple[str | None, Exception]] = []
    seen: list[tuple[str, bytes]] = []

    def finish(held: idemd.Lease) -> idemd.Response:
        assert held.recovery_point is not None
        seen.append((held.recovery_point.name, held.recovery_point.data))
        return RESULT

    async def finish_async(held: idemd.AsyncLease) -> idemd.Response:
        assert held.recovery_point is not None
        seen.append((held.recovery_point.name, held.recovery_point.data))
        return RESULT

    def on_error(k: str | None, err: Exception) -> None:
        errors.append((k, err))

    with idemd.Client(daemon.url, sealing=sealing(NEW)) as wrong:
        stats = idemd.Completer(wrong, finish, prefix=key, lease=0.2, on_error=on_error).run_once()
    assert (stats.listed, stats.errors, seen) == (1, 1, [])
    assert errors[0][0] == key
    assert isinstance(errors[0][1], idemd.Unsealable)
    assert (errors[0][1].reason, errors[0][1].key_id) == ("unknown_key", "k-old")
    # Left pending under the completer's lease, not released: the feed lists it again.
    assert raw_record(daemon.url, key)["state"] == "pending"

    with idemd.Client(daemon.url, sealing=sealing(NEW, OLD)) as right:
        wait_until(f"{key} to be listed again", lambda: any(right.abandoned_keys(prefix=key)))
        stats = idemd.Completer(right, finish, prefix=key).run_once()
        assert (stats.listed, stats.finished) == (1, 1)
        assert right.lookup(key).response == RESULT

    async def complete_async() -> idemd.CompleterStats:
        async with idemd.AsyncClient(daemon.url, sealing=sealing(OLD)) as c:
            return await idemd.AsyncCompleter(c, finish_async, prefix=async_key).run_once()

    stats = asyncio.run(complete_async())
    assert (stats.listed, stats.finished) == (1, 1)
    assert seen == [("charged", POINT), ("charged", POINT)]
    assert key_id_of(envelope_of(raw_record(daemon.url, key))) == "k-new"
    assert key_id_of(envelope_of(raw_record(daemon.url, async_key))) == "k-old"


def test_the_readme_snippet(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's Sealing snippet, run as written against a real idemd."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Sealing", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    ring_text = ",".join(f"{k.id}={base64.b64encode(k.key).decode()}" for k in (NEW, OLD))
    monkeypatch.setenv("IDEMD_SEAL_KEYS", ring_text)
    namespace: dict[str, Any] = {}
    exec(snippet.replace("http://idemd.internal:8080", daemon.url), namespace)
    key = namespace["key"]
    assert key_id_of(envelope_of(raw_record(daemon.url, key))) == "k-new"
    assert namespace["result"].replayed is True


def test_a_sealed_result_goes_raw_by_its_envelopes_size() -> None:
    """The rule of every client: what is stored decides, so a body just under
    RAW_RESULT_BYTES whose envelope is over it goes raw, and the middleware's sent_raw
    says the same."""
    from idemd._middleware import sent_raw
    from idemd._wire import RAW_RESULT_BYTES, put_result_args

    s = sealing(NEW)
    under = idemd.Response(200, {"Content-Type": ["application/octet-stream"]}, b"x" * (RAW_RESULT_BYTES - 8))
    args = put_result_args("k", "t", under, None, s)
    assert args is not None, "a sealed envelope over RAW_RESULT_BYTES went as JSON"
    assert len(args["body"].payload) == s.envelope_len(under) > RAW_RESULT_BYTES
    assert s.envelope_len(RESULT) == len(s.seal_response("k", "completed", RESULT))
    assert args["idemd_sealed"] == "1"
    assert sent_raw(under, s)
    assert put_result_args("k", "t", under, None, None) is None
    assert not sent_raw(under, None)
    small = idemd.Response(200, {}, b"x" * 1000)
    assert put_result_args("k", "t", small, None, s) is None
    assert not sent_raw(small, s)
