// The lease's local deadline: a holder cut off from idemd loses its lease by its own
// clock, at the send time of its claim or last answered renewal plus 95 % of the lease,
// rather than believing it holds a key idemd has given to someone else; renewals try
// harder as the deadline nears; healthy holders never lose their lease early.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { retryDelayMs } from "../src/client.js";
import { idemdKey } from "../src/fingerprint.js";
import {
  IdemClient,
  type Lease,
  LeaseExpiredError,
  LeaseLostError,
  NotFoundError,
  UnavailableError,
} from "../src/index.js";
import { frameworks, send, startApp } from "./apps.js";
import { Daemon, freshKey, scaled, stalledClient, waitFor } from "./daemon.js";
import { DelayProxy, GateProxy } from "./proxy.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

/**
 * A client whose link to idemd the test cuts and restores. It counts the requests that
 * failed while the link was cut, and keeps the time (performance.now()) each request
 * that went through was sent.
 */
function cuttableClient(): {
  client: IdemClient;
  cut: (on: boolean) => void;
  failed: () => number;
  sent: number[];
} {
  let cut = false;
  let failed = 0;
  const sent: number[] = [];
  const linked: typeof fetch = (input, init) => {
    if (!cut) {
      sent.push(performance.now());
      return fetch(input, init);
    }
    failed++;
    return Promise.reject(new TypeError("link to idemd cut by the test"));
  };
  return {
    client: new IdemClient({ baseUrl: daemon.url, fetch: linked, retries: 0 }),
    cut: (on) => {
      cut = on;
    },
    failed: () => failed,
    sent,
  };
}

/** The URL a fetch is for, without reading the request. */
const urlOf = (input: Parameters<typeof fetch>[0]) => (input instanceof Request ? input.url : String(input));

describe("retryDelayMs", () => {
  test("is drawn from [d/2, d], d the least of a sixth of the lease and a third of the time left", () => {
    for (const [leaseMs, leftMs, d] of [
      [30_000, 28_500, 5_000],
      [30_000, 6_000, 2_000],
      [300, 285, 50],
      [300, 90, 30],
      // At least 10 ms, even with no time left.
      [300, 15, 10],
      [300, -40, 10],
      [30, 28, 10],
    ] as const) {
      assert.equal(
        retryDelayMs(leaseMs, leftMs, () => 0),
        d / 2,
        `${leaseMs} ${leftMs}`,
      );
      assert.equal(
        retryDelayMs(leaseMs, leftMs, () => 1),
        d,
        `${leaseMs} ${leftMs}`,
      );
      for (let i = 0; i < 200; i++) {
        const delay = retryDelayMs(leaseMs, leftMs);
        assert.ok(delay >= d / 2 && delay <= d, `${delay} outside [${d / 2}, ${d}]`);
      }
    }
  });

  test("comes sooner as the deadline nears", () => {
    let previous = Infinity;
    for (const leftMs of [5_700, 3_000, 1_500, 600, 90, 0]) {
      const delay = retryDelayMs(6_000, leftMs, () => 0.5);
      assert.ok(delay <= previous, `${delay} after ${previous}`);
      assert.ok(delay < leftMs || delay <= 10, `${delay} with ${leftMs} ms left`);
      previous = delay;
    }
  });
});

