// A charge made exactly once on PostgreSQL with the lease idemd hands run's function:
// the fenced transaction of docs/effects.md. test/effects.test.ts proves it against a
// real PostgreSQL and a real idemd, and shows the unfenced charge charging twice.
import type pg from "pg";
import type { IdemClient, Lease, RunResult } from "../src/index.js";

/** The service's own tables: accounts, the highest attempt that wrote per key, the charges. */
export const schema = `
CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance_cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS fences   (key text PRIMARY KEY, attempt bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ledger   (id bigserial PRIMARY KEY, key text NOT NULL, attempt bigint NOT NULL,
                                     account text NOT NULL, cents bigint NOT NULL);
`;

/** A charge refused because a later holder of the key has written: this one was taken over. */
export class FencedError extends Error {
  constructor(key: string, attempt: number) {
    super(`refused by the fence: a holder of ${JSON.stringify(key)} later than attempt ${attempt} has written`);
    this.name = "FencedError";
  }
}

/** What a charge needs of the database: a pg.Pool, or anything that lends clients alike. */
export type Database = Pick<pg.Pool, "connect">;

/**
 * Debits account by cents under lease, once for the lease's key. In one transaction it
 * moves the key's fence up to the lease's attempt (refusing with a FencedError when a
 * later holder has written), looks for a charge already made for the key, and makes it
 * only if there is none. Resolves false when an earlier holder had charged.
 *
 * The look-up is in the transaction, after the fence: the fence's row lock orders it
 * after any holder's committed charge, so a stalled holder that wakes between a look-up
 * and a charge cannot slip a second charge in.
 */
export async function charge(db: Database, lease: Lease, account: string, cents: number): Promise<boolean> {
  return inTransaction(db, async (tx) => {
    const fenced = await tx.query(
      `INSERT INTO fences AS f (key, attempt) VALUES ($1, $2)
       ON CONFLICT (key) DO UPDATE SET attempt = EXCLUDED.attempt WHERE f.attempt < EXCLUDED.attempt`,
      [lease.key, lease.attempt],
    );
    if (fenced.rowCount === 0) throw new FencedError(lease.key, lease.attempt);
    const found = await tx.query<{ charged: boolean }>(
      "SELECT EXISTS (SELECT 1 FROM ledger WHERE key = $1) AS charged",
      [lease.key],
    );
    if (found.rows[0]?.charged) return false; // the fence moved up: the earlier holder can write no more
    await debit(tx, lease, account, cents);
    return true;
  });
}

/**
 * charge without the fence and the look-up: what a service that trusts the lease alone
 * does. A holder that wakes up after its lease was taken over charges again.
 */
export async function chargeUnfenced(db: Database, lease: Lease, account: string, cents: number): Promise<boolean> {
  return inTransaction(db, async (tx) => {
    await debit(tx, lease, account, cents);
    return true;
  });
}

async function debit(tx: pg.PoolClient, lease: Lease, account: string, cents: number): Promise<void> {
  await tx.query("INSERT INTO ledger (key, attempt, account, cents) VALUES ($1, $2, $3, $4)", [
    lease.key,
    lease.attempt,
    account,
    cents,
  ]);
  const debited = await tx.query("UPDATE accounts SET balance_cents = balance_cents - $2 WHERE id = $1", [
    account,
    cents,
  ]);
  if (debited.rowCount !== 1) throw new Error(`no account ${JSON.stringify(account)}`);
}

async function inTransaction<T>(db: Database, fn: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
  const tx = await db.connect();
  try {
    await tx.query("BEGIN");
    const value = await fn(tx);
    await tx.query("COMMIT");
    return value;
  } catch (err) {
    await tx.query("ROLLBACK").catch(() => undefined);
    throw err;
  } finally {
    tx.release();
  }
}

/**
 * The whole pattern: charges account by cents at most once for key through idemd, and
 * exactly once in the database; every later call gets the first call's answer back.
 */
export async function chargeOnce(
  client: IdemClient,
  db: Database,
  key: string,
  account: string,
  cents: number,
): Promise<RunResult<string>> {
  // #region readme-effects
  return client.run(key, async (_signal, lease) => {
    // lease.attempt fences the write; lease.recovered says an earlier holder may have made it.
    const charged = await charge(db, lease, account, cents);
    return charged ? "charged" : "charged by an earlier holder";
  });
  // #endregion
}
