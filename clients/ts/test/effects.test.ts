// Exactly-once effects on a real PostgreSQL (docs/effects.md): a holder whose lease ran
// out while it stalled, and was taken over, charges a second time unless its write is
// fenced by the lease's attempt.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { charge, chargeOnce, chargeUnfenced, FencedError, schema } from "../examples/effects.js";
import { IdemClient, InProgressError, type Lease, LeaseExpiredError, LeaseLostError } from "../src/index.js";
import { Daemon, freshKey, waitFor } from "./daemon.js";
import { Postgres, skipReason } from "./postgres.js";

const account = "acct-1";
const opening = 10_000;
const cents = 500;

const skip = skipReason();
let daemon: Daemon;
let server: Postgres;
let db: pg.Pool;
before(async () => {
  if (skip) return;
  daemon = await Daemon.start();
  server = await Postgres.start();
  db = new pg.Pool({ connectionString: server.url });
  await db.query(schema);
});
after(async () => {
  if (skip) return;
  // The pool's end() resolves before its connections have closed; the server's shutdown
  // must not reach one still open, whose error would then reach no listener.
  let open = db.totalCount;
  const closed = new Promise<void>((resolve) => {
    if (open === 0) resolve();
    db.on("remove", () => {
      if (--open === 0) resolve();
    });
  });
  await db.end();
  await closed;
  await server.stop();
  await daemon.stop();
});

/** A fresh account for one test, so tests share the server but not their balances. */
async function openAccount(): Promise<string> {
  const id = freshKey(account);
  await db.query("INSERT INTO accounts VALUES ($1, $2)", [id, opening]);
  return id;
}

/** The charges made for key, by attempt, and the account's balance. */
async function charges(key: string, id: string): Promise<{ attempts: number[]; balance: number }> {
  const rows = await db.query<{ attempt: string }>("SELECT attempt FROM ledger WHERE key = $1 ORDER BY id", [key]);
  const balance = await db.query<{ balance_cents: string }>("SELECT balance_cents FROM accounts WHERE id = $1", [id]);
  return { attempts: rows.rows.map((r) => Number(r.attempt)), balance: Number(balance.rows[0]?.balance_cents) };
}

/**
 * Takes key with a client whose link to idemd is then cut, so that its renewals stop and
 * its lease runs out while it waits: before runs first, after once resume() is called
 * (with the link healed when heal is true). done settles with what run did.
 */
async function stalledHolder(
  key: string,
  before: (lease: Lease) => Promise<unknown>,
  after: (lease: Lease) => Promise<unknown>,
): Promise<{ resume: (heal: boolean) => void; done: Promise<unknown> }> {
  let cut = false;
  const linked: typeof fetch = (input, init) =>
    cut ? Promise.reject(new TypeError("link to idemd cut by the test")) : fetch(input, init);
  const holder = new IdemClient({ baseUrl: daemon.url, fetch: linked, retries: 0 });
  let resume: (heal: boolean) => void = () => undefined;
  const woken = new Promise<boolean>((resolve) => {
    resume = resolve;
  });
  let holding = false;
  const done = holder
    .run(
      key,
      async (_signal, lease) => {
        await before(lease);
        cut = true;
        holding = true;
        if (await woken) cut = false;
        // A holder back from a pause does not look at its signal first: that is the
        // case the fence is for.
        await after(lease);
        return "done";
      },
      { leaseMs: 300 },
    )
    .then(
      (value) => value,
      (err: unknown) => err,
    );
  await waitFor("the first holder to stall", () => holding);
  return { resume, done };
}

/** Runs work under key as soon as the stalled holder's lease has run out; resolves its lease. */
async function takeOver(key: string, work: (lease: Lease) => Promise<unknown>): Promise<Lease> {
  const client = new IdemClient({ baseUrl: daemon.url });
  let taken: Lease | undefined;
  await waitFor("the key to be taken over", async () => {
    try {
      await client.run(key, async (_signal, lease) => {
        taken = lease;
        await work(lease);
        return "taken over";
      });
      return true;
    } catch (err) {
      if (err instanceof InProgressError) return false;
      throw err;
    }
  });
  if (taken === undefined) throw new Error("no lease");
  return taken;
}

