// Natural batching against a real idemd, behind a GateProxy that holds the first
// requests so that calls gather behind them deterministically.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";
import { queuedCalls } from "../src/client.js";
import {
  type Claim,
  FingerprintMismatchError,
  IdemClient,
  IdemError,
  InProgressError,
  LeaseLostError,
  NotFoundError,
  ProblemError,
} from "../src/index.js";
import { Daemon, freshKey, waitFor } from "./daemon.js";
import { GateProxy } from "./proxy.js";

let daemon: Daemon;
let plain: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  plain = new IdemClient({ baseUrl: daemon.url, batching: false });
});
after(async () => {
  await daemon.stop();
});

/** A call's outcome, to assert on once all have settled. */
type Settled<T> = { value: T } | { error: unknown };

function settle<T>(p: Promise<T>): Promise<Settled<T>> {
  return p.then(
    (value) => ({ value }),
    (error: unknown) => ({ error }),
  );
}

function value<T>(s: Settled<T>): T {
  if ("error" in s) assert.fail(`unexpected error: ${String(s.error)}`);
  return s.value;
}

function error(s: Settled<unknown>): unknown {
  if ("value" in s) assert.fail(`unexpected value: ${JSON.stringify(s.value)}`);
  return s.error;
}

function paths(proxy: GateProxy): string[] {
  return proxy.received.map((r) => (r.path === "/v1/batch" ? `${r.path} of ${r.items}` : r.path));
}

/** Starts a client behind a proxy and sends a first claim that the proxy holds. */
async function heldClaim(proxy: GateProxy, client: IdemClient): Promise<{ held: Promise<Settled<Claim>> }> {
  const held = settle(client.claim(freshKey("held")));
  await waitFor("the first claim to reach the proxy", () => proxy.received.length === 1);
  // Wrapped, so that returning it does not wait for it.
  return { held };
}

