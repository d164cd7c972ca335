// docs/middleware.md row by row, for Express 4, Express 5 and Fastify, in front of a
// real idemd. Each test names the rows it shows.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { Agent, createServer, request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import Fastify from "fastify";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotency as fastifyIdempotency } from "../src/fastify.js";
import { fingerprint, idemdKey } from "../src/fingerprint.js";
import { IdemClient, NotFoundError, ProblemError, QuotaExceededError } from "../src/index.js";
import { type App, frameworks, send, startApp } from "./apps.js";
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

const json = (key: string | string[], body: unknown, user = "user-1") => ({
  headers: { "idempotency-key": key, "content-type": "application/json", "x-user": user },
  body: JSON.stringify(body),
});

for (const framework of frameworks) {
  describe(framework, () => {
    let app: App;
    before(async () => {
      app = await startApp(framework, client, client);
    });
    after(async () => {
      await app.close();
    });

    test("C1, C2, P1, P2: the first request runs, a retry gets its answer back byte for byte", async () => {
      const key = freshKey("order");
      const first = await send(`${app.url}/orders`, json(key, { item: "book", qty: 1 }));
      assert.equal(first.status, 201);
      assert.equal(first.headers["set-cookie"]?.[0], "session=first");
      assert.equal(first.headers["idempotent-replayed"], undefined);
      // The same JSON with other spacing and member order is the same request.
      const again = await send(`${app.url}/orders`, {
        ...json(key, {}),
        body: '{ "qty" : 1, "item":"book" }',
      });
      assert.equal(again.status, 201);
      assert.equal(again.body, first.body);
      assert.equal(again.headers["idempotent-replayed"], "true");
      assert.equal(again.headers.location, "/orders/1");
      assert.equal(again.headers["content-type"], first.headers["content-type"]);
      assert.equal(again.headers["content-length"], String(Buffer.byteLength(first.body)));
      assert.equal(again.headers["set-cookie"], undefined, "a cookie is the first caller's session");
      assert.equal(again.headers["x-extra"], undefined, "only storedHeaders are replayed");
      assert.equal(app.runs.get(`orders ${key}`), 1);
    });

    test("scope: the same key from another user runs for that user, never replays across", async () => {
      const key = freshKey("scoped");
      const mine = await send(`${app.url}/orders`, json(key, { a: 1 }, "alice"));
      const theirs = await send(`${app.url}/orders`, json(key, { a: 1 }, "bob"));
      assert.equal(mine.status, 201);
      assert.equal(theirs.status, 201);
      assert.equal(theirs.headers["idempotent-replayed"], undefined);
      assert.equal(app.runs.get(`orders ${key}`), 2);
    });

    test("M1: a method not in methods passes through, even with a key", async () => {
      const key = freshKey("put");
      for (let i = 0; i < 2; i++) {
        const res = await send(`${app.url}/orders`, { method: "PUT", ...json(key, {}) });
        assert.equal(res.status, 201);
        assert.equal(res.headers["idempotent-replayed"], undefined);
      }
      assert.equal(app.runs.get(`orders ${key}`), 2);
    });

    test("M2: no key passes through unprotected", async () => {
      for (let i = 0; i < 2; i++) {
        const res = await send(`${app.url}/orders`, {
          headers: { "content-type": "application/json", "x-user": "u" },
          body: "{}",
        });
        assert.equal(res.status, 201);
      }
      assert.equal(app.runs.get("orders "), 2);
    });

    test("M3: an invalid header is 400 invalid_idempotency_key and the handler does not run", async () => {
      const key = freshKey("bad");
      for (const header of [[key, key], `"${key}";p=1`, `${key} x`, '"unterminated']) {
        const res = await send(`${app.url}/orders`, json(header, {}));
        assert.equal(res.status, 400, JSON.stringify(header));
        assert.equal(res.headers["content-type"], "application/problem+json");
        assert.equal(JSON.parse(res.body).code, "invalid_idempotency_key");
        assert.ok(JSON.parse(res.body).detail.length > 0);
      }
      assert.equal(app.runs.get(`orders ${key}`), undefined);
    });

    test("M4: no scope (absent or throwing) is 500 idempotency_scope_missing with an incident", async () => {
      const key = freshKey("noscope");
      const before = app.incidents.length;
      for (const user of [undefined, "throw"]) {
        const headers: Record<string, string> = { "idempotency-key": key, "content-type": "application/json" };
        if (user) headers["x-user"] = user;
        const res = await send(`${app.url}/orders`, { headers, body: "{}" });
        assert.equal(res.status, 500);
        assert.equal(JSON.parse(res.body).code, "idempotency_scope_missing");
      }
      assert.deepEqual(
        app.incidents.slice(before).map((i) => [i.kind, i.idemdKey]),
        [
          ["scope_missing", ""],
          ["scope_missing", ""],
        ],
      );
      assert.equal(app.runs.get(`orders ${key}`), undefined);
    });

    test("C3: a concurrent duplicate is 409 in_progress with Retry-After; a later one gets the answer", async () => {
      const key = freshKey("slow");
      const first = send(`${app.url}/slow`, json(key, {}));
      await waitFor("the first request to run", () => app.runs.get(`slow ${key}`) === 1);
      const dup = await send(`${app.url}/slow`, json(key, {}));
      assert.equal(dup.status, 409);
      assert.equal(JSON.parse(dup.body).code, "in_progress");
      assert.ok(Number(dup.headers["retry-after"]) >= 1);
      app.open();
      assert.equal((await first).status, 200);
      const later = await send(`${app.url}/slow`, json(key, {}));
      assert.equal(later.status, 200);
      assert.equal(later.headers["idempotent-replayed"], "true");
      assert.equal(app.runs.get(`slow ${key}`), 1);
    });

    test("C4: the key with another body is 422 fingerprint_mismatch", async () => {
      const key = freshKey("mismatch");
      assert.equal((await send(`${app.url}/orders`, json(key, { qty: 1 }))).status, 201);
      const other = await send(`${app.url}/orders`, json(key, { qty: 1000 }));
      assert.equal(other.status, 422);
      assert.equal(JSON.parse(other.body).code, "fingerprint_mismatch");
      const otherQuery = await send(`${app.url}/orders?x=1`, json(key, { qty: 1 }));
      assert.equal(otherQuery.status, 422);
      assert.equal(app.runs.get(`orders ${key}`), 1);
    });

    test("R1: a 402 is a result and is stored; R2: a 422 releases the key; R3: a 500 releases it", async () => {
      for (const [status, runs] of [
        [402, 1],
        [422, 2],
        [500, 2],
      ] as const) {
        const key = freshKey(`status-${status}`);
        const first = await send(`${app.url}/status`, json(key, { status }));
        const second = await send(`${app.url}/status`, json(key, { status }));
        assert.equal(first.status, status);
        assert.equal(second.status, status);
        assert.equal(app.runs.get(`status ${key}`), runs, `status ${status}`);
        assert.equal(second.headers["idempotent-replayed"], runs === 1 ? "true" : undefined);
      }
    });

    test("R4: a handler that throws releases the key, so a retry runs it again", async () => {
      const key = freshKey("throw");
      assert.equal((await send(`${app.url}/throw`, json(key, {}))).status, 500);
      assert.equal((await send(`${app.url}/throw`, json(key, {}))).status, 500);
      assert.equal(app.runs.get(`throw ${key}`), 2);
    });

    test("R15: a throw after a stored status keeps 409 response_not_stored; after a 503 it releases", async () => {
      const key = freshKey("throw-late");
      await send(`${app.url}/throw-after-status`, json(key, { status: 201 })).catch(() => undefined);
      await waitFor("the key to be failed", async () => {
        const record = await client.lookup(idemdKey("user-1", key)).catch(() => undefined);
        return record?.state === "failed";
      });
      const retry = await send(`${app.url}/throw-after-status`, json(key, { status: 201 }));
      assert.equal(retry.status, 409);
      assert.equal(JSON.parse(retry.body).code, "response_not_stored");
      assert.equal(retry.headers["idempotent-replayed"], "true");
      assert.equal(app.runs.get(`throw-after-status ${key}`), 1);
      await waitFor("the result_not_stored incident", () =>
        app.incidents.some((i) => i.kind === "result_not_stored" && i.idemdKey === idemdKey("user-1", key)),
      );

      const failed = freshKey("throw-late-503");
      await send(`${app.url}/throw-after-status`, json(failed, { status: 503 })).catch(() => undefined);
      await waitFor("the key to be released", async () => {
        const record = await client.lookup(idemdKey("user-1", failed)).catch(() => undefined);
        return record?.state === "released";
      });
      await send(`${app.url}/throw-after-status`, json(failed, { status: 503 })).catch(() => undefined);
      assert.equal(app.runs.get(`throw-after-status ${failed}`), 2);
    });

    test("R5: a client that goes away before the status releases the key", async () => {
      const key = freshKey("gone");
      const { headers, body } = json(key, {});
      const req = httpRequest(`${app.url}/slow`, { method: "POST", headers });
      req.on("error", () => undefined);
      req.end(body);
      await waitFor("the handler to run", () => app.runs.get(`slow ${key}`) === 1);
      req.destroy();
      await waitFor("the key to be released", async () => {
        const record = await client.lookup(idemdKey("user-1", key));
        return record.state === "released";
      });
      const retry = send(`${app.url}/slow`, json(key, {}));
      await waitFor("the retry to run the handler", () => app.runs.get(`slow ${key}`) === 2);
      app.open();
      assert.equal((await retry).status, 200);
    });

    test("R5, R6: a client that goes away while the handler still runs: its later answer is stored, it runs once", async () => {
      const key = freshKey("gone-running");
      const { headers, body } = json(key, {});
      const req = httpRequest(`${app.url}/slow`, { method: "POST", headers });
      req.on("error", () => undefined);
      req.end(body);
      await waitFor("the handler to run", () => app.runs.get(`slow ${key}`) === 1);
      req.destroy();
      await waitFor("the server to see the client gone", () => app.gone.has(`slow ${key}`));
      app.open();
      await waitFor("the result to be stored", async () => {
        const record = await client.lookup(idemdKey("user-1", key));
        return record.state === "completed";
      });
      const again = await send(`${app.url}/slow`, json(key, {}));
      assert.equal(again.status, 200);
      assert.equal(again.headers["idempotent-replayed"], "true");
      assert.equal(app.runs.get(`slow ${key}`), 1);
    });

    test("R6: a client that goes away after the status still gets its result stored", async () => {
      const key = freshKey("gone-late");
      const { headers, body } = json(key, {});
      await new Promise<void>((resolve, reject) => {
        const req = httpRequest(`${app.url}/stream`, { method: "POST", headers }, (res) => {
          res.once("data", () => {
            req.destroy();
            resolve();
          });
        });
        req.on("error", () => undefined);
        req.on("close", () => resolve());
        req.end(body, () => undefined);
        req.on("timeout", reject);
      });
      app.open();
      await waitFor("the result to be stored", async () => {
        const record = await client.lookup(idemdKey("user-1", key));
        return record.state === "completed";
      });
      const again = await send(`${app.url}/stream`, json(key, {}));
      assert.equal(again.body, "first second");
      assert.equal(again.headers["idempotent-replayed"], "true");
      assert.equal(app.runs.get(`stream ${key}`), 1);
    });

    test("R9: a 101 stores 409 response_not_stored, with an incident", async () => {
      const key = freshKey("switch");
      const { headers, body } = json(key, {});
      const req = httpRequest(`${app.url}/switch`, { method: "POST", headers });
      req.on("upgrade", (_res, socket) => socket.destroy());
      req.on("error", () => undefined);
      req.end(body);
      await waitFor("the key to be failed", async () => {
        const record = await client.lookup(idemdKey("user-1", key)).catch(() => undefined);
        return record?.state === "failed";
      });
      const record = await client.lookup(idemdKey("user-1", key));
      assert.equal(record.response?.status, 409);
      assert.equal(JSON.parse(Buffer.from(record.response?.body ?? []).toString()).code, "response_not_stored");
      // The incident follows the release that stored the failure.
      await waitFor("the result_not_stored incident", () =>
        app.incidents.some((i) => i.kind === "result_not_stored" && i.idemdKey === idemdKey("user-1", key)),
      );
    });

    test("M7: a body the client never finishes sending claims nothing and runs nothing", async () => {
      const key = freshKey("cut");
      const { headers } = json(key, {});
      await new Promise<void>((resolve) => {
        const req = httpRequest(`${app.url}/orders`, {
          method: "POST",
          headers: { ...headers, "content-length": "100" },
        });
        req.on("error", () => undefined);
        req.on("close", () => resolve());
        req.write('{"a":', () => req.destroy());
      });
      // A request after it on another connection has run to its end.
      assert.equal((await send(`${app.url}/orders`, json(freshKey("after-cut"), {}))).status, 201);
      assert.equal(app.runs.get(`orders ${key}`), undefined);
      await assert.rejects(client.lookup(idemdKey("user-1", key)), NotFoundError);
    });

    test("R8: informational answers pass through and the final status is the one stored", async () => {
      const key = freshKey("hints");
      assert.equal((await send(`${app.url}/hints`, json(key, {}))).status, 201);
      const again = await send(`${app.url}/hints`, json(key, {}));
      assert.equal(again.status, 201);
      assert.equal(again.headers["idempotent-replayed"], "true");
    });

    test("R11: a streamed answer reaches the client as it is flushed, and is stored whole", async () => {
      const key = freshKey("stream");
      const { headers, body } = json(key, {});
      const text = await new Promise<string>((resolve, reject) => {
        const req = httpRequest(`${app.url}/stream`, { method: "POST", headers }, (res) => {
          let got = "";
          res.on("data", (chunk: Buffer) => {
            got += chunk.toString();
            if (got === "first ") app.open();
          });
          res.on("end", () => resolve(got));
        });
        req.on("error", reject);
        req.end(body);
      });
      assert.equal(text, "first second");
      const again = await send(`${app.url}/stream`, json(key, {}));
      assert.equal(again.body, "first second");
      assert.equal(again.headers["idempotent-replayed"], "true");
    });

    test("R12: a lost lease aborts the handler's signal, answers 409 lease_lost, stores nothing", async () => {
      const key = freshKey("lose");
      const before = app.incidents.length;
      const res = await send(`${app.url}/lose`, json(key, {}));
      assert.equal(res.status, 409);
      assert.equal(JSON.parse(res.body).code, "lease_lost");
      assert.equal(res.headers["retry-after"], "1");
      await waitFor("the lease_lost incident", () => app.incidents.slice(before).some((i) => i.kind === "lease_lost"));
      await assert.rejects(client.lookup(idemdKey("user-1", key)), NotFoundError);
    });

    test("R12: a lease lost after the status lets the handler end its answer, reports lease_lost, stores nothing", async () => {
      const key = freshKey("lose-late");
      const before = app.incidents.length;
      const answer = send(`${app.url}/lose-after-status`, json(key, {}));
      await waitFor("the lease_lost incident", () => app.incidents.slice(before).some((i) => i.kind === "lease_lost"));
      const res = await answer;
      assert.equal(res.status, 200);
      assert.equal(res.body, "before after");
      await assert.rejects(client.lookup(idemdKey("user-1", key)), NotFoundError);
      assert.equal(app.runs.get(`lose-after-status ${key}`), 1);
    });

    test("fingerprint: an absolute-form target is hashed by its path and query, as Go does", async () => {
      const key = freshKey("absolute");
      const port = Number(new URL(app.url).port);
      const answer = await new Promise<string>((resolve, reject) => {
        const socket = connect(port, "127.0.0.1", () => {
          socket.write(
            `POST http://127.0.0.1:${port}/orders?x=1 HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n` +
              `Idempotency-Key: ${key}\r\nX-User: user-1\r\nContent-Type: application/json\r\n` +
              "Content-Length: 2\r\nConnection: close\r\n\r\n{}",
          );
        });
        let got = "";
        socket.on("data", (chunk: Buffer) => {
          got += chunk.toString();
        });
        socket.on("error", reject);
        socket.on("close", () => resolve(got));
      });
      assert.match(answer, /^HTTP\/1\.1 201 /);
      const record = await client.lookup(idemdKey("user-1", key));
      const expected = fingerprint({
        method: "POST",
        path: "/orders",
        query: "x=1",
        contentType: "application/json",
        body: Buffer.from("{}"),
      });
      assert.equal(record.fingerprint, expected.fingerprint);
    });

    test("P3: a stored status outside 200-599 is 502 stored_response_invalid with an incident", async () => {
      const key = freshKey("invalid");
      const derived = idemdKey("user-1", key);
      const fp = fingerprint({
        method: "POST",
        path: "/orders",
        query: "",
        contentType: "application/json",
        body: Buffer.from("{}"),
      });
      const claim = await client.claim(derived, { fingerprint: fp.fingerprint });
      assert.equal(claim.outcome, "acquired");
      if (claim.outcome === "acquired") {
        try {
          await client.complete(derived, claim.leaseToken, { status: 150 });
        } catch (err) {
          // idemd refuses to store a 1xx itself; P3 guards records it stored before.
          if (err instanceof ProblemError && err.status === 400 && err.code === "invalid_request") return;
          throw err;
        }
      }
      const before = app.incidents.length;
      const res = await send(`${app.url}/orders`, json(key, {}));
      assert.equal(res.status, 502);
      assert.equal(JSON.parse(res.body).code, "stored_response_invalid");
      assert.deepEqual(
        app.incidents.slice(before).map((i) => [i.kind, i.idemdKey]),
        [["replay_invalid", derived]],
      );
    });

    test("a storm of identical requests runs the handler exactly once per key", async () => {
      const agent = new Agent({ keepAlive: true, maxSockets: 16 });
      try {
        const keys = [freshKey("storm-a"), freshKey("storm-b")];
        const answers = await Promise.all(
          Array.from({ length: 48 }, (_, i) =>
            send(`${app.url}/orders`, { ...json(keys[i % 2] as string, { n: 1 }), agent }),
          ),
        );
        for (const key of keys) assert.equal(app.runs.get(`orders ${key}`), 1, key);
        for (const a of answers) assert.ok(a.status === 201 || a.status === 409, `status ${a.status}`);
        const bodies = new Set(answers.filter((a) => a.status === 201).map((a) => a.body));
        assert.equal(bodies.size, 2, "every 201 is one of the two first answers");
      } finally {
        agent.destroy();
      }
    });
  });
}

