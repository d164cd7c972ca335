// The abandoned-keys feed (abandoned, abandonedKeys) against a real idemd: keys whose
// holders claimed them and went away, under short leases that run out.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { type AbandonedKey, IdemClient } from "../src/index.js";
import { Daemon, freshKey, waitFor } from "./daemon.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url, owner: "feed-test" });
});
after(async () => {
  await daemon.stop();
});

/** Every key of the feed under prefix, read page by page with limit. */
async function all(prefix: string, limit?: number): Promise<AbandonedKey[]> {
  const keys: AbandonedKey[] = [];
  for await (const k of client.abandonedKeys({ prefix, ...(limit === undefined ? {} : { limit }) })) keys.push(k);
  return keys.sort((a, b) => a.key.localeCompare(b.key));
}

describe("the abandoned-keys feed", () => {
  test("keys left pending appear with their attempt, fingerprint, owner and recovery point; limit 1 pages through them all", async () => {
    const prefix = `${freshKey("feed")}/`;
    // Three holders claim and go away; one recorded a recovery point, one has a
    // fingerprint. A fourth key is finished and never listed.
    const claims = [];
    for (const [name, fingerprint] of [
      ["a", "fp-a"],
      ["b", undefined],
      ["c", undefined],
    ] as const) {
      const claim = await client.claim(prefix + name, { leaseMs: 100, ...(fingerprint ? { fingerprint } : {}) });
      if (claim.outcome !== "acquired") throw new Error("not acquired");
      claims.push(claim);
    }
    await client.recordRecoveryPoint(prefix + "b", claims[1]!.leaseToken, "charged", "ch_1");
    await client.run(prefix + "done", () => "finished");
    await client.run(`other-${prefix}x`, () => "elsewhere");

    await waitFor("the three leases to run out", async () => (await all(prefix)).length === 3);
    const keys = await all(prefix);
    assert.deepEqual(
      keys.map((k) => [k.key, k.attempt, k.fingerprint, k.owner, k.recoveryPoint]),
      [
        [prefix + "a", 1, "fp-a", "feed-test", ""],
        [prefix + "b", 1, "", "feed-test", "charged"],
        [prefix + "c", 1, "", "feed-test", ""],
      ],
    );
    for (const k of keys) assert.ok(k.leaseExpiredAt instanceof Date && !Number.isNaN(k.leaseExpiredAt.getTime()));

    // Page by page, one key a page at most: every key, once.
    const pages: number[] = [];
    let cursor: string | undefined;
    const seen: string[] = [];
    for (let i = 0; i < 100; i++) {
      const page = await client.abandoned({ prefix, limit: 1, ...(cursor === undefined ? {} : { cursor }) });
      assert.ok(page.keys.length <= 1);
      pages.push(page.keys.length);
      seen.push(...page.keys.map((k) => k.key));
      cursor = page.next;
      if (cursor === undefined) break;
    }
    assert.equal(cursor, undefined);
    assert.deepEqual(seen.sort(), [prefix + "a", prefix + "b", prefix + "c"]);
    assert.deepEqual(
      (await all(prefix, 1)).map((k) => k.key),
      keys.map((k) => k.key),
    );

    // Leases that ran out only just now are not older than an hour.
    assert.deepEqual((await client.abandoned({ prefix, olderThanMs: 3_600_000 })).keys, []);
    // A key claimed again is held, not abandoned.
    const again = await client.claim(prefix + "c", { leaseMs: 30_000 });
    assert.equal(again.outcome, "acquired");
    assert.deepEqual(
      (await all(prefix)).map((k) => k.key),
      [prefix + "a", prefix + "b"],
    );
  });
});
