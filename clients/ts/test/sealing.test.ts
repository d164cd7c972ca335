// Sealed results and recovery points (docs/sealing.md) against a real idemd: what the
// daemon and its store hold, rotation, the refusals, and every helper above the client
// (run, once, consume, the Completer, the Express and Fastify middleware).
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fingerprint, idemdKey } from "../src/fingerprint.js";
import {
  Completer,
  FailedError,
  IdemClient,
  IdemError,
  KeyRing,
  type Lease,
  PermanentError,
  type StoredResponse,
  UnsealableError,
} from "../src/index.js";
import { type App, frameworks, send, startApp } from "./apps.js";
import { Daemon, freshKey, waitFor } from "./daemon.js";

let daemon: Daemon;
/** A client without a ring. */
let plain: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  plain = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

const keyBytes = new Map<string, Buffer>();
/** A ring of the named keys, the first sealing; the same id is the same key bytes throughout. */
function ring(ids: string[], requireSealed = false): KeyRing {
  const keys = ids.map((id) => {
    if (!keyBytes.has(id)) keyBytes.set(id, randomBytes(32));
    return { id, key: keyBytes.get(id) as Buffer };
  });
  return new KeyRing(keys, { requireSealed });
}

function sealing(ids: string[], options: { tenant?: string; requireSealed?: boolean; batching?: boolean } = {}) {
  return new IdemClient({
    baseUrl: daemon.url,
    batching: options.batching ?? true,
    sealing: { tenant: options.tenant ?? "payments", ring: ring(ids, options.requireSealed) },
  });
}

interface RawRecord {
  state: string;
  response?: { status: number; headers?: unknown; body?: string; sealed?: string };
  recovery_point?: { name: string; data?: string };
}

/** The record as idemd answers it, read without the SDK. */
async function raw(key: string): Promise<RawRecord> {
  const res = await fetch(`${daemon.url}/v1/records/${encodeURIComponent(key)}`);
  assert.equal(res.status, 200);
  return (await res.json()) as RawRecord;
}

/** Every byte the daemon's store keeps on disk. */
function stored(): Buffer {
  const files: Buffer[] = [];
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else files.push(readFileSync(path));
    }
  };
  walk(daemon.dataDir);
  return Buffer.concat(files);
}

/** The key id an envelope names, checking its head. */
function envelopeKeyId(envelope: Buffer): string {
  assert.equal(envelope[0], 0xc1, "an envelope starts with 0xC1");
  assert.equal(envelope[1], 2, "version 2");
  return envelope.subarray(3, 3 + (envelope[2] as number)).toString("ascii");
}

const isUnsealable = (reason: string, keyId: string) => (err: unknown) => {
  assert.ok(err instanceof UnsealableError, `not an UnsealableError: ${String(err)}`);
  assert.ok(err instanceof IdemError);
  assert.equal(err.reason, reason);
  assert.equal(err.keyId, keyId);
  return true;
};

/** Claims key with client and stores response under the lease. */
async function finish(client: IdemClient, key: string, response: Parameters<IdemClient["complete"]>[2]) {
  const claim = await client.claim(key);
  assert.equal(claim.outcome, "acquired");
  if (claim.outcome !== "acquired") throw new Error("not acquired");
  await client.complete(key, claim.leaseToken, response);
}

async function replayed(client: IdemClient, key: string): Promise<StoredResponse | undefined> {
  const claim = await client.claim(key);
  assert.equal(claim.outcome, "completed");
  return claim.response;
}

/**
 * Plays whoever can write the store: replaces the record of key by one of the same
 * fingerprint finished by "complete" or a "fail" release with response (none when
 * undefined), an envelope copied as it is.
 */
