"""A charge made exactly once on PostgreSQL with the lease idemd hands ``run``'s
function: the fenced transaction of docs/effects.md. tests/test_effects.py proves it
against a real PostgreSQL and a real idemd, and shows the unfenced charge charging twice.
"""

from __future__ import annotations

import psycopg

import idemd

#: The service's own tables: accounts, the highest attempt that wrote per key, the charges.
SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance_cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS fences   (key text PRIMARY KEY, attempt bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ledger   (id bigserial PRIMARY KEY, key text NOT NULL, attempt bigint NOT NULL,
                                     account text NOT NULL, cents bigint NOT NULL);
"""

_FENCE = """
INSERT INTO fences AS f (key, attempt) VALUES (%s, %s)
ON CONFLICT (key) DO UPDATE SET attempt = EXCLUDED.attempt WHERE f.attempt < EXCLUDED.attempt
"""


class Fenced(Exception):
    """A charge refused because a later holder of the key has written: this one was
    taken over."""


def charge(db: psycopg.Connection, lease: idemd.Lease, account: str, cents: int) -> bool:
    """Debit ``account`` by ``cents`` under ``lease``, once for the lease's key.

    In one transaction it moves the key's fence up to the lease's attempt (raising
    :class:`Fenced` when a later holder has written), looks for a charge already made for
    the key, and makes it only if there is none. Returns False when an earlier holder
    had charged.

    The look-up is in the transaction, after the fence: the fence's row lock orders it
    after any holder's committed charge, so a stalled holder that wakes between a look-up
    and a charge cannot slip a second charge in.
    """
    with db.transaction():
        if db.execute(_FENCE, (lease.key, lease.attempt)).rowcount == 0:
            raise Fenced(f"a holder of {lease.key!r} later than attempt {lease.attempt} has written")
        row = db.execute("SELECT EXISTS (SELECT 1 FROM ledger WHERE key = %s)", (lease.key,)).fetchone()
        if row is not None and row[0]:
            return False  # the fence moved up: the earlier holder can write no more
        _debit(db, lease, account, cents)
        return True


def charge_unfenced(db: psycopg.Connection, lease: idemd.Lease, account: str, cents: int) -> bool:
    """:func:`charge` without the fence and the look-up: what a service that trusts the
    lease alone does. A holder that wakes up after its lease was taken over charges again."""
    with db.transaction():
        _debit(db, lease, account, cents)
        return True


def _debit(db: psycopg.Connection, lease: idemd.Lease, account: str, cents: int) -> None:
    db.execute(
        "INSERT INTO ledger (key, attempt, account, cents) VALUES (%s, %s, %s, %s)",
        (lease.key, lease.attempt, account, cents),
    )
    debited = db.execute(
        "UPDATE accounts SET balance_cents = balance_cents - %s WHERE id = %s", (cents, account)
    )
    if debited.rowcount != 1:
        raise LookupError(f"no account {account!r}")


def charge_once(
    client: idemd.Client, db: psycopg.Connection, key: str, account: str, cents: int
) -> idemd.Result:
    """The whole pattern: charge ``account`` by ``cents`` at most once for ``key`` through
    idemd, and exactly once in the database; every later call gets the first answer."""

    def work(lease: idemd.Lease) -> idemd.Response:
        # lease.attempt fences the write; lease.recovered says an earlier holder may have made it.
        if charge(db, lease, account, cents):
            return idemd.Response(201, body=b"charged")
        return idemd.Response(200, body=b"charged by an earlier holder")

    return client.run(key, work)