describe("options", () => {
  test("M5: no scope option, or a forbidden stored header, is refused at construction", async () => {
    assert.throws(() => expressIdempotency(client, {} as never), /scope option is required/);
    assert.throws(() => expressIdempotency(client, { scope: () => "u", storedHeaders: ["Set-Cookie"] }), /set-cookie/);
    // A wait or lease idemd refuses on every claim would answer 503 to every request.
    for (const bad of [{ waitMs: 30_001 }, { waitMs: -1 }, { leaseMs: 99 }, { leaseMs: 3_600_001 }]) {
      assert.throws(() => expressIdempotency(client, { scope: () => "u", ...bad }), RangeError, JSON.stringify(bad));
    }
    expressIdempotency(client, { scope: () => "u", waitMs: 30_000, leaseMs: 3_600_000 });
    expressIdempotency(client, { scope: () => "u", waitMs: 0, leaseMs: 100 });
    const app = Fastify();
    await assert.rejects(
      (async () => {
        await app.register(fastifyIdempotency, { client } as never);
        await app.ready();
      })(),
      /scope option is required/,
    );
    await app.close();
  });

  for (const framework of frameworks) {
    test(`${framework}: M2 requireKey, M6 maxBodyBytes, R10 maxStoredBytes, C3 waitMs`, async () => {
      // Counts the claims the middleware sends, to know when a duplicate is at idemd.
      let claims = 0;
      const counting = new IdemClient({
        baseUrl: daemon.url,
        fetch: (input, init) => {
          if (String(input instanceof Request ? input.url : input).endsWith("/v1/claim")) claims++;
          return fetch(input, init);
        },
      });
      const app = await startApp(framework, counting, client, {
        requireKey: true,
        maxBodyBytes: 1000,
        maxStoredBytes: 1000,
        waitMs: 20_000,
      });
      try {
        const missing = await send(`${app.url}/orders`, { headers: { "x-user": "u" }, body: "" });
        assert.equal(missing.status, 400);
        assert.equal(JSON.parse(missing.body).code, "missing_idempotency_key");

        const big = await send(`${app.url}/orders`, json(freshKey("big-body"), { pad: "x".repeat(2000) }));
        assert.equal(big.status, 413);
        assert.equal(JSON.parse(big.body).code, "payload_too_large");

        // R10 and P4: the client gets the whole answer; a retry learns it ran and was not stored.
        const key = freshKey("big-answer");
        const first = await send(`${app.url}/big`, json(key, {}));
        assert.equal(first.status, 200);
        assert.equal(JSON.parse(first.body).big.length, 4000);
        const retry = await send(`${app.url}/big`, json(key, {}));
        assert.equal(retry.status, 409);
        assert.equal(JSON.parse(retry.body).code, "response_not_stored");
        assert.equal(retry.headers["idempotent-replayed"], "true");
        assert.equal(retry.headers["retry-after"], undefined);
        assert.ok(app.incidents.some((i) => i.kind === "result_not_stored"));
        assert.equal(app.runs.get(`big ${key}`), 1);

        // C3 with waitMs: duplicates wait for the first request and get its answer.
        const slowKey = freshKey("wait");
        const first2 = send(`${app.url}/slow`, json(slowKey, {}));
        await waitFor("the first request to run", () => app.runs.get(`slow ${slowKey}`) === 1);
        const claimsBefore = claims;
        const waiting = send(`${app.url}/slow`, json(slowKey, {}));
        await waitFor("the duplicate's claim to be sent", () => claims > claimsBefore);
        app.open();
        assert.equal((await first2).status, 200);
        const waited = await waiting;
        assert.equal(waited.status, 200);
        assert.equal(waited.headers["idempotent-replayed"], "true");
        assert.equal(app.runs.get(`slow ${slowKey}`), 1);
      } finally {
        await app.close();
      }
    });

    test(`${framework}: C5 unreachable idemd is 503 (fail closed), or runs unprotected with failOpen`, async () => {
      const dead = new IdemClient({ baseUrl: `http://127.0.0.1:${await freePort()}`, retries: 0 });
      for (const failOpen of [false, true]) {
        const app = await startApp(framework, dead, client, { failOpen });
        try {
          const key = freshKey("down");
          const res = await send(`${app.url}/orders`, json(key, {}));
          if (failOpen) {
            assert.equal(res.status, 201);
            assert.equal(app.runs.get(`orders ${key}`), 1);
            assert.deepEqual(
              app.incidents.map((i) => i.kind),
              ["fail_open"],
            );
          } else {
            assert.equal(res.status, 503);
            assert.equal(JSON.parse(res.body).code, "idempotency_unavailable");
            assert.ok(Number(res.headers["retry-after"]) >= 1);
            assert.equal(app.runs.get(`orders ${key}`), undefined);
            assert.deepEqual(
              app.incidents.map((i) => [i.kind, i.idemdKey]),
              [["unavailable", idemdKey("user-1", key)]],
            );
          }
        } finally {
          await app.close();
        }
      }
    });
  }

  test("C6: idemd refusing (401) is 503 idemd_refused, even with failOpen", async () => {
    const file = join(tmpdir(), `idemd-ts-mw-auth-${process.pid}.yaml`);
    const sha = createHash("sha256").update("t".repeat(64)).digest("hex");
    writeFileSync(file, `tenants:\n  a: {}\ntokens:\n  - tenant: a\n    scopes: [use]\n    sha256: ${sha}\n`);
    const authed = await Daemon.start("--auth-file", file);
    try {
      for (const framework of frameworks) {
        const app = await startApp(framework, new IdemClient({ baseUrl: authed.url }), client, { failOpen: true });
        try {
          const key = freshKey("refused");
          const res = await send(`${app.url}/orders`, json(key, {}));
          assert.equal(res.status, 503, framework);
          assert.equal(JSON.parse(res.body).code, "idempotency_unavailable");
          assert.equal(app.runs.get(`orders ${key}`), undefined);
          assert.deepEqual(
            app.incidents.map((i) => i.kind),
            ["idemd_refused"],
          );
        } finally {
          await app.close();
        }
      }
    } finally {
      await authed.stop();
    }
  });

  test("C7: a tenant at its quota is 503 idempotency_quota_exceeded, even with failOpen", async () => {
    const file = join(tmpdir(), `idemd-ts-mw-quota-${process.pid}.yaml`);
    const token = "q".repeat(64);
    const sha = createHash("sha256").update(token).digest("hex");
    writeFileSync(
      file,
      `tenants:\n  a: {max_records: 1}\ntokens:\n  - tenant: a\n    scopes: [use]\n    sha256: ${sha}\n`,
    );
    const authed = await Daemon.start("--auth-file", file);
    try {
      const capped = new IdemClient({ baseUrl: authed.url, token, retries: 0 });
      const kept = freshKey("kept");
      const first = await capped.claim(kept);
      assert.equal(first.outcome, "acquired");
      if (first.outcome === "acquired") await capped.complete(kept, first.leaseToken, { status: 200 });
      await assert.rejects(capped.claim(freshKey("direct")), (err: unknown) => {
        assert.ok(err instanceof QuotaExceededError, String(err));
        assert.equal(err.status, 429);
        return true;
      });
      for (const framework of frameworks) {
        const app = await startApp(framework, capped, client, { failOpen: true });
        try {
          const key = freshKey("over-quota");
          const res = await send(`${app.url}/orders`, json(key, {}));
          assert.equal(res.status, 503, framework);
          assert.equal(JSON.parse(res.body).code, "idempotency_quota_exceeded");
          assert.ok(Number(res.headers["retry-after"]) >= 1);
          assert.equal(app.runs.get(`orders ${key}`), undefined);
          assert.deepEqual(
            app.incidents.map((i) => i.kind),
            ["quota_exceeded"],
          );
        } finally {
          await app.close();
        }
      }
    } finally {
      await authed.stop();
    }
  });

  test("C6: a claim answered by something that is not idemd (a success without a lease or an outcome) runs nothing", async () => {
    for (const status of [200, 201]) {
      const other = createServer((_req, res) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end('{"ok":true}');
      });
      await new Promise<void>((resolve) => other.listen(0, "127.0.0.1", resolve));
      const base = `http://127.0.0.1:${(other.address() as AddressInfo).port}`;
      try {
        for (const framework of frameworks) {
          const app = await startApp(framework, new IdemClient({ baseUrl: base }), client, { failOpen: true });
          try {
            const key = freshKey("not-idemd");
            const res = await send(`${app.url}/orders`, json(key, {}));
            assert.equal(res.status, 503, `${framework} ${status}`);
            assert.equal(JSON.parse(res.body).code, "idempotency_unavailable");
            assert.equal(res.headers["idempotent-replayed"], undefined);
            assert.equal(app.runs.get(`orders ${key}`), undefined);
            assert.deepEqual(
              app.incidents.map((i) => i.kind),
              ["idemd_refused"],
            );
          } finally {
            await app.close();
          }
        }
      } finally {
        other.closeAllConnections();
        await new Promise((resolve) => other.close(resolve));
      }
    }
  });

  test("R10: idemd refusing to store a result (413) stores 409 response_not_stored instead", async () => {
    const small = await Daemon.start("--max-response-bytes", "1000");
    try {
      for (const framework of frameworks) {
        const app = await startApp(framework, new IdemClient({ baseUrl: small.url }), client);
        try {
          const key = freshKey("refused-result");
          const first = await send(`${app.url}/big`, json(key, {}));
          assert.equal(first.status, 200, framework);
          assert.equal(JSON.parse(first.body).big.length, 4000);
          const retry = await send(`${app.url}/big`, json(key, {}));
          assert.equal(retry.status, 409);
          assert.equal(JSON.parse(retry.body).code, "response_not_stored");
          assert.deepEqual(
            app.incidents.map((i) => i.kind),
            ["result_not_stored"],
          );
        } finally {
          await app.close();
        }
      }
    } finally {
      await small.stop();
    }
  });

  for (const framework of frameworks) {
    test(`${framework}: R13 a result idemd cannot store, R14 a key it cannot release: incidents, the answer still goes out`, async () => {
      const own = await Daemon.start();
      const app = await startApp(framework, new IdemClient({ baseUrl: own.url, retries: 0 }), client);
      try {
        const stored = freshKey("complete-fails");
        const released = freshKey("release-fails");
        const first = send(`${app.url}/slow`, json(stored, {}));
        const second = send(`${app.url}/slow-fail`, json(released, {}));
        await waitFor("both handlers to run", () => app.runs.size === 2);
        await own.stop();
        app.open();
        assert.equal((await first).status, 200);
        assert.equal((await second).status, 500);
        await waitFor("both incidents", () => app.incidents.length === 2);
        assert.deepEqual(app.incidents.map((i) => i.kind).sort(), ["complete_failed", "release_failed"]);
      } finally {
        await app.close();
        await own.stop();
      }
    });

    test(`${framework}: C3a a duplicate waiting for the key stops waiting when its client leaves`, async () => {
      const own = await Daemon.start();
      const ownClient = new IdemClient({ baseUrl: own.url });
      const app = await startApp(framework, ownClient, ownClient, { waitMs: 30_000 });
      try {
        const key = freshKey("wait-gone");
        const first = send(`${app.url}/slow`, json(key, {}));
        // A failure below closes the app under it: the failure is what the test reports.
        first.catch(() => undefined);
        await waitFor("the first request to run", () => app.runs.get(`slow ${key}`) === 1);
        // The duplicate, on a connection of its own that the test destroys.
        const { headers, body } = json(key, {});
        const dup = httpRequest(`${app.url}/slow`, { method: "POST", headers, agent: false });
        dup.on("error", () => undefined);
        dup.end(body);
        await waitFor("idemd to see the duplicate wait", async () => (await claimWaiters(own)) === "1");
        dup.destroy();
        // Well within the 30 s wait: the wait must end because the client left, not
        // because it ran out.
        await waitFor("idemd's waiter to go", async () => (await claimWaiters(own)) === "0", 20_000);
        assert.equal(app.runs.get(`slow ${key}`), 1);

        app.open();
        const answer = await first;
        assert.equal(answer.status, 200);
        assert.equal(answer.headers["idempotent-replayed"], undefined);
        const record = await ownClient.lookup(idemdKey("user-1", key));
        assert.equal(record.state, "completed");
        assert.equal(record.attempt, 1);
        const again = await send(`${app.url}/slow`, json(key, {}));
        assert.equal(again.status, 200);
        assert.equal(again.headers["idempotent-replayed"], "true");
        assert.equal(app.runs.get(`slow ${key}`), 1);
      } finally {
        app.open();
        await app.close();
        await own.stop();
      }
    });
  }
});

/** idemd's gauge of claims waiting on a key, as /metrics gives it. */
async function claimWaiters(d: Daemon): Promise<string> {
  const metrics = await (await fetch(`${d.url}/metrics`)).text();
  const line = metrics.split("\n").find((l) => l.startsWith("idemd_claim_waiters "));
  if (line === undefined) throw new Error("idemd's /metrics has no idemd_claim_waiters");
  return line.slice("idemd_claim_waiters ".length).trim();
}