async function rewrite(key: string, finish: "complete" | "fail", response?: RawRecord["response"]) {
  const { fingerprint } = (await raw(key)) as RawRecord & { fingerprint?: string };
  await plain.purge(key);
  const post = async (path: string, body: object) => {
    const res = await fetch(`${daemon.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const answer = (await res.json()) as { lease_token?: string };
    assert.ok(res.ok, `${path}: ${res.status} ${JSON.stringify(answer)}`);
    return answer;
  };
  const { lease_token } = await post("/v1/claim", fingerprint ? { key, fingerprint } : { key });
  const finished = { key, lease_token, ...(response ? { response } : {}) };
  if (finish === "fail") await post("/v1/release", { ...finished, mode: "fail" });
  else await post("/v1/complete", finished);
}

describe("KeyRing", () => {
  test("parse reads id=base64 entries by commas and lines, skips comments, the first seals", () => {
    const a = randomBytes(32).toString("base64");
    const b = randomBytes(32).toString("base64");
    const c = randomBytes(32).toString("base64");
    const parsed = KeyRing.parse(`# the ring\n  k-2026-11 = ${a} ,k.2026_05=${b}\n\n#old=${c}\nops_1=${c},\n`);
    assert.equal(parsed.sealingKeyId, "k-2026-11");
    assert.deepEqual(parsed.keyIds, ["k-2026-11", "k.2026_05", "ops_1"]);
    assert.equal(parsed.requireSealed, false);
    assert.equal(KeyRing.parse(`k=${a}`, { requireSealed: true }).requireSealed, true);
  });

  test("refuses what is not a ring, naming the entry and never the key", () => {
    const good = randomBytes(32).toString("base64");
    const cases: [string, RegExp][] = [
      ["", /at least one key/],
      ["# only a comment", /at least one key/],
      ["k-1", /entry 0 is not id=base64/],
      [`=${good}`, /key id ""/],
      [`bad id=${good}`, /key id "bad id"/],
      [`${"x".repeat(33)}=${good}`, /1 to 32/],
      [`k=${randomBytes(16).toString("base64")}`, /"k" is 16 bytes/],
      [`k=${good.slice(0, -1)}`, /"k": not standard base64/],
      [`k=${good.replace(/=$/, "")}`, /"k": not standard base64/],
      [`k=${good},k=${randomBytes(32).toString("base64")}`, /"k" is in the ring twice/],
    ];
    for (const [text, message] of cases) {
      assert.throws(
        () => KeyRing.parse(text),
        (err: unknown) => {
          assert.ok(err instanceof TypeError, text);
          assert.match(err.message, message, text);
          assert.ok(!err.message.includes(good), "the message holds no key");
          return true;
        },
      );
    }
    assert.throws(() => new KeyRing([]), /at least one key/);
    assert.throws(() => new KeyRing([{ id: "k", key: new Uint8Array(31) }]), /"k" is 31 bytes/);
  });

  test("the key bytes are the ring's own copy, and sealing needs a tenant and a ring", () => {
    const bytes = randomBytes(32);
    const r = new KeyRing([{ id: "k", key: bytes }]);
    assert.ok(!JSON.stringify(r).includes(bytes.toString("base64")));
    assert.throws(() => new IdemClient({ baseUrl: daemon.url, sealing: { tenant: "", ring: r } }), TypeError);
    assert.throws(
      () => new IdemClient({ baseUrl: daemon.url, sealing: { tenant: "t", ring: {} as KeyRing } }),
      TypeError,
    );
  });
});

