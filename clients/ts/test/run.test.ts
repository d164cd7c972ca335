import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  FailedError,
  IdemClient,
  InProgressError,
  LeaseExpiredError,
  LeaseLostError,
  messageKey,
  NotFoundError,
  PermanentError,
} from "../src/index.js";
import { Daemon, freshKey, scaled, waitFor } from "./daemon.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

describe("run", () => {
  test("runs fn once and replays its stored value", async () => {
    const key = freshKey("run");
    let calls = 0;
    const send = async () => {
      calls++;
      return { id: 42, to: "a@example.org" };
    };
    const first = await client.run(key, send);
    assert.deepEqual(first, { value: { id: 42, to: "a@example.org" }, replayed: false });
    const second = await client.run(key, send);
    assert.deepEqual(second, { value: { id: 42, to: "a@example.org" }, replayed: true });
    assert.equal(calls, 1);
  });

  test("fn throwing releases the key, so the next run calls fn again", async () => {
    const key = freshKey("run-retry");
    const boom = new Error("smtp down");
    await assert.rejects(
      client.run(key, () => {
        throw boom;
      }),
      (err) => err === boom,
    );
    const record = await client.lookup(key);
    assert.equal(record.state, "released");
    const again = await client.run(key, () => "sent");
    assert.deepEqual(again, { value: "sent", replayed: false });
    assert.equal((await client.lookup(key)).attempt, 2);
  });

  test("a PermanentError is stored as a failure that later runs throw as a FailedError", async () => {
    const key = freshKey("run-permanent");
    await assert.rejects(
      client.run(key, () => {
        throw new PermanentError("card declined", { value: { reason: "insufficient_funds" } });
      }),
      PermanentError,
    );
    let called = false;
    const err = await client
      .run(key, () => {
        called = true;
      })
      .catch((e: unknown) => e);
    assert.ok(err instanceof FailedError, String(err));
    assert.equal(err.message, "card declined");
    assert.deepEqual(err.value, { reason: "insufficient_funds" });
    assert.equal(called, false);
  });

  test("another holder is an InProgressError; waitMs waits for its value", async () => {
    const key = freshKey("run-held");
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let started = false;
    const holder = client.run(key, async () => {
      started = true;
      await gate;
      return "first";
    });
    await waitFor("the first run to start", () => started);
    await assert.rejects(
      client.run(key, () => "second"),
      InProgressError,
    );
    const waiter = client.run(key, () => "second", { waitMs: 20_000 });
    release();
    assert.deepEqual(await holder, { value: "first", replayed: false });
    assert.deepEqual(await waiter, { value: "first", replayed: true });
  });

  test("the lease is renewed while fn runs: after three leases another caller still finds it held", async () => {
    const key = freshKey("run-renew");
    // Long enough that a renewal every leaseMs/3 keeps it on a loaded machine: scaled.
    const leaseMs = scaled(900);
    const other = new IdemClient({ baseUrl: daemon.url });
    const result = await client.run(
      key,
      async () => {
        const start = Date.now();
        let checks = 0;
        // Bounded: a claim every 50 ms (paced, not to starve the renewals) for three leases.
        while (Date.now() - start < 3 * leaseMs && checks < 1000) {
          await assert.rejects(other.claim(key), InProgressError);
          checks++;
          await sleep(50);
        }
        return checks;
      },
      { leaseMs },
    );
    assert.ok(result.value > 0);
    assert.equal((await client.lookup(key)).state, "completed");
  });

  test("a lost lease aborts fn's signal, and nothing is stored", async () => {
    const key = freshKey("run-lost");
    let purged = false;
    // The lease is long enough for the claim and a renewal to be answered on a busy
    // machine: with a short one, run may find it past its deadline before fn starts, or
    // see it run out unanswered, rather than learn from idemd that it was lost.
    const err = await client
      .run(
        key,
        async (signal) => {
          await client.purge(key);
          purged = true;
          await waitFor("fn's signal to abort", () => signal.aborted);
          throw signal.reason;
        },
        { leaseMs: scaled(3000) },
      )
      .catch((e: unknown) => e);
    assert.ok(purged, `fn did not purge the key: ${String(err)}`);
    assert.ok(err instanceof LeaseLostError && !(err instanceof LeaseExpiredError), String(err));
    await assert.rejects(client.lookup(key), NotFoundError);
  });

  test("the caller's signal aborts fn and releases the key for a retry", async () => {
    const key = freshKey("run-abort");
    const controller = new AbortController();
    const reason = new Error("shutting down");
    const err = await client
      .run(
        key,
        async (signal) => {
          controller.abort(reason);
          await waitFor("fn's signal to abort", () => signal.aborted);
          throw signal.reason;
        },
        { signal: controller.signal },
      )
      .catch((e: unknown) => e);
    assert.equal(err, reason);
    assert.equal((await client.lookup(key)).state, "released");
  });
});

describe("once and messageKey", () => {
  test("once runs a message's work once per key", async () => {
    const key = messageKey("orders", "partition-0", freshKey("offset"));
    let handled = 0;
    assert.equal(
      await client.once(key, () => {
        handled++;
      }),
      true,
    );
    assert.equal(
      await client.once(key, () => {
        handled++;
      }),
      false,
    );
    assert.equal(handled, 1);
  });

  test("messageKey gives the Go client's keys", () => {
    // Printed by the Go client's idem.MessageKey for the same parts.
    assert.equal(
      messageKey("orders", "partition-0", "42"),
      "msg-8b4d16a1f4415b1225b20cb8a76a17759840051bbf87485a70abae5bdf311a4c",
    );
    assert.equal(messageKey("ab", "c"), "msg-601d5476e2ccfe2c87a2bba7a322659734a05749d5b5aa781f513e4912db0d5f");
    assert.notEqual(messageKey("ab", "c"), messageKey("a", "bc"));
    assert.equal(messageKey("é"), "msg-1d9b2f68e31ef2b6730c67d7729ca6a523e7f19d8987ca7c72eb93cb3bb9d979");
  });
});