describe("run under a lease whose link to idemd is cut", () => {
  test("the holder loses its lease by its own clock; the caller that takes the key over stores its result", async () => {
    const key = freshKey("deadline-cut");
    const leaseMs = 400;
    const holder = cuttableClient();
    let held: Lease | undefined;
    let finishedAt = 0;
    const sentAt = performance.now();
    const holding = holder.client
      .run(
        key,
        async (signal, lease) => {
          held = lease;
          holder.cut(true);
          await waitFor("the holder's signal to abort", () => signal.aborted);
          finishedAt = performance.now();
          // A result returned after the deadline is not reported as a success.
          return "late";
        },
        { leaseMs },
      )
      .then(
        (value) => value,
        (err: unknown) => err,
      );
    await waitFor("the holder to run", () => held !== undefined);
    // The other caller waits for the holder's lease to run out at idemd, then takes over.
    let taken: Lease | undefined;
    const other = await client.run(
      key,
      (_signal, lease) => {
        taken = lease;
        return "taken over";
      },
      { leaseMs: 5_000, waitMs: 10_000 },
    );
    const outcome = await holding;

    assert.ok(outcome instanceof LeaseExpiredError, String(outcome));
    assert.ok(outcome instanceof LeaseLostError);
    assert.equal(outcome.code, "lease_expired");
    // Its renewals failed for want of a link; the last failure is the cause.
    assert.ok(outcome.cause instanceof UnavailableError, String(outcome.cause));
    assert.equal(held?.signal.reason, outcome);
    // Reckoned from the claim's send, or, if it was renewed before the cut (a slow claim
    // is renewed before fn starts), from a renewal's: never from a later moment.
    const reckonedFrom = holder.sent.length === 1 ? sentAt : (holder.sent.at(-1) as number);
    assert.ok(
      held.deadline <= reckonedFrom + leaseMs,
      `deadline ${held.deadline - sentAt} ms after the claim's send, sends at ${holder.sent.map((t) => t - sentAt)}`,
    );
    assert.ok(finishedAt >= held.deadline, "the signal aborted before the deadline");
    assert.equal(held.remainingMs(), 0);

    assert.deepEqual(other, { value: "taken over", replayed: false });
    assert.deepEqual(taken && { attempt: taken.attempt, recovered: taken.recovered }, { attempt: 2, recovered: true });
    const record = await client.lookup(key);
    assert.equal(record.state, "completed");
    assert.equal(record.attempt, 2);
    assert.deepEqual(await client.run(key, () => "again"), { value: "taken over", replayed: true });
  });

  test("a link restored before the deadline keeps the lease: the work completes and is stored", async () => {
    const key = freshKey("deadline-blip");
    // Room for a loaded machine's failed renewals and the one answered after them.
    const leaseMs = scaled(2_000);
    const holder = cuttableClient();
    let initial = 0;
    const result = await holder.client.run(
      key,
      async (signal, lease) => {
        initial = lease.deadline;
        holder.cut(true);
        // Cut until two renewals have failed, well within the lease.
        await waitFor("two renewals to fail", () => holder.failed() >= 2);
        holder.cut(false);
        await waitFor("a renewal to be answered", () => lease.deadline > initial);
        assert.equal(signal.aborted, false);
        assert.ok(lease.remainingMs() > 0);
        return "kept";
      },
      { leaseMs },
    );
    assert.deepEqual(result, { value: "kept", replayed: false });
    const record = await client.lookup(key);
    assert.equal(record.state, "completed");
    assert.equal(record.attempt, 1);
  });

  test("a claim that waited renews before fn starts; the deadline is reckoned from that renewal", async () => {
    const key = freshKey("deadline-waited");
    const leaseMs = 1_500;
    let waiterSentAt: number | undefined;
    let holding = false;
    const first = client
      .run(key, async () => {
        holding = true;
        await waitFor("the second caller to claim", () => waiterSentAt !== undefined);
        // The second claim waits more than a third of its lease.
        await waitFor("a third of the lease to pass", () => performance.now() - (waiterSentAt ?? 0) > leaseMs / 3);
        throw new Error("the first caller gives up");
      })
      .catch((err: unknown) => err);
    let seen: number | undefined;
    await waitFor("the first caller to hold the key", () => holding);
    waiterSentAt = performance.now();
    const result = await client.run(
      key,
      (_signal, lease) => {
        seen = lease.deadline;
        return "second";
      },
      { leaseMs, waitMs: 10_000 },
    );
    assert.equal(((await first) as Error).message, "the first caller gives up");
    assert.deepEqual(result, { value: "second", replayed: false });
    // The claim's answer came more than leaseMs/3 after its send, and the renewal after it.
    assert.ok(
      seen !== undefined && seen > waiterSentAt + leaseMs / 3 + leaseMs * 0.95,
      `deadline ${(seen ?? 0) - waiterSentAt} ms after the claim's send`,
    );
  });

  test("a claim that waited and finds its lease gone when it renews does not run fn", async () => {
    const key = freshKey("deadline-waited-lost");
    const leaseMs = 600;
    let waiterSentAt: number | undefined;
    // The waiter's renewal reaches idemd after the key was deleted.
    const purging: typeof fetch = async (input, init) => {
      if (urlOf(input).endsWith("/v1/extend")) await client.purge(key);
      return fetch(input, init);
    };
    const waiter = new IdemClient({ baseUrl: daemon.url, fetch: purging, batching: false });
    let holding = false;
    const first = client
      .run(key, async () => {
        holding = true;
        await waitFor("the second caller to claim", () => waiterSentAt !== undefined);
        await waitFor("a third of the lease to pass", () => performance.now() - (waiterSentAt ?? 0) > leaseMs / 3);
        throw new Error("the first caller gives up");
      })
      .catch((err: unknown) => err);
    let ran = false;
    await waitFor("the first caller to hold the key", () => holding);
    waiterSentAt = performance.now();
    const outcome = await waiter
      .run(
        key,
        () => {
          ran = true;
          return "second";
        },
        { leaseMs, waitMs: 10_000 },
      )
      .catch((err: unknown) => err);
    await first;
    assert.ok(outcome instanceof LeaseLostError, String(outcome));
    assert.ok(!(outcome instanceof LeaseExpiredError), String(outcome));
    assert.equal(ran, false);
    await assert.rejects(client.lookup(key), NotFoundError);
  });
});