describe("sealed results", () => {
  test("complete seals: idemd and its store hold an envelope; the sealing client opens it exactly", async () => {
    const client = sealing(["k-rt"]);
    const key = freshKey("sealed-rt");
    const secret = `ada-${randomBytes(8).toString("hex")}@example.com`;
    const response = {
      status: 201,
      headers: { "Content-Type": "application/json", Location: ["/orders/1001"], "X-Many": ["one", "two", "café"] },
      body: JSON.stringify({ id: "ch_1", email: secret }),
    };
    await finish(client, key, response);

    const record = await raw(key);
    assert.equal(record.state, "completed");
    assert.equal(record.response?.status, 201);
    assert.equal(record.response?.headers, undefined);
    assert.equal(record.response?.body, undefined);
    const envelope = Buffer.from(record.response?.sealed ?? "", "base64");
    assert.equal(envelopeKeyId(envelope), "k-rt");
    assert.equal(envelope.indexOf(secret), -1);
    // The embedded store keeps a body as JSON's base64 of it; neither form is on disk.
    const disk = stored();
    assert.equal(disk.indexOf(secret), -1, "the store's files hold the secret");
    assert.equal(disk.indexOf(Buffer.from(response.body).toString("base64")), -1, "the store's files hold the body");
    // The scan finds a plain result's body: it looks where the results are.
    const control = `plain-${randomBytes(8).toString("hex")}`;
    await finish(plain, freshKey("plain-control"), { status: 200, body: control });
    assert.notEqual(stored().indexOf(Buffer.from(control).toString("base64")), -1);

    const want = {
      status: 201,
      headers: { "Content-Type": ["application/json"], Location: ["/orders/1001"], "X-Many": ["one", "two", "café"] },
      body: Buffer.from(response.body),
    };
    const again = await replayed(client, key);
    assert.deepEqual({ ...again, body: Buffer.from(again?.body ?? []) }, want);
    const looked = await client.lookup(key);
    assert.deepEqual({ ...looked.response, body: Buffer.from(looked.response?.body ?? []) }, want);

    // Without a ring the envelope is never handed on as a body.
    await assert.rejects(plain.claim(key), isUnsealable("unknown_key", "k-rt"));
    await assert.rejects(plain.lookup(key), isUnsealable("unknown_key", "k-rt"));
  });

  test("batched completes and failing releases are sealed, and their replays open", async () => {
    let batches = 0;
    const client = new IdemClient({
      baseUrl: daemon.url,
      sealing: { tenant: "payments", ring: ring(["k-batch"]) },
      fetch: (input, init) => {
        const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
        if (url.endsWith("/v1/batch")) batches++;
        return fetch(input, init);
      },
    });
    const keys = Array.from({ length: 6 }, (_, i) => freshKey(`sealed-batch-${i}`));
    const claims = await Promise.all(keys.map((key) => client.claim(key)));
    await Promise.all(
      keys.map((key, i) => {
        const claim = claims[i];
        if (claim?.outcome !== "acquired") throw new Error(`${key} not acquired`);
        const response = { status: i % 2 === 0 ? 200 : 402, body: `secret answer ${i}` };
        return i % 2 === 0
          ? client.complete(key, claim.leaseToken, response)
          : client.release(key, claim.leaseToken, "fail", { response });
      }),
    );
    assert.ok(batches > 0, "no call went in a batch");
    for (const [i, key] of keys.entries()) {
      const record = await raw(key);
      assert.equal(record.state, i % 2 === 0 ? "completed" : "failed");
      assert.equal(record.response?.body, undefined);
      assert.ok(!Buffer.from(record.response?.sealed ?? "", "base64").includes("secret answer"));
      // The batched claims open what they replay.
      const again = await Promise.all([client.claim(key), client.claim(key)]);
      for (const claim of again) {
        if (claim.outcome === "acquired") throw new Error(`${key} acquired again`);
        assert.equal(claim.outcome, i % 2 === 0 ? "completed" : "failed");
        assert.equal(claim.response?.status, i % 2 === 0 ? 200 : 402);
        assert.equal(Buffer.from(claim.response?.body ?? []).toString(), `secret answer ${i}`);
      }
    }
  });

  test("rotation: what [old] sealed opens with [new, old], which seals with new; [new] alone names old", async () => {
    const key = freshKey("sealed-rotate");
    await finish(sealing(["k-old"]), key, { status: 200, headers: { "content-type": "text/plain" }, body: "v1" });

    const rotated = sealing(["k-new", "k-old"]);
    const opened = await replayed(rotated, key);
    assert.equal(Buffer.from(opened?.body ?? []).toString(), "v1");
    assert.deepEqual(opened?.headers, { "content-type": ["text/plain"] });

    const fresh = freshKey("sealed-rotate-new");
    await finish(rotated, fresh, { status: 200, body: "v2" });
    const envelope = Buffer.from((await raw(fresh)).response?.sealed ?? "", "base64");
    assert.equal(envelopeKeyId(envelope), "k-new");

    const dropped = sealing(["k-new"]);
    await assert.rejects(dropped.claim(key), isUnsealable("unknown_key", "k-old"));
    assert.equal(Buffer.from((await replayed(dropped, fresh))?.body ?? []).toString(), "v2");
  });

  test("an envelope does not open under another tenant, nor with other bytes under the same id", async () => {
    const key = freshKey("sealed-moved");
    await finish(sealing(["k-tenant"]), key, { status: 200, body: "mine" });
    await assert.rejects(sealing(["k-tenant"], { tenant: "orders" }).claim(key), isUnsealable("invalid", "k-tenant"));
    const impostor = new IdemClient({
      baseUrl: daemon.url,
      sealing: { tenant: "payments", ring: new KeyRing([{ id: "k-tenant", key: randomBytes(32) }]) },
    });
    await assert.rejects(impostor.lookup(key), isUnsealable("invalid", "k-tenant"));
  });

  test("require sealed refuses a plain result (not_sealed); a ring that allows plain passes it through", async () => {
    const key = freshKey("sealed-plain");
    await finish(plain, key, { status: 200, headers: { "content-type": "text/plain" }, body: "plain" });
    const strict = sealing(["k-strict"], { requireSealed: true });
    await assert.rejects(strict.claim(key), isUnsealable("not_sealed", ""));
    await assert.rejects(strict.lookup(key), isUnsealable("not_sealed", ""));
    let ran = false;
    await assert.rejects(
      strict.run(key, () => {
        ran = true;
      }),
      isUnsealable("not_sealed", ""),
    );
    assert.equal(ran, false);

    const lenient = sealing(["k-strict"]);
    const passed = await replayed(lenient, key);
    assert.equal(Buffer.from(passed?.body ?? []).toString(), "plain");
    assert.deepEqual(passed?.headers, { "content-type": ["text/plain"] });
  });
});

