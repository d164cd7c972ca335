"""Exactly-once effects on a real PostgreSQL (docs/effects.md): a holder whose lease ran
out while it stalled, and was taken over, charges a second time unless its write is
fenced by the lease's attempt."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import pytest
from conftest import Daemon, fresh_key
from effects import SCHEMA, Fenced, charge, charge_once, charge_unfenced
from postgres import Postgres, start
from proxy import GateProxy
from slowdown import scale

import idemd

OPENING = 10_000
CENTS = 500

Charge = Callable[[psycopg.Connection, idemd.Lease, str, int], bool]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    server = start()
    with psycopg.connect(server.url, autocommit=True) as db:
        db.execute(SCHEMA)
    yield server
    server.stop()


def connect(server: Postgres) -> psycopg.Connection:
    return psycopg.connect(server.url, autocommit=True)


@pytest.fixture
def account(postgres: Postgres) -> str:
    """A fresh account, so that the tests share the server but not their balances."""
    name = fresh_key("acct")
    with connect(postgres) as db:
        db.execute("INSERT INTO accounts VALUES (%s, %s)", (name, OPENING))
    return name


def charges(server: Postgres, key: str, account: str) -> tuple[list[int], int]:
    """The attempts that charged key, and the account's balance."""
    with connect(server) as db:
        attempts = [
            row[0] for row in db.execute("SELECT attempt FROM ledger WHERE key = %s ORDER BY id", (key,))
        ]
        row = db.execute("SELECT balance_cents FROM accounts WHERE id = %s", (account,)).fetchone()
    assert row is not None
    return attempts, int(row[0])


class StalledHolder:
    """Holds a key through a link to idemd that it then cuts, so that its renewals stop
    and its lease runs out while it waits: ``before`` runs first, ``after`` once
    :meth:`resume` is called. :meth:`outcome` is what ``run`` did."""

    def __init__(
        self,
        daemon: Daemon,
        key: str,
        before: Callable[[idemd.Lease], object],
        after: Callable[[idemd.Lease], object],
    ) -> None:
        self.proxy = GateProxy(daemon.url, hold=())
        self._wake = threading.Event()
        holding = threading.Event()
        client = idemd.Client(self.proxy.url, retries=0)

        def stall(lease: idemd.Lease) -> idemd.Response:
            before(lease)
            self.proxy.cut = True
            holding.set()
            self._wake.wait(scale(30))
            # A holder back from a pause does not look at its lease first: that is the
            # case the fence is for.
            after(lease)
            return idemd.Response(201)

        self._pool = ThreadPoolExecutor(1)
        self._run: Future[idemd.Result] = self._pool.submit(client.run, key, stall, lease=0.3)
        if not holding.wait(scale(30)):
            self._run.result(0)  # raises what stopped it
            pytest.fail("the first holder never stalled")

    def resume(self, heal: bool) -> None:
        self.proxy.cut = not heal
        self._wake.set()

    def outcome(self) -> BaseException | None:
        try:
            self._run.result(scale(30))
            return None
        except Exception as err:
            return err
        finally:
            self._pool.shutdown()
            self.proxy.close()


def take_over(daemon: Daemon, key: str, work: Callable[[idemd.Lease], object]) -> idemd.Lease:
    """Runs work under key as soon as the stalled holder's lease has run out."""
    client = idemd.Client(daemon.url)
    taken: list[idemd.Lease] = []

    def body(lease: idemd.Lease) -> idemd.Response:
        taken.append(lease)
        work(lease)
        return idemd.Response(201)

    end = time.monotonic() + scale(30)
    while True:
        try:
            client.run(key, body, wait=1)
            return taken[-1]
        except idemd.InProgress:
            if time.monotonic() > end:
                pytest.fail(f"{key!r} was never taken over")


@pytest.mark.parametrize(
    ("charge_with", "attempts"),
    [pytest.param(charge, [2], id="fenced"), pytest.param(charge_unfenced, [2, 1], id="unfenced")],
)
def test_a_stalled_holder_wakes_after_the_takeover(
    daemon: Daemon, postgres: Postgres, account: str, charge_with: Charge, attempts: list[int]
) -> None:
    """Fenced, the stalled holder is refused and the account is debited once; unfenced,
    it charges again. Either way its run fails with LeaseExpired: its lease ran out by
    its own clock while it stalled."""
    key = fresh_key("charge")
    with connect(postgres) as db_first, connect(postgres) as db_second:
        holder = StalledHolder(
            daemon, key, lambda _: None, lambda lease: charge_with(db_first, lease, account, CENTS)
        )

        def second_charge(lease: idemd.Lease) -> None:
            assert charge_with(db_second, lease, account, CENTS)

        second = take_over(daemon, key, second_charge)
        assert (second.key, second.attempt, second.recovered) == (key, 2, True)
        holder.resume(heal=False)
        outcome = holder.outcome()
    assert charges(postgres, key, account) == (attempts, OPENING - CENTS * len(attempts))
    assert isinstance(outcome, idemd.LeaseExpired), outcome
    if len(attempts) == 1:
        assert isinstance(outcome.__cause__, Fenced), outcome.__cause__


def test_the_recovering_caller_finds_the_stalled_holders_charge(
    daemon: Daemon, postgres: Postgres, account: str
) -> None:
    key = fresh_key("charge-reconcile")
    with connect(postgres) as db_first, connect(postgres) as db_second:
        holder = StalledHolder(
            daemon, key, lambda lease: charge(db_first, lease, account, CENTS), lambda _: None
        )
        charged: list[bool] = []
        second = take_over(
            daemon, key, lambda lease: charged.append(charge(db_second, lease, account, CENTS))
        )
        assert second.recovered
        assert charged == [False]
        holder.resume(heal=True)
        assert isinstance(holder.outcome(), idemd.LeaseExpired)
    assert charges(postgres, key, account) == ([1], OPENING - CENTS)


def test_a_stale_charge_between_the_look_up_and_the_charge(
    daemon: Daemon, postgres: Postgres, account: str
) -> None:
    """The recovering caller looks up and finds nothing; the stalled holder then charges;
    the recovering caller's charge must see it in its own transaction."""
    key = fresh_key("charge-race")
    with connect(postgres) as db_first, connect(postgres) as db_second:
        holder = StalledHolder(
            daemon, key, lambda _: None, lambda lease: charge(db_first, lease, account, CENTS)
        )
        charged: list[bool] = []

        def look_up_then_charge(lease: idemd.Lease) -> None:
            row = db_second.execute("SELECT EXISTS (SELECT 1 FROM ledger WHERE key = %s)", (key,)).fetchone()
            assert row == (False,)
            holder.resume(heal=False)
            holder.outcome()
            charged.append(charge(db_second, lease, account, CENTS))

        take_over(daemon, key, look_up_then_charge)
        assert charged == [False]
    assert charges(postgres, key, account) == ([1], OPENING - CENTS)


def test_charge_once_charges_once_and_replays(daemon: Daemon, postgres: Postgres, account: str) -> None:
    key = fresh_key("charge-once")
    client = idemd.Client(daemon.url)
    with connect(postgres) as db:
        results = [charge_once(client, db, key, account, CENTS) for _ in range(3)]
    assert [(r.response.status, r.response.body, r.replayed) for r in results] == [
        (201, b"charged", False),
        (201, b"charged", True),
        (201, b"charged", True),
    ]
    assert charges(postgres, key, account) == ([1], OPENING - CENTS)