describe("no false alarms", () => {
  // A daemon of its own, its store in memory: the slowness is the proxy's, not a busy
  // disk's.
  let quiet: Daemon;
  before(async () => {
    quiet = await Daemon.startInMemory();
  });
  after(async () => {
    await quiet.stop();
  });

  test("holders renewing through a slow idemd, batched or not, keep every lease", async () => {
    const proxy = await DelayProxy.start(quiet.url, 20, 50);
    const clients = [new IdemClient({ baseUrl: proxy.url }), new IdemClient({ baseUrl: proxy.url, batching: false })];
    try {
      // Each holder's outcome: the deadlines it saw first and last, or why it failed.
      const outcomes: Promise<{ key: string; first: number; last: number } | { key: string; error: unknown }>[] = [];
      // Round by round, a holder of each lease length. Each starts once the one before it
      // holds its lease, so that the test measures renewals, not a burst of claims. The
      // leases are long enough that the stalls of a busy machine (of this process, the
      // proxy and idemd alike) do not pass for a slow idemd; an answer that takes half a
      // lease is the next test's.
      for (let i = 0; i < 20; i++) {
        for (const leaseMs of [2_000, 3_000, 4_000].map(scaled)) {
          const key = freshKey(`deadline-healthy-${leaseMs}`);
          const holder = clients[i % clients.length] as IdemClient;
          let first = 0;
          let started = false;
          const run = holder.run(
            key,
            async (signal, lease) => {
              first = lease.deadline;
              started = true;
              // The work itself lasts two leases; it ends early only if its lease is lost.
              await sleep(2 * leaseMs, undefined, { signal });
              return lease.deadline;
            },
            { leaseMs },
          );
          outcomes.push(
            run.then(
              ({ value, replayed }) => (replayed ? { key, error: "replayed" } : { key, first, last: value }),
              (error: unknown) => {
                started = true;
                return { key, error };
              },
            ),
          );
          await waitFor(`${key} to start`, () => started);
        }
      }
      const done = await Promise.all(outcomes);
      assert.deepEqual(
        done.flatMap((o) => ("error" in o ? [`${o.key}: ${String(o.error)}`] : [])),
        [],
      );
      const quietClient = new IdemClient({ baseUrl: quiet.url });
      for (const o of done) {
        if ("error" in o) continue;
        // The renewals were answered: the deadline moved on.
        assert.ok(o.last > o.first, `${o.key}: the deadline never moved`);
        assert.equal((await quietClient.lookup(o.key)).state, "completed", o.key);
      }
    } finally {
      await proxy.close();
    }
  });

  test("renewals that idemd answers after half a lease each keep it: the next is not held back", async () => {
    const leaseMs = 4_000;
    // Only the renewals are slow: the claim is answered at once, so fn starts with its
    // lease whole. Each renewal is answered after half a lease, later than a renewal
    // sent only once the one before it was answered could keep up with.
    const proxy = await GateProxy.start(quiet.url, {
      hold: 0,
      delayMs: (path) => (path === "/v1/extend" ? leaseMs / 2 : 0),
    });
    // Not batching: a batching client has one request in flight, so its renewals queue
    // behind one another.
    const holder = new IdemClient({ baseUrl: proxy.url, batching: false });
    try {
      const key = freshKey("deadline-slow");
      let first = 0;
      const result = await holder.run(
        key,
        async (signal, lease) => {
          first = lease.deadline;
          await sleep(2 * leaseMs, undefined, { signal });
          return lease.deadline;
        },
        { leaseMs },
      );
      assert.equal(result.replayed, false);
      assert.ok(result.value > first, "the deadline never moved");
      assert.ok(proxy.received.filter((r) => r.path === "/v1/extend").length >= 3);
      assert.equal((await new IdemClient({ baseUrl: quiet.url }).lookup(key)).state, "completed");
    } finally {
      await proxy.close();
    }
  });
});