describe("what the store's writer cannot change", () => {
  test("a failure's envelope stored as a completed result, or a success's as a failure, does not open", async () => {
    const cases = [
      { stored: "fail" as const, swapTo: "complete" as const, status: 402 },
      { stored: "complete" as const, swapTo: "fail" as const, status: 201 },
    ];
    for (const { stored, swapTo, status } of cases) {
      const key = freshKey("sealed-outcome");
      const client = sealing(["k-outcome"]);
      const claim = await client.claim(key);
      if (claim.outcome !== "acquired") throw new Error("not acquired");
      const response = { status, headers: { "content-type": "text/plain" }, body: "declined or made" };
      if (stored === "fail") await client.release(key, claim.leaseToken, "fail", { response });
      else await client.complete(key, claim.leaseToken, response);
      const before = await raw(key);
      assert.equal(envelopeKeyId(Buffer.from(before.response?.sealed ?? "", "base64")), "k-outcome");
      await rewrite(key, swapTo, before.response);
      const after = await raw(key);
      assert.equal(after.state, swapTo === "fail" ? "failed" : "completed");
      assert.equal(after.response?.sealed, before.response?.sealed);
      for (const reader of [sealing(["k-outcome"], { requireSealed: true }), sealing(["k-outcome"])]) {
        let ran = false;
        await assert.rejects(reader.claim(key), isUnsealable("invalid", "k-outcome"));
        await assert.rejects(reader.lookup(key), isUnsealable("invalid", "k-outcome"));
        await assert.rejects(
          reader.run(key, () => {
            ran = true;
          }),
          isUnsealable("invalid", "k-outcome"),
        );
        assert.equal(ran, false, "the work ran");
      }
    }
  });

  test("require sealed: a sealing client's failure without a response is sealed; an unsealed failure is not_sealed", async () => {
    const client = sealing(["k-bare"]);
    const strict = sealing(["k-bare"], { requireSealed: true });
    const bare = freshKey("sealed-bare-failure");
    const claim = await client.claim(bare);
    if (claim.outcome !== "acquired") throw new Error("not acquired");
    await client.release(bare, claim.leaseToken, "fail");
    const record = await raw(bare);
    assert.equal(record.state, "failed");
    assert.equal(record.response?.status, 500);
    assert.equal(envelopeKeyId(Buffer.from(record.response?.sealed ?? "", "base64")), "k-bare");
    const replay = await strict.claim(bare);
    assert.equal(replay.outcome, "failed");
    assert.equal(replay.outcome === "failed" ? replay.response : "acquired", undefined);
    assert.equal((await strict.lookup(bare)).response, undefined);

    const key = freshKey("sealed-unsealed-failure");
    await finish(client, key, { status: 201, body: "order made" });
    await rewrite(key, "fail");
    const swapped = await raw(key);
    assert.equal(swapped.state, "failed");
    assert.equal(swapped.response, undefined);
    let ran = false;
    const work = () => {
      ran = true;
    };
    await assert.rejects(strict.claim(key), isUnsealable("not_sealed", ""));
    await assert.rejects(strict.lookup(key), isUnsealable("not_sealed", ""));
    await assert.rejects(strict.run(key, work), isUnsealable("not_sealed", ""));
    await assert.rejects(strict.once(key, work), isUnsealable("not_sealed", ""));
    const verdict = await strict.consume(key, work);
    assert.equal(verdict.action, "requeue");
    isUnsealable("not_sealed", "")(verdict.error);
    assert.equal(ran, false, "the work ran");
    await assert.rejects(client.run(key, work), FailedError);
    assert.equal(ran, false, "the work ran");
  });
});

