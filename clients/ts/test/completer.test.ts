// The Completer against a real idemd: keys whose holders claimed them and went away are
// finished once each, by completers that run at the same time.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  Completer,
  type CompleterStats,
  IdemClient,
  type Lease,
  PermanentError,
  type ResponseInit,
} from "../src/index.js";
import { Daemon, freePort, freshKey, waitFor } from "./daemon.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

/** How many keys under prefix the feed lists now. */
async function listed(prefix: string): Promise<string[]> {
  const keys: string[] = [];
  for await (const k of client.abandonedKeys({ prefix })) keys.push(k.key);
  return keys.sort();
}

/**
 * Leaves each of keys pending under a lease that runs out, as a holder that died would:
 * every third with a fingerprint, every other with a recovery point. Resolves once the
 * feed lists them all, unless a completer running meanwhile may take them first.
 */
async function abandon(prefix: string, keys: string[], waitListed = true): Promise<void> {
  const holder = new IdemClient({ baseUrl: daemon.url, owner: "holder" });
  for (const [i, key] of keys.entries()) {
    const claim = await holder.claim(key, { leaseMs: 100, ...(i % 3 === 0 ? { fingerprint: `fp-${i}` } : {}) });
    if (claim.outcome !== "acquired") throw new Error(`${key} not acquired`);
    if (i % 2 === 0) await holder.recordRecoveryPoint(key, claim.leaseToken, "charged", `ch-${i}`);
  }
  if (!waitListed) return;
  const want = [...keys].sort();
  await waitFor("the holders' leases to run out", async () => {
    const now = await listed(prefix);
    return want.every((k) => now.includes(k));
  });
}

const result = (lease: Lease): ResponseInit => ({
  status: 201,
  headers: { "content-type": "text/plain" },
  body: `finished ${lease.key} from ${lease.recoveryPoint?.name ?? "the start"}`,
});

const sum = (a: CompleterStats, b: CompleterStats): CompleterStats => ({
  listed: a.listed + b.listed,
  finished: a.finished + b.finished,
  failed: a.failed + b.failed,
  skipped: a.skipped + b.skipped,
  errors: a.errors + b.errors,
});