describe("the middleware on a lease whose link to idemd is cut", () => {
  for (const framework of frameworks) {
    test(`${framework}: R16 lease_expired: the handler's signal aborts, 409 lease_lost, the retry that takes over is stored`, async () => {
      const holder = stalledClient(daemon.url);
      const cutApp = await startApp(framework, holder.client, client, { leaseMs: 400 });
      const app = await startApp(framework, client, client, { leaseMs: 5_000, waitMs: 10_000 });
      const key = freshKey("mw-deadline");
      const request = {
        headers: { "idempotency-key": `"${key}"`, "content-type": "application/json", "x-user": "user-1" },
        body: "{}",
      };
      try {
        const answer = send(`${cutApp.url}/slow`, request);
        await waitFor("the handler to run", () => cutApp.runs.get(`slow "${key}"`) === 1);
        holder.cut(true);
        const res = await answer;
        assert.equal(res.status, 409);
        assert.equal(JSON.parse(res.body).code, "lease_lost");
        assert.equal(res.headers["retry-after"], "1");
        await waitFor("the incident", () => cutApp.incidents.length > 0);
        assert.deepEqual(
          cutApp.incidents.map((i) => i.kind),
          ["lease_expired"],
        );
        assert.ok(cutApp.incidents[0]?.error instanceof LeaseExpiredError);
        assert.ok(cutApp.signals[0]?.reason instanceof LeaseExpiredError);

        // A retry through a working link waits for the lease to run out at idemd and
        // takes the key over; its answer is the one stored.
        const retrying = send(`${app.url}/slow`, request);
        await waitFor("the retry's handler to run", () => app.runs.get(`slow "${key}"`) === 1);
        app.open();
        const retry = await retrying;
        assert.equal(retry.status, 200);
        const replay = await send(`${app.url}/slow`, request);
        assert.equal(replay.headers["idempotent-replayed"], "true");
        const record = await client.lookup(idemdKey("user-1", key));
        assert.equal(record.state, "completed");
        assert.equal(record.attempt, 2);
      } finally {
        cutApp.open();
        await cutApp.close();
        await app.close();
      }
    });

    test(`${framework}: R12 before the handler: a claim that waited and finds its lease gone does not run it`, async () => {
      const key = freshKey("mw-waited-lost");
      const ikey = idemdKey("user-1", key);
      let claimedAt: number | undefined;
      const purging: typeof fetch = async (input, init) => {
        const url = urlOf(input);
        if (url.endsWith("/v1/claim")) claimedAt ??= performance.now();
        if (url.endsWith("/v1/extend")) await client.purge(ikey);
        return fetch(input, init);
      };
      const waiter = new IdemClient({ baseUrl: daemon.url, fetch: purging, batching: false });
      const holderApp = await startApp(framework, client, client, { leaseMs: 5_000 });
      const app = await startApp(framework, waiter, client, { leaseMs: 600, waitMs: 10_000 });
      const request = {
        headers: { "idempotency-key": `"${key}"`, "content-type": "application/json", "x-user": "user-1" },
        body: "{}",
      };
      try {
        const first = send(`${holderApp.url}/slow-fail`, request);
        await waitFor("the first handler to run", () => holderApp.runs.get(`slow-fail "${key}"`) === 1);
        const second = send(`${app.url}/slow-fail`, request);
        await waitFor("the second claim to wait a third of the lease", () => {
          return claimedAt !== undefined && performance.now() - claimedAt > 200;
        });
        // The first handler answers 500: its key is released to the waiting claim.
        holderApp.open();
        assert.equal((await first).status, 500);
        const res = await second;
        assert.equal(res.status, 409);
        assert.equal(JSON.parse(res.body).code, "lease_lost");
        assert.equal(res.headers["retry-after"], "1");
        await waitFor("the incident", () => app.incidents.length > 0);
        assert.deepEqual(
          app.incidents.map((i) => i.kind),
          ["lease_lost"],
        );
        assert.equal(app.runs.get(`slow-fail "${key}"`), undefined);
        await assert.rejects(client.lookup(ikey), NotFoundError);
      } finally {
        holderApp.open();
        app.open();
        await holderApp.close();
        await app.close();
      }
    });
  }
});