describe("run, once and consume with sealing", () => {
  test("run stores its value sealed and replays it; with the wrong ring it throws and runs nothing", async () => {
    const key = freshKey("sealed-run");
    const client = sealing(["k-run"]);
    let runs = 0;
    const first = await client.run(key, () => ({ charge: "ch_secret", n: ++runs }));
    assert.deepEqual(first, { value: { charge: "ch_secret", n: 1 }, replayed: false });
    assert.ok(!Buffer.from((await raw(key)).response?.sealed ?? "", "base64").includes("ch_secret"));
    assert.deepEqual(await client.run(key, () => ++runs), { value: { charge: "ch_secret", n: 1 }, replayed: true });

    const wrong = sealing(["k-other"]);
    await assert.rejects(
      wrong.run(key, () => ++runs),
      isUnsealable("unknown_key", "k-run"),
    );
    await assert.rejects(
      wrong.once(key, () => {
        runs++;
      }),
      isUnsealable("unknown_key", "k-run"),
    );
    await assert.rejects(
      plain.run(key, () => ++runs),
      isUnsealable("unknown_key", "k-run"),
    );
    assert.equal(runs, 1, "the work ran again");
  });

  test("consume requeues a message whose result does not open, with the error, without running fn", async () => {
    const key = freshKey("sealed-consume");
    const client = sealing(["k-consume"]);
    let runs = 0;
    assert.deepEqual(
      await client.consume(key, () => {
        runs++;
      }),
      { action: "ack", delayMs: 0, ran: true },
    );
    const verdict = await sealing(["k-elsewhere"]).consume(key, () => {
      runs++;
    });
    assert.equal(verdict.action, "requeue");
    assert.ok(verdict.delayMs > 0);
    assert.equal(verdict.ran, false);
    isUnsealable("unknown_key", "k-consume")(verdict.error);
    assert.equal(runs, 1);
  });

  test("a PermanentError's failure is stored sealed and replays as a FailedError", async () => {
    const key = freshKey("sealed-permanent");
    const client = sealing(["k-fail"]);
    await assert.rejects(
      client.run(key, () => {
        throw new PermanentError("card declined", { value: { card: "4242-secret" } });
      }),
      PermanentError,
    );
    const record = await raw(key);
    assert.equal(record.state, "failed");
    assert.ok(!Buffer.from(record.response?.sealed ?? "", "base64").includes("4242-secret"));
    await assert.rejects(
      client.run(key, () => "ran again"),
      (err) => err instanceof FailedError && err.message === "card declined",
    );
  });
});