describe("batching", () => {
  test("calls made while one is in flight go out as one batch, each answered as it would be alone", async () => {
    const proxy = await GateProxy.start(daemon.url);
    try {
      const client = new IdemClient({ baseUrl: proxy.url });
      const finished = freshKey("finished");
      const done = await plain.claim(finished, { fingerprint: "f" });
      if (done.outcome !== "acquired") assert.fail("not acquired");
      await plain.complete(finished, done.leaseToken, { status: 201, body: "made" });

      const { held } = await heldClaim(proxy, client);
      const k1 = freshKey("k1");
      const k2 = freshKey("k2");
      const calls = [
        client.claim(k1, { fingerprint: "a" }),
        client.claim(k1, { fingerprint: "b" }),
        client.claim(k1, { fingerprint: "a" }),
        client.claim(k2, { leaseMs: 60_000 }),
        client.claim(finished, { fingerprint: "f" }),
      ].map(settle);
      assert.equal(queuedCalls(client), 5);
      proxy.open();
      const [first, mismatch, busy, other, replay] = await Promise.all(calls);
      assert.equal(value(await held).outcome, "acquired");
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/batch of 5"]);

      const a1 = value(first!);
      const a2 = value(other!);
      if (a1.outcome !== "acquired" || a2.outcome !== "acquired") assert.fail("not acquired");
      assert.equal(a1.attempt, 1);
      assert.ok(a1.leaseToken.length > 0);
      const mismatched = error(mismatch!);
      assert.ok(mismatched instanceof FingerprintMismatchError, String(mismatched));
      assert.equal(mismatched.status, 422);
      const inProgress = error(busy!);
      assert.ok(inProgress instanceof InProgressError, String(inProgress));
      assert.equal(inProgress.status, 409);
      assert.ok((inProgress.retryAfterMs ?? 0) > 0, `retryAfterMs ${inProgress.retryAfterMs}`);
      const replayed = value(replay!);
      assert.equal(replayed.outcome, "completed");
      assert.equal(replayed.response?.status, 201);
      assert.equal(Buffer.from(replayed.response?.body ?? []).toString(), "made");

      // Calls made in the same turn share a batch even with none in flight: a complete
      // and extends, one of them with a token that holds no lease.
      const [completed, extended, lost] = await Promise.all([
        settle(client.complete(k1, a1.leaseToken, { status: 200, body: "one" })),
        settle(client.extend(k2, a2.leaseToken, 120_000)),
        settle(client.extend(k2, "0123456789abcdef0123456789abcdef", 1000)),
      ]);
      assert.deepEqual(paths(proxy).slice(2), ["/v1/batch of 3"]);
      assert.equal(value(completed!), undefined);
      assert.ok(value(extended!).leaseExpiresAt > a2.leaseExpiresAt);
      assert.ok(error(lost!) instanceof LeaseLostError, String(error(lost!)));

      // Items on one key run in their order: the claim after the release replays it.
      const [released, again] = await Promise.all([
        settle(client.release(k2, a2.leaseToken, "fail", { response: { status: 402, body: "declined" } })),
        settle(client.claim(k2)),
      ]);
      assert.deepEqual(paths(proxy).slice(3), ["/v1/batch of 2"]);
      assert.equal(value(released!), undefined);
      const failed = value(again!);
      assert.equal(failed.outcome, "failed");
      assert.equal(failed.response?.status, 402);
      assert.equal((await plain.lookup(k1)).state, "completed");
    } finally {
      await proxy.close();
    }
  });

  test("a caller that gives up while queued is left out; the others are answered", async () => {
    const proxy = await GateProxy.start(daemon.url);
    try {
      const client = new IdemClient({ baseUrl: proxy.url });
      const { held } = await heldClaim(proxy, client);
      const gone = freshKey("gone");
      const stays = freshKey("stays");
      const controller = new AbortController();
      const left = settle(client.claim(gone, { signal: controller.signal }));
      const staying = settle(client.claim(stays));
      assert.equal(queuedCalls(client), 2);
      const reason = new Error("the caller left");
      controller.abort(reason);
      // Answered while the first request is still held.
      assert.equal(error(await left), reason);
      assert.equal(queuedCalls(client), 1);
      proxy.open();
      assert.equal(value(await held).outcome, "acquired");
      assert.equal(value(await staying).outcome, "acquired");
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/claim"]);
      await assert.rejects(plain.lookup(gone), NotFoundError);
      assert.equal((await plain.lookup(stays)).state, "pending");
    } finally {
      await proxy.close();
    }
  });

  test("a caller that gives up while its batch is in flight does not cut it off for the others", async () => {
    const proxy = await GateProxy.start(daemon.url, { hold: 2 });
    try {
      const client = new IdemClient({ baseUrl: proxy.url });
      const { held } = await heldClaim(proxy, client);
      const gone = freshKey("gone");
      const stays = freshKey("stays");
      const controller = new AbortController();
      const left = settle(client.claim(gone, { signal: controller.signal }));
      const staying = settle(client.claim(stays));
      proxy.open(0);
      assert.equal(value(await held).outcome, "acquired");
      await waitFor("the batch to reach the proxy", () => proxy.received.length === 2);
      const reason = new Error("the caller left");
      controller.abort(reason);
      assert.equal(error(await left), reason);
      proxy.open(1);
      assert.equal(value(await staying).outcome, "acquired");
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/batch of 2"]);
      // The batch went through whole: the claim of the caller that left took effect.
      assert.equal((await plain.lookup(gone)).state, "pending");
    } finally {
      await proxy.close();
    }
  });

  test("a daemon without the batch endpoint gets the batch's calls one by one, and no batch after", async () => {
    const proxy = await GateProxy.start(daemon.url, { batchStatus: 404 });
    try {
      const client = new IdemClient({ baseUrl: proxy.url });
      const { held } = await heldClaim(proxy, client);
      const k1 = freshKey("k1");
      const calls = [client.claim(k1), client.claim(k1), client.claim(freshKey("k2"))].map(settle);
      proxy.open();
      assert.equal(value(await held).outcome, "acquired");
      const [first, busy, other] = await Promise.all(calls);
      assert.equal(value(first!).outcome, "acquired");
      assert.ok(error(busy!) instanceof InProgressError, String(error(busy!)));
      assert.equal(value(other!).outcome, "acquired");
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/batch of 3", "/v1/claim", "/v1/claim", "/v1/claim"]);

      const later = await Promise.all([1, 2, 3, 4].map(() => settle(client.claim(freshKey("later")))));
      for (const s of later) assert.equal(value(s).outcome, "acquired");
      assert.equal(proxy.received.filter((r) => r.path === "/v1/batch").length, 1);
      assert.equal(proxy.received.length, 9);
    } finally {
      await proxy.close();
    }
  });

  test("a batch refused whole as too large is sent call by call, and batching stays on", async () => {
    const proxy = await GateProxy.start(daemon.url, { batchStatus: 413 });
    try {
      const client = new IdemClient({ baseUrl: proxy.url });
      const { held } = await heldClaim(proxy, client);
      const calls = [client.claim(freshKey("a")), client.claim(freshKey("b"))].map(settle);
      proxy.open();
      assert.equal(value(await held).outcome, "acquired");
      for (const s of await Promise.all(calls)) assert.equal(value(s).outcome, "acquired");
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/batch of 2", "/v1/claim", "/v1/claim"]);

      const later = [client.claim(freshKey("c")), client.claim(freshKey("d"))].map(settle);
      for (const s of await Promise.all(later)) assert.equal(value(s).outcome, "acquired");
      assert.deepEqual(paths(proxy).slice(4), ["/v1/batch of 2", "/v1/claim", "/v1/claim"]);
    } finally {
      await proxy.close();
    }
  });

  test("an answer that is not idemd's is refused in a batch as on its own", async () => {
    const other = createServer((_req, res) => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end("{}");
    });
    await new Promise<void>((resolve) => other.listen(0, "127.0.0.1", resolve));
    const address = other.address();
    if (address === null || typeof address === "string") throw new Error("no address");
    const proxy = await GateProxy.start(`http://127.0.0.1:${address.port}`);
    try {
      const client = new IdemClient({ baseUrl: proxy.url });
      const { held } = await heldClaim(proxy, client);
      const calls: Promise<Settled<unknown>>[] = [
        settle<unknown>(client.claim(freshKey("a"))),
        settle<unknown>(client.extend(freshKey("b"), "0".repeat(32), 1000)),
      ];
      proxy.open();
      for (const s of [await held, ...(await Promise.all(calls))]) {
        const err = error(s);
        assert.ok(err instanceof IdemError && !(err instanceof ProblemError), String(err));
        assert.match(err.message, /is the base URL idemd's\?/);
      }
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/batch of 2"]);
    } finally {
      await proxy.close();
      other.close();
    }
  });

  test("with batching off every call is its own request", async () => {
    const proxy = await GateProxy.start(daemon.url);
    try {
      const client = new IdemClient({ baseUrl: proxy.url, batching: false });
      const { held } = await heldClaim(proxy, client);
      const calls = [client.claim(freshKey("a")), client.claim(freshKey("b"))].map(settle);
      await waitFor("both calls to reach the proxy", () => proxy.received.length === 3);
      proxy.open();
      assert.equal(value(await held).outcome, "acquired");
      for (const s of await Promise.all(calls)) assert.equal(value(s).outcome, "acquired");
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/claim", "/v1/claim"]);
    } finally {
      await proxy.close();
    }
  });

  test("a claim that waits is sent on its own", async () => {
    const proxy = await GateProxy.start(daemon.url);
    try {
      const client = new IdemClient({ baseUrl: proxy.url });
      const { held } = await heldClaim(proxy, client);
      const key = freshKey("waits");
      const calls = [client.claim(freshKey("a")), client.claim(key, { waitMs: 1000 })].map(settle);
      await waitFor("the waiting claim to reach the proxy", () => proxy.received.length === 2);
      assert.equal(queuedCalls(client), 1);
      proxy.open();
      assert.equal(value(await held).outcome, "acquired");
      for (const s of await Promise.all(calls)) assert.equal(value(s).outcome, "acquired");
      assert.deepEqual(paths(proxy), ["/v1/claim", "/v1/claim", "/v1/claim"]);
    } finally {
      await proxy.close();
    }
  });
});
