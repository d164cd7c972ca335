// A key whose record is being moved to another store (docs/moving.md, "Moving to
// another store while serving") answers 503 store_moved. The key is not free: the client
// reports a ProblemError with the daemon's wait, not an UnavailableError, and the
// middlewares refuse the request even with failOpen (docs/middleware.md, C6).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, test } from "node:test";
import { idemdKey } from "../src/fingerprint.js";
import { IdemClient, LeaseLostError, NotFoundError, ProblemError, UnavailableError } from "../src/index.js";
import { frameworks, send, startApp } from "./apps.js";
import { Daemon, freshKey } from "./daemon.js";
import { Redis, skipReason } from "./redis.js";

/**
 * Turns the record of KEYS[1] (the strings layout) into the marker a live move leaves
 * while it hands the record over: the record's fields kept, its state m.
 */
const markMoved = `local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local l, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa = cmsgpack.unpack(v)
redis.call('SET', KEYS[1], cmsgpack.pack(l, k, t, 'm', fp, ow, at, tok, lx, rec, ca, ua, xa), 'KEEPTTL')
return 1`;

const skip = skipReason();
let redis: Redis;
let daemon: Daemon;
let client: IdemClient;
before(async () => {
  if (skip) return;
  redis = await Redis.start();
  daemon = await Daemon.start("--store", redis.url, "--redis-record-layout", "strings");
  client = new IdemClient({ baseUrl: daemon.url, retries: 0 });
});
after(async () => {
  if (skip) return;
  await daemon?.stop();
  await redis?.stop();
});

/** Marks the record of key (tenant default) as being moved. */
function mark(key: string): void {
  const stored = `idem:default:${createHash("sha256").update(key).digest("hex")}`;
  const out = redis.cli("EVAL", markMoved, "1", stored);
  assert.equal(out, "1", `no record of ${JSON.stringify(key)} to mark: ${out}`);
}

/** Checks that err is a 503 store_moved problem with a wait, and none of the classes it is not. */
function moved(what: string, err: unknown): true {
  assert.ok(err instanceof ProblemError, `${what}: ${String(err)}`);
  assert.equal(err.status, 503, `${what}: ${String(err)}`);
  assert.equal(err.code, "store_moved", `${what}: ${String(err)}`);
  assert.ok((err.retryAfterMs ?? 0) > 0, `${what}: no wait in ${String(err)}`);
  for (const not of [UnavailableError, LeaseLostError, NotFoundError]) {
    assert.ok(!(err instanceof not), `${what}: ${String(err)} is a ${not.name}`);
  }
  return true;
}

test(
  "store_moved: claim, extend, complete and lookup report a problem with a wait, not unavailable",
  { skip },
  async () => {
    const key = freshKey("moved-held");
    const claim = await client.claim(key, { leaseMs: 60_000 });
    assert.equal(claim.outcome, "acquired");
    if (claim.outcome !== "acquired") return;
    mark(key);
    await assert.rejects(client.claim(key), (err) => moved("claim", err));
    await assert.rejects(client.extend(key, claim.leaseToken, 60_000), (err) => moved("extend", err));
    await assert.rejects(client.complete(key, claim.leaseToken, { status: 200 }), (err) => moved("complete", err));
    await assert.rejects(client.lookup(key), (err) => moved("lookup", err));
  },
);

test("C6: a retry of a moving key is 503 idemd_refused, even with failOpen, and runs nothing", { skip }, async () => {
  for (const framework of frameworks) {
    const app = await startApp(framework, client, client, { failOpen: true });
    try {
      const key = freshKey("moved-order");
      const request = {
        headers: { "idempotency-key": key, "content-type": "application/json", "x-user": "alice" },
        body: '{"amount":1}',
      };
      const first = await send(`${app.url}/orders`, request);
      assert.equal(first.status, 201, framework);
      assert.equal(app.runs.get(`orders ${key}`), 1);
      mark(idemdKey("alice", key));
      for (let i = 0; i < 3; i++) {
        const retry = await send(`${app.url}/orders`, request);
        assert.equal(retry.status, 503, `${framework}: ${retry.body}`);
        assert.equal(JSON.parse(retry.body).code, "idempotency_unavailable");
        assert.ok(
          Number(retry.headers["retry-after"]) >= 1,
          `${framework}: Retry-After ${retry.headers["retry-after"]}`,
        );
        assert.equal(retry.headers["idempotent-replayed"], undefined);
      }
      assert.equal(app.runs.get(`orders ${key}`), 1, `${framework}: the handler ran again`);
      assert.deepEqual(
        app.incidents.map((i) => [
          i.kind,
          i.idemdKey,
          i.error instanceof ProblemError ? i.error.code : String(i.error),
        ]),
        Array(3).fill(["idemd_refused", idemdKey("alice", key), "store_moved"]),
        framework,
      );
    } finally {
      await app.close();
    }
  }
});