describe("sealed recovery points", () => {
  test("a checkpoint is sealed; the next holder after a retry release and lookup open it", async () => {
    const key = freshKey("sealed-point");
    const client = sealing(["k-point"]);
    const secret = `ch_${randomBytes(6).toString("hex")}`;
    await assert.rejects(
      client.run(key, async (_signal, lease) => {
        await lease.checkpoint("charged", secret);
        throw new Error("crashed after the charge");
      }),
      /crashed after the charge/,
    );
    const record = await raw(key);
    assert.equal(record.state, "released");
    assert.equal(record.recovery_point?.name, "charged");
    const data = Buffer.from(record.recovery_point?.data ?? "", "base64");
    assert.equal(envelopeKeyId(data), "k-point");
    assert.equal(data.indexOf(secret), -1);
    assert.equal(Buffer.from((await client.lookup(key)).recoveryPoint?.data ?? []).toString(), secret);
    // A client without a ring hands the data on as it is: a point has no mark of its own.
    assert.deepEqual(Buffer.from((await plain.lookup(key)).recoveryPoint?.data ?? []), data);

    let from: Lease["recoveryPoint"];
    const done = await client.run(key, (_signal, lease) => {
      from = lease.recoveryPoint;
      return "finished";
    });
    assert.equal(done.replayed, false);
    assert.equal(from?.name, "charged");
    assert.equal(Buffer.from(from?.data ?? []).toString(), secret);
  });

  test("a point that does not open stops the next holder; a plain one passes unless sealing is required", async () => {
    const sealedKey = freshKey("sealed-point-wrong");
    const holder = sealing(["k-holder"]);
    const claim = await holder.claim(sealedKey);
    if (claim.outcome !== "acquired") throw new Error("not acquired");
    await holder.recordRecoveryPoint(sealedKey, claim.leaseToken, "charged", "ch_1");
    await holder.release(sealedKey, claim.leaseToken, "retry");
    let ran = false;
    await assert.rejects(
      sealing(["k-stranger"]).run(sealedKey, () => {
        ran = true;
      }),
      isUnsealable("unknown_key", "k-holder"),
    );
    assert.equal(ran, false);
    // Released for a holder whose ring opens the point, which stays.
    const released = await raw(sealedKey);
    assert.equal(released.state, "released");
    assert.equal(released.recovery_point?.name, "charged");
    let resumed = "";
    await holder.run(sealedKey, (_signal, lease) => {
      resumed = Buffer.from(lease.recoveryPoint?.data ?? []).toString();
    });
    assert.equal(resumed, "ch_1");

    const plainKey = freshKey("plain-point");
    const first = await plain.claim(plainKey);
    if (first.outcome !== "acquired") throw new Error("not acquired");
    await plain.recordRecoveryPoint(plainKey, first.leaseToken, "charged", "ch_plain");
    await plain.release(plainKey, first.leaseToken, "retry");
    await assert.rejects(
      sealing(["k-holder"], { requireSealed: true }).lookup(plainKey),
      isUnsealable("not_sealed", ""),
    );
    const lenient = await sealing(["k-holder"]).lookup(plainKey);
    assert.equal(Buffer.from(lenient.recoveryPoint?.data ?? []).toString(), "ch_plain");

    // Binary data that begins with 0xC1 stays plain to a client without a ring.
    const binaryKey = freshKey("plain-binary-point");
    const binary = Buffer.from([0xc1, 0x00, 0x07, 0xff]);
    const held = await plain.claim(binaryKey);
    if (held.outcome !== "acquired") throw new Error("not acquired");
    await plain.recordRecoveryPoint(binaryKey, held.leaseToken, "raw", binary);
    assert.deepEqual(Buffer.from((await plain.lookup(binaryKey)).recoveryPoint?.data ?? []), binary);
  });

  test("the completer opens the abandoned point, stores its result sealed; with another ring it runs nothing", async () => {
    const prefix = `${freshKey("sealed-cmp")}/`;
    const key = `${prefix}order`;
    const holder = sealing(["k-cmp"]);
    const claim = await holder.claim(key, { leaseMs: 100 });
    if (claim.outcome !== "acquired") throw new Error("not acquired");
    await holder.recordRecoveryPoint(key, claim.leaseToken, "charged", "ch_cmp_secret");
    await waitFor("the holder's lease to run out", async () => {
      for await (const k of holder.abandonedKeys({ prefix })) if (k.key === key) return k.recoveryPoint === "charged";
      return false;
    });

    const errors: unknown[] = [];
    let strangerRan = false;
    const stranger = new Completer(sealing(["k-not-it"]), {
      prefix,
      leaseMs: 100,
      handler: () => {
        strangerRan = true;
        return { status: 200 };
      },
      onError: (_key, err) => errors.push(err),
    });
    const missed = await stranger.runOnce();
    assert.equal(missed.errors, 1);
    assert.equal(strangerRan, false);
    assert.equal(errors.length, 1);
    isUnsealable("unknown_key", "k-cmp")(errors[0]);

    // The stranger's claim took a lease it left to run out; the key is listed again then.
    await waitFor("the key to be listed again", async () => {
      for await (const k of holder.abandonedKeys({ prefix })) if (k.key === key) return true;
      return false;
    });
    let seen: Lease["recoveryPoint"];
    const completer = new Completer(sealing(["k-cmp"]), {
      prefix,
      handler: (_signal, lease) => {
        seen = lease.recoveryPoint;
        return { status: 201, headers: { "content-type": "text/plain" }, body: "refund of ch_cmp_secret" };
      },
    });
    const stats = await completer.runOnce();
    assert.equal(stats.finished, 1);
    assert.equal(Buffer.from(seen?.data ?? []).toString(), "ch_cmp_secret");
    const record = await raw(key);
    assert.equal(record.state, "completed");
    assert.equal(record.response?.body, undefined);
    assert.ok(!Buffer.from(record.response?.sealed ?? "", "base64").includes("ch_cmp_secret"));
    const replay = await replayed(holder, key);
    assert.equal(replay?.status, 201);
    assert.equal(Buffer.from(replay?.body ?? []).toString(), "refund of ch_cmp_secret");
  });
});