describe("exactly-once effects on PostgreSQL", { skip }, () => {
  for (const { name, chargeWith, attempts } of [
    { name: "fenced: the stalled holder is refused", chargeWith: charge, attempts: [2] },
    { name: "unfenced: the stalled holder charges again", chargeWith: chargeUnfenced, attempts: [2, 1] },
  ]) {
    test(`a holder stalled past its lease wakes after the takeover; ${name}`, async () => {
      const id = await openAccount();
      const key = freshKey("charge");
      let refused: unknown;
      const { resume, done } = await stalledHolder(
        key,
        async () => undefined,
        (lease) =>
          chargeWith(db, lease, id, cents).catch((err: unknown) => {
            refused = err;
            throw err;
          }),
      );
      const second = await takeOver(key, async (lease) => {
        assert.equal(await chargeWith(db, lease, id, cents), true);
      });
      assert.deepEqual(
        { key: second.key, attempt: second.attempt, recovered: second.recovered },
        { key, attempt: 2, recovered: true },
      );
      resume(false);
      const outcome = await done;
      assert.deepEqual(await charges(key, id), { attempts, balance: opening - cents * attempts.length });
      if (attempts.length === 1) assert.ok(refused instanceof FencedError, String(refused));
      // Its lease ran out by its own clock while its link was cut: run says so, whatever
      // fn did, and stores nothing.
      assert.ok(outcome instanceof LeaseExpiredError, String(outcome));
    });
  }

  test("a holder that charged and stalled before storing: the recovering caller finds the charge", async () => {
    const id = await openAccount();
    const key = freshKey("charge-reconcile");
    const { resume, done } = await stalledHolder(
      key,
      (lease) => charge(db, lease, id, cents),
      async () => undefined,
    );
    let charged: boolean | undefined;
    const second = await takeOver(key, async (lease) => {
      charged = await charge(db, lease, id, cents);
    });
    assert.equal(second.recovered, true);
    assert.equal(charged, false);
    resume(true);
    // Its result is not stored: its lease ran out by its own clock while its link was cut
    // (or, if that clock's timer lagged behind the link's return, idemd said so).
    const outcome = await done;
    assert.ok(outcome instanceof LeaseLostError, String(outcome));
    assert.deepEqual(await charges(key, id), { attempts: [1], balance: opening - cents });
  });

  test("a stalled holder that charges between the recovering caller's look-up and its charge", async () => {
    const id = await openAccount();
    const key = freshKey("charge-race");
    const { resume, done } = await stalledHolder(
      key,
      async () => undefined,
      (lease) => charge(db, lease, id, cents),
    );
    let charged: boolean | undefined;
    await takeOver(key, async (lease) => {
      const found = await db.query<{ charged: boolean }>(
        "SELECT EXISTS (SELECT 1 FROM ledger WHERE key = $1) AS charged",
        [lease.key],
      );
      assert.equal(found.rows[0]?.charged, false);
      resume(false);
      await done;
      charged = await charge(db, lease, id, cents);
    });
    assert.equal(charged, false);
    assert.deepEqual(await charges(key, id), { attempts: [1], balance: opening - cents });
  });

  test("chargeOnce charges once and replays the first answer", async () => {
    const id = await openAccount();
    const key = freshKey("charge-once");
    const client = new IdemClient({ baseUrl: daemon.url });
    const results = [];
    for (let i = 0; i < 3; i++) results.push(await chargeOnce(client, db, key, id, cents));
    assert.deepEqual(results, [
      { value: "charged", replayed: false },
      { value: "charged", replayed: true },
      { value: "charged", replayed: true },
    ]);
    assert.deepEqual(await charges(key, id), { attempts: [1], balance: opening - cents });
  });
});