describe("Completer", () => {
  test("two completers at once finish every abandoned key exactly once; a key held live is not run", async () => {
    const prefix = `${freshKey("cmp-two")}/`;
    const keys = Array.from({ length: 12 }, (_, i) => `${prefix}k${String(i).padStart(2, "0")}`);
    await abandon(prefix, keys);
    // A key someone holds right now is not abandoned: neither completer may run it.
    const live = await client.claim(`${prefix}live`, { leaseMs: 60_000 });
    assert.equal(live.outcome, "acquired");

    const runs = new Map<string, number>();
    const leases = new Map<string, Lease>();
    const handler = (_signal: AbortSignal, lease: Lease): ResponseInit => {
      runs.set(lease.key, (runs.get(lease.key) ?? 0) + 1);
      leases.set(lease.key, lease);
      return result(lease);
    };
    const completers = [0, 1].map(
      (i) =>
        new Completer(new IdemClient({ baseUrl: daemon.url, owner: `completer-${i}` }), {
          prefix,
          handler,
          leaseMs: 5000,
          concurrency: 3,
        }),
    );
    const [a, b] = await Promise.all(completers.map((c) => c.runOnce()));
    const total = sum(a!, b!);
    assert.equal(total.finished, keys.length);
    assert.equal(total.errors, 0);
    assert.equal(total.failed, 0);
    assert.equal(total.listed, total.finished + total.skipped);
    assert.deepEqual([...runs.keys()].sort(), keys);
    for (const key of keys) assert.equal(runs.get(key), 1, key);
    for (const [i, key] of keys.entries()) {
      const lease = leases.get(key)!;
      assert.equal(lease.recovered, true);
      assert.equal(lease.attempt, 2);
      assert.equal(lease.recoveryPoint?.name, i % 2 === 0 ? "charged" : undefined);
      const record = await client.lookup(key);
      assert.equal(record.state, "completed");
      assert.equal(record.response?.status, 201);
      assert.equal(Buffer.from(record.response!.body).toString(), result(lease).body);
    }
    assert.equal(runs.has(`${prefix}live`), false);
    assert.equal((await client.lookup(`${prefix}live`)).state, "pending");
    // Nothing is left: a pass now lists nothing.
    assert.deepEqual(await completers[0]!.runOnce(), { listed: 0, finished: 0, failed: 0, skipped: 0, errors: 0 });
  });

  test("a key taken meanwhile is skipped and a key finished meanwhile is skipped, neither run", async () => {
    const prefix = `${freshKey("cmp-skip")}/`;
    const keys = ["a", "b", "c"].map((n) => prefix + n);
    await abandon(prefix, keys);
    const other = new IdemClient({ baseUrl: daemon.url });
    const ran: string[] = [];
    const completer = new Completer(client, {
      prefix,
      concurrency: 1,
      leaseMs: 5000,
      handler: async (_signal, lease) => {
        ran.push(lease.key);
        if (ran.length === 1) {
          // While the first key runs, another caller takes one of the others over and
          // holds it, and finishes the third.
          const [held, done] = keys.filter((k) => k !== lease.key);
          const fp = (k: string) => (keys.indexOf(k) % 3 === 0 ? { fingerprint: `fp-${keys.indexOf(k)}` } : {});
          const claim = await other.claim(held!, { leaseMs: 60_000, ...fp(held!) });
          assert.equal(claim.outcome, "acquired");
          await other.run(done!, () => "finished by its caller", fp(done!));
        }
        return result(lease);
      },
    });
    const stats = await completer.runOnce();
    assert.deepEqual(stats, { listed: 3, finished: 1, failed: 0, skipped: 2, errors: 0 });
    assert.equal(ran.length, 1);
  });

  test("a handler's error leaves the key pending and it is listed again; a PermanentError is stored", async () => {
    const prefix = `${freshKey("cmp-err")}/`;
    const [flaky, broken] = [`${prefix}flaky`, `${prefix}broken`];
    await abandon(prefix, [flaky, broken]);
    const reported: [string, unknown][] = [];
    const completer = new Completer(client, {
      prefix,
      leaseMs: 1000,
      handler: (_signal, lease) => {
        if (lease.key === broken) throw new PermanentError("declined", { value: { code: 51 } });
        throw new Error("the provider is down");
      },
      onError: (key, err) => reported.push([key, err]),
    });
    const stats = await completer.runOnce();
    assert.deepEqual(stats, { listed: 2, finished: 0, failed: 1, skipped: 0, errors: 1 });
    assert.equal(reported.length, 1);
    assert.equal(reported[0]![0], flaky);
    assert.match(String(reported[0]![1]), /the provider is down/);
    assert.equal((await client.lookup(broken)).state, "failed");
    const pending = await client.lookup(flaky);
    assert.equal(pending.state, "pending");
    assert.equal(pending.attempt, 2);
    // Not released: once the completer's lease runs out, the feed lists it again.
    await waitFor("the key to be listed again", async () => (await listed(prefix)).includes(flaky));
    const again = (await client.abandoned({ prefix })).keys.find((k) => k.key === flaky);
    assert.equal(again?.attempt, 2);
  });

  test("run finishes keys as they are abandoned and stops when its signal aborts, after its handlers returned", async () => {
    const prefix = `${freshKey("cmp-run")}/`;
    const stop = new AbortController();
    let inFlight = 0;
    let blockedReturned = false;
    const finished = new Set<string>();
    const completer = new Completer(client, {
      prefix,
      leaseMs: 5000,
      pollIntervalMs: 50,
      handler: async (signal, lease) => {
        inFlight++;
        try {
          if (lease.key.endsWith("/blocks")) {
            // Holds on until run is stopped, which aborts its signal.
            await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
            blockedReturned = true;
            throw signal.reason;
          }
          finished.add(lease.key);
          return result(lease);
        } finally {
          inFlight--;
        }
      },
    });
    const running = completer.run(stop.signal);
    try {
      await abandon(prefix, [`${prefix}a`, `${prefix}blocks`], false);
      await waitFor("the first key to be finished", () => finished.has(`${prefix}a`));
      // A key abandoned while run goes on is found by a later pass.
      await abandon(prefix, [`${prefix}b`], false);
      await waitFor("the later key to be finished", () => finished.has(`${prefix}b`));
      await waitFor("the blocking handler to run", () => inFlight === 1);
    } finally {
      // A failed wait must not leave run going, which would keep the test process alive.
      stop.abort();
      await running;
    }
    assert.equal(inFlight, 0);
    assert.equal(blockedReturned, true);
    assert.equal((await client.lookup(`${prefix}a`)).state, "completed");
    assert.equal((await client.lookup(`${prefix}b`)).state, "completed");
    assert.equal((await client.lookup(`${prefix}blocks`)).state, "pending");
    // Nothing runs once run has returned: a key abandoned now stays pending.
    await abandon(prefix, [`${prefix}c`]);
    assert.equal(inFlight, 0);
    assert.equal(finished.has(`${prefix}c`), false);
    assert.equal((await client.lookup(`${prefix}c`)).state, "pending");
  });

  test("run keeps going while idemd is unreachable, reporting each pass, and stops when asked", async () => {
    const dead = new IdemClient({ baseUrl: `http://127.0.0.1:${await freePort()}`, retries: 0 });
    const errors: unknown[] = [];
    const stop = new AbortController();
    const completer = new Completer(dead, {
      prefix: "nowhere/",
      handler: () => ({ status: 200 }),
      onError: (key, err) => {
        assert.equal(key, "");
        errors.push(err);
      },
    });
    const running = completer.run(stop.signal);
    try {
      await waitFor("two failed passes", () => errors.length >= 2);
    } finally {
      stop.abort();
      await running;
    }
  });

  test("options are checked at construction", () => {
    const handler = () => ({ status: 200 });
    assert.throws(() => new Completer(client, { handler }), TypeError);
    assert.throws(() => new Completer(client, { prefix: "", handler }), TypeError);
    assert.throws(() => new Completer(client, { prefix: "x/", allKeys: true, handler }), TypeError);
    assert.throws(() => new Completer(client, { prefix: "x/", handler, concurrency: 0 }), RangeError);
    assert.throws(() => new Completer(client, { prefix: "x/", handler, leaseMs: 50 }), RangeError);
    assert.throws(() => new Completer(client, { prefix: "x".repeat(256), handler }), RangeError);
    assert.ok(new Completer(client, { allKeys: true, handler }));
  });
});
