// docs/middleware.md R10a at the 1 MiB edge, through every framework's middleware against
// a real idemd without a blob store, behind a relay that cuts every raw
// PUT /v1/keys/{key}/result unanswered, as a daemon that refuses a large body before
// reading it may. A sealed body just under 1 MiB has an envelope over it: complete sends
// it raw, and the completion that got no answer is response_not_stored, not
// complete_failed. The same body plain goes as JSON and is stored.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { idemdKey } from "../src/fingerprint.js";
import { IdemClient, KeyRing } from "../src/index.js";
import { type App, frameworks, send, startApp, underMiBBody } from "./apps.js";
import { Daemon, freshKey, scaled, waitFor } from "./daemon.js";
import { CutProxy } from "./proxy.js";

const rawPut = /^\/v1\/keys\/[^/]+\/result$/;

let daemon: Daemon;
let relay: CutProxy;
before(async () => {
  daemon = await Daemon.start("--blob-store", "none");
  relay = await CutProxy.start(daemon.url, (method, path) => method === "PUT" && rawPut.test(path));
});
after(async () => {
  await relay?.close();
  await daemon?.stop();
});

const ring = new KeyRing([{ id: "k-edge", key: randomBytes(32) }]);

function client(baseUrl: string, sealed: boolean): IdemClient {
  return new IdemClient({
    baseUrl,
    timeoutMs: scaled(10_000),
    ...(sealed ? { sealing: { tenant: "default", ring } } : {}),
  });
}

// Each request on a connection of its own, as in large.test.ts.
const post = (app: App, key: string) =>
  send(`${app.url}/under-mib`, { headers: { "idempotency-key": `"${key}"`, "x-user": "alice" }, agent: false });

const rawPutsOf = (key: string) =>
  relay.received.filter((r) => r === `PUT /v1/keys/${encodeURIComponent(idemdKey("alice", key))}/result`);

for (const framework of frameworks) {
  describe(`${framework}: a body of 1 MiB less 64 bytes, its raw upload cut unanswered`, () => {
    test("sealed, its envelope over 1 MiB goes raw and is response_not_stored, not complete_failed", async () => {
      const app = await startApp(framework, client(relay.url, true), client(daemon.url, false));
      try {
        const key = freshKey("edge-sealed");
        const first = await post(app, key);
        assert.equal(first.status, 201);
        assert.ok(first.bytes.equals(underMiBBody()), `first answer: ${first.bytes.length} bytes`);
        await waitFor("the middleware's incident", () => app.incidents.length > 0);
        assert.deepEqual(
          app.incidents.map((i) => i.kind),
          ["result_not_stored"],
        );
        assert.ok(rawPutsOf(key).length > 0, `the relay saw: ${relay.received.join(", ")}`);
        // What idemd keeps: the key failed with 409 response_not_stored, sealed.
        const record = await client(daemon.url, true).lookup(idemdKey("alice", key));
        assert.equal(record.state, "failed");
        assert.equal(record.response?.status, 409);
        assert.equal(JSON.parse(Buffer.from(record.response?.body ?? []).toString()).code, "response_not_stored");
        const again = await post(app, key);
        assert.equal(again.status, 409);
        assert.equal(again.headers["idempotent-replayed"], "true");
        assert.match(again.body, /response_not_stored/);
        assert.equal(app.runs.get(`under-mib "${key}"`), 1);
      } finally {
        await app.close();
      }
    });

    test("plain, it goes as JSON and is stored and replayed", async () => {
      const app = await startApp(framework, client(relay.url, false), client(daemon.url, false));
      try {
        const key = freshKey("edge-plain");
        const first = await post(app, key);
        assert.equal(first.status, 201);
        assert.ok(first.bytes.equals(underMiBBody()), `first answer: ${first.bytes.length} bytes`);
        const again = await post(app, key);
        assert.equal(again.status, 201, again.body.slice(0, 300));
        assert.equal(again.headers["idempotent-replayed"], "true");
        assert.ok(again.bytes.equals(underMiBBody()), `the replay: ${again.bytes.length} bytes`);
        assert.deepEqual(rawPutsOf(key), []);
        assert.deepEqual(app.incidents, []);
        assert.equal(app.runs.get(`under-mib "${key}"`), 1);
      } finally {
        await app.close();
      }
    });
  });
}