const order = (key: string, user = "user-1") => ({
  headers: { "idempotency-key": key, "content-type": "application/json", "x-user": user },
  body: JSON.stringify({ item: "book", email: "ada@example.com" }),
});

for (const framework of frameworks) {
  describe(`${framework} with sealing`, () => {
    let app: App;
    let stranger: App;
    let strict: App;
    let unsealed: App;
    before(async () => {
      unsealed = await startApp(framework, plain, plain);
      app = await startApp(framework, sealing(["k-mw"]), plain, { maxStoredBytes: 1000 });
      stranger = await startApp(framework, sealing(["k-mw-other"]), plain);
      strict = await startApp(framework, sealing(["k-mw"], { requireSealed: true }), plain);
    });
    after(async () => {
      await app.close();
      await stranger.close();
      await strict.close();
      await unsealed.close();
    });

    test("R1, P1: the answer is stored sealed and replays identically", async () => {
      const key = freshKey("mw-sealed");
      const first = await send(`${app.url}/orders`, order(key));
      assert.equal(first.status, 201);
      const record = await raw(idemdKey("user-1", key));
      assert.equal(record.response?.status, 201);
      assert.equal(record.response?.headers, undefined);
      const envelope = Buffer.from(record.response?.sealed ?? "", "base64");
      assert.equal(envelopeKeyId(envelope), "k-mw");
      assert.equal(envelope.indexOf("ada@example.com"), -1);

      const again = await send(`${app.url}/orders`, order(key));
      assert.equal(again.status, 201);
      assert.equal(again.body, first.body);
      assert.equal(again.headers["idempotent-replayed"], "true");
      assert.equal(again.headers["content-type"], first.headers["content-type"]);
      assert.equal(again.headers.location, "/orders/1");
      assert.equal(app.runs.get(`orders ${key}`), 1);
    });

    test("P5: a ring without the key answers 502 stored_response_unsealable and runs nothing", async () => {
      const key = freshKey("mw-unsealable");
      assert.equal((await send(`${app.url}/orders`, order(key))).status, 201);
      const before = stranger.incidents.length;
      const res = await send(`${stranger.url}/orders`, order(key));
      assert.equal(res.status, 502);
      assert.equal(res.headers["content-type"], "application/problem+json");
      assert.equal(JSON.parse(res.body).code, "stored_response_unsealable");
      assert.equal(res.headers["idempotent-replayed"], undefined);
      assert.ok(!res.body.includes("ada@example.com"));
      assert.equal(stranger.runs.get(`orders ${key}`), undefined, "the handler ran");
      const incidents = stranger.incidents.slice(before);
      assert.deepEqual(
        incidents.map((i) => [i.kind, i.idemdKey]),
        [["replay_unsealable", idemdKey("user-1", key)]],
      );
      isUnsealable("unknown_key", "k-mw")(incidents[0]?.error);
    });

    test("P5: a plain answer under a ring that requires sealing is 502, not replayed", async () => {
      const key = freshKey("mw-plain");
      // Stored before sealing was turned on, or slipped into the store.
      assert.equal((await send(`${unsealed.url}/orders`, order(key))).status, 201);
      const res = await send(`${strict.url}/orders`, order(key));
      assert.equal(res.status, 502);
      assert.equal(JSON.parse(res.body).code, "stored_response_unsealable");
      assert.equal(strict.runs.get(`orders ${key}`), undefined);
      const incident = strict.incidents.find((i) => i.idemdKey === idemdKey("user-1", key));
      assert.equal(incident?.kind, "replay_unsealable");
      isUnsealable("not_sealed", "")(incident?.error);
    });

    test("P5: a recovery point that does not open runs nothing, and the key is released for a retry", async () => {
      const key = freshKey("mw-point");
      const derived = idemdKey("user-1", key);
      const request = order(key);
      const fp = fingerprint({
        method: "POST",
        path: "/orders",
        query: "",
        contentType: "application/json",
        body: Buffer.from(request.body),
      });
      // A holder whose ring the app does not hold recorded a point and gave the key back.
      const holder = sealing(["k-mw-other"]);
      const claim = await holder.claim(derived, { fingerprint: fp.fingerprint });
      if (claim.outcome !== "acquired") throw new Error("not acquired");
      await holder.recordRecoveryPoint(derived, claim.leaseToken, "charged", "ch_mw");
      await holder.release(derived, claim.leaseToken, "retry");

      const res = await send(`${app.url}/orders`, request);
      assert.equal(res.status, 502);
      assert.equal(JSON.parse(res.body).code, "stored_response_unsealable");
      assert.equal(app.runs.get(`orders ${key}`), undefined, "the handler ran");
      const incident = app.incidents.find((i) => i.idemdKey === derived);
      assert.equal(incident?.kind, "replay_unsealable");
      isUnsealable("unknown_key", "k-mw-other")(incident?.error);
      const record = await raw(derived);
      assert.equal(record.state, "released");
      assert.equal(record.recovery_point?.name, "charged");
    });

    test("R10, P4: the response_not_stored answer is stored sealed too, and replays", async () => {
      const key = freshKey("mw-big");
      const first = await send(`${app.url}/big`, order(key));
      assert.equal(first.status, 200);
      const record = await raw(idemdKey("user-1", key));
      assert.equal(record.state, "failed");
      assert.equal(record.response?.status, 409);
      assert.equal(record.response?.body, undefined);
      assert.equal(envelopeKeyId(Buffer.from(record.response?.sealed ?? "", "base64")), "k-mw");
      const again = await send(`${app.url}/big`, order(key));
      assert.equal(again.status, 409);
      assert.equal(JSON.parse(again.body).code, "response_not_stored");
      assert.equal(again.headers["idempotent-replayed"], "true");
      assert.equal(app.runs.get(`big ${key}`), 1);
    });
  });
}
