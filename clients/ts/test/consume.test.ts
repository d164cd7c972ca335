// consume's verdicts for queue consumers: one table in every language (docs/queues.md).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  FailedError,
  IdemClient,
  InProgressError,
  type Lease,
  messageHeader,
  messageKey,
  PermanentError,
  stepKey,
  UnavailableError,
} from "../src/index.js";
import { Daemon, freePort, freshKey, stalledClient } from "./daemon.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

describe("consume", () => {
  test("acks a message it handled, and its redelivery without running fn", async () => {
    const key = stepKey(freshKey("req"), "charge");
    let runs = 0;
    const first = await client.consume(key, () => {
      runs++;
    });
    assert.deepEqual(first, { action: "ack", delayMs: 0, ran: true });
    const again = await client.consume(key, () => {
      runs++;
    });
    assert.deepEqual(again, { action: "ack", delayMs: 0, ran: false });
    assert.equal(runs, 1);
  });

  test("requeues a message whose key another consumer holds, after the lease's time", async () => {
    const key = stepKey(freshKey("req"), "charge");
    await client.claim(key, { leaseMs: 20_000 });
    let runs = 0;
    const v = await client.consume(key, () => {
      runs++;
    });
    assert.equal(v.action, "requeue");
    assert.equal(v.ran, false);
    assert.ok(v.error instanceof InProgressError);
    assert.ok(v.delayMs >= 10_000, `delay ${v.delayMs} ms`);
    assert.equal(runs, 0);
  });

  test("requeues a transient failure, and the redelivery runs fn again", async () => {
    const key = stepKey(freshKey("req"), "charge");
    const boom = new Error("the database is down");
    const failed = await client.consume(key, () => {
      throw boom;
    });
    assert.equal(failed.action, "requeue");
    assert.equal(failed.ran, true);
    assert.equal(failed.error, boom);
    assert.ok(failed.delayMs > 0);
    const again = await client.consume(key, () => undefined);
    assert.deepEqual(again, { action: "ack", delayMs: 0, ran: true });
  });

  test("dead-letters a permanent failure, and its redelivery without running fn", async () => {
    const key = stepKey(freshKey("req"), "charge");
    let runs = 0;
    const v = await client.consume(key, () => {
      runs++;
      throw new PermanentError("card declined");
    });
    assert.equal(v.action, "dead-letter");
    assert.equal(v.ran, true);
    const again = await client.consume(key, () => {
      runs++;
    });
    assert.equal(again.action, "dead-letter");
    assert.equal(again.ran, false);
    assert.ok(again.error instanceof FailedError);
    assert.equal(runs, 1);
  });

  test("never runs fn while idemd cannot be asked", async () => {
    const down = new IdemClient({ baseUrl: `http://127.0.0.1:${await freePort()}`, retries: 0 });
    let runs = 0;
    const v = await down.consume(stepKey(freshKey("req"), "charge"), () => {
      runs++;
    });
    assert.equal(v.action, "requeue");
    assert.equal(v.ran, false);
    assert.ok(v.error instanceof UnavailableError);
    assert.equal(runs, 0);
  });

  test("requeues a message whose outcome was not stored", async () => {
    const stalled = stalledClient(daemon.url);
    const v = await stalled.client.consume(stepKey(freshKey("req"), "charge"), () => {
      stalled.cut(true); // the work is done, but its outcome cannot be stored
    });
    assert.equal(v.action, "requeue");
    assert.equal(v.ran, true);
    assert.ok(v.error !== undefined);
  });

  test("hands fn the lease", async () => {
    const key = stepKey(freshKey("req"), "charge");
    let seen: Lease | undefined;
    await client.consume(key, (_signal, lease) => {
      seen = lease;
    });
    assert.deepEqual(seen && { key: seen.key, attempt: seen.attempt, recovered: seen.recovered }, {
      key,
      attempt: 1,
      recovered: false,
    });
  });
});

describe("stepKey", () => {
  test("is stable, separates steps and parts, and matches the Go client's", () => {
    const k = freshKey("req");
    assert.equal(stepKey(k, "charge"), stepKey(k, "charge"));
    assert.notEqual(stepKey(k, "charge"), stepKey(k, "email"));
    assert.notEqual(stepKey("a", "bc"), stepKey("ab", "c"));
    assert.equal(stepKey("k", "charge"), messageKey("step", "k", "charge"));
    // The same key in every idemd client.
    assert.equal(stepKey("req-1", "charge"), "msg-828aedf1c68eb588f35320345076e88dc90193e8a33ddf7b632f66ea0d1e46e8");
    assert.equal(messageHeader, "idemd-key");
  });
});
