// Large results (docs/middleware.md R10a) through every framework's middleware against a
// real idemd: with a blob store a 20 MiB answer is stored and replayed byte for byte,
// sealed or not; without one it is response_not_stored.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { IdemClient, KeyRing } from "../src/index.js";
import { type App, frameworks, largeBody, send, startApp } from "./apps.js";
import { Daemon, freshKey, scaled, waitFor } from "./daemon.js";

let blobs: Daemon;
let plain: Daemon;
before(async () => {
  blobs = await Daemon.start("--blob-store", "file:");
  plain = await Daemon.start();
});
after(async () => {
  await blobs.stop();
  await plain.stop();
});

const ring = new KeyRing([{ id: "k-large", key: randomBytes(32) }]);

// A claim that replays the result carries all 20 MiB of it: the call's timeout is scaled,
// so that a busy machine's slow answer is not taken for idemd unreachable (503).
function client(daemon: Daemon, sealed: boolean): IdemClient {
  return new IdemClient({
    baseUrl: daemon.url,
    timeoutMs: scaled(10_000),
    ...(sealed ? { sealing: { tenant: "default", ring } } : {}),
  });
}

// Each request on a connection of its own (agent: false). Kept alive, the connection of
// the first answer waits idle while the middleware stores or refuses the result; on a
// busy machine that can last until the app's server closes it for its keep-alive
// timeout just as the next request goes out on it, which resets that request
// (ECONNRESET) before the middleware sees it.
const post = (app: App, key: string) =>
  send(`${app.url}/large`, { headers: { "idempotency-key": `"${key}"`, "x-user": "alice" }, agent: false });

for (const framework of frameworks) {
  for (const sealed of [false, true]) {
    describe(`${framework}, ${sealed ? "sealed" : "plain"}: a 20 MiB result`, () => {
      test("with a blob store is stored and replayed byte for byte; the handler runs once", async () => {
        const app = await startApp(framework, client(blobs, sealed), client(blobs, false));
        const other = await startApp(framework, client(blobs, sealed), client(blobs, false));
        try {
          const key = freshKey("large");
          const first = await post(app, key);
          assert.equal(first.status, 201);
          assert.ok(first.bytes.equals(largeBody()), `first answer: ${first.bytes.length} bytes`);
          const again = await post(app, key);
          assert.equal(again.status, 201, again.body.slice(0, 300));
          assert.equal(again.headers["idempotent-replayed"], "true");
          assert.equal(again.headers["content-type"], "application/octet-stream");
          assert.ok(again.bytes.equals(largeBody()), `the replay: ${again.bytes.length} bytes`);
          // Another client, past any cache: what idemd keeps.
          const third = await post(other, key);
          assert.equal(third.status, 201, third.body.slice(0, 300));
          assert.ok(third.bytes.equals(largeBody()), `the replay through another client: ${third.bytes.length} bytes`);
          assert.equal(app.runs.get(`large "${key}"`), 1);
          assert.equal(other.runs.get(`large "${key}"`), undefined);
          assert.deepEqual(app.incidents, []);
        } finally {
          await app.close();
          await other.close();
        }
      });

      test("without a blob store is response_not_stored", async () => {
        const app = await startApp(framework, client(plain, sealed), client(plain, false));
        try {
          const key = freshKey("large-no-blobs");
          const first = await post(app, key);
          assert.equal(first.status, 201);
          assert.ok(first.bytes.equals(largeBody()));
          await waitFor("the result_not_stored incident", () =>
            app.incidents.some((i) => i.kind === "result_not_stored"),
          );
          const again = await post(app, key);
          assert.equal(again.status, 409);
          assert.equal(again.headers["idempotent-replayed"], "true");
          assert.match(again.body, /response_not_stored/);
          assert.equal(app.runs.get(`large "${key}"`), 1);
        } finally {
          await app.close();
        }
      });
    });
  }
}
