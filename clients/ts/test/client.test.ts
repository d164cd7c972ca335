import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  FingerprintMismatchError,
  IdemClient,
  InProgressError,
  LeaseLostError,
  NotFoundError,
  ProblemError,
  UnavailableError,
} from "../src/index.js";
import { Daemon, freePort, freshKey } from "./daemon.js";
import { LossyProxy } from "./proxy.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

/** A loopback HTTP server answering every request with handler. */
async function serve(handler: Parameters<typeof createServer>[1]): Promise<{ url: string; server: Server }> {
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  return { url: `http://127.0.0.1:${address.port}`, server };
}

describe("calls", () => {
  test("a claim with only a key acquires, complete stores, a later claim replays byte for byte", async () => {
    const key = freshKey("claim");
    const claim = await client.claim(key);
    assert.equal(claim.outcome, "acquired");
    if (claim.outcome !== "acquired") return;
    assert.equal(typeof claim.leaseToken, "string");
    assert.equal(claim.attempt, 1);
    assert.equal(claim.recovered, false);
    assert.ok(claim.leaseExpiresAt > new Date(Date.now() - 60_000));
    assert.ok(claim.expiresAt >= claim.leaseExpiresAt);

    const body = Buffer.from([0, 98, 105, 110, 255]);
    await assert.rejects(
      client.complete(key, "0123456789abcdef0123456789abcdef", { status: 201, body }),
      LeaseLostError,
    );
    await client.complete(key, claim.leaseToken, { status: 201, headers: { Location: "/orders/1" }, body });
    await client.complete(key, claim.leaseToken, { status: 201, headers: { Location: "/orders/1" }, body });

    const again = await client.claim(key);
    assert.equal(again.outcome, "completed");
    assert.equal(again.response?.status, 201);
    assert.deepEqual(again.response?.headers, { Location: ["/orders/1"] });
    assert.deepEqual(Buffer.from(again.response?.body ?? []), body);
  });

  test("the key with another fingerprint is a FingerprintMismatchError", async () => {
    const key = freshKey("fp");
    await client.claim(key, { fingerprint: "fp-1" });
    const err = await client.claim(key, { fingerprint: "fp-2" }).catch((e: unknown) => e);
    assert.ok(err instanceof FingerprintMismatchError, String(err));
    assert.ok(err instanceof ProblemError);
    assert.equal(err.code, "fingerprint_mismatch");
    assert.equal(err.status, 422);
  });

  test("a held key is an InProgressError with retryAfterMs; waitMs waits for the holder's result", async () => {
    const key = freshKey("held");
    const first = await client.claim(key, { leaseMs: 60_000 });
    assert.equal(first.outcome, "acquired");
    const err = await client.claim(key).catch((e: unknown) => e);
    assert.ok(err instanceof InProgressError, String(err));
    assert.equal(err.status, 409);
    assert.ok((err.retryAfterMs ?? 0) > 0, `retryAfterMs ${err.retryAfterMs}`);

    const waiting = client.claim(key, { waitMs: 20_000 });
    if (first.outcome === "acquired") await client.complete(key, first.leaseToken, { status: 200, body: "done" });
    const waited = await waiting;
    assert.equal(waited.outcome, "completed");
    if (waited.outcome === "completed") assert.equal(Buffer.from(waited.response?.body ?? []).toString(), "done");
  });

  test("release retry frees the key for the next attempt; release fail stores a failure", async () => {
    const key = freshKey("release");
    const first = await client.claim(key);
    assert.equal(first.outcome, "acquired");
    if (first.outcome !== "acquired") return;
    await client.release(key, first.leaseToken, "retry");
    const second = await client.claim(key);
    assert.equal(second.outcome, "acquired");
    assert.equal(second.attempt, 2);
    if (second.outcome !== "acquired") return;
    await client.release(key, second.leaseToken, "fail", { response: { status: 402, body: "declined" } });
    const third = await client.claim(key);
    assert.equal(third.outcome, "failed");
    assert.equal(third.response?.status, 402);
  });

  test("extend moves the lease; a wrong token is a LeaseLostError", async () => {
    const key = freshKey("extend");
    const claim = await client.claim(key, { leaseMs: 1000 });
    if (claim.outcome !== "acquired") assert.fail("not acquired");
    const extended = await client.extend(key, claim.leaseToken, 60_000);
    assert.ok(extended.leaseExpiresAt > claim.leaseExpiresAt);
    await assert.rejects(client.extend(key, "0123456789abcdef0123456789abcdef", 1000), LeaseLostError);
  });

  test("lookup and purge escape keys with reserved characters; a missing key is a NotFoundError", async () => {
    const key = `${freshKey("odd")}/a?b#c d%2F é`;
    const claim = await client.claim(key, { fingerprint: "fp", owner: "worker-7" });
    if (claim.outcome !== "acquired") assert.fail("not acquired");
    const record = await client.lookup(key);
    assert.equal(record.key, key);
    assert.equal(record.state, "pending");
    assert.equal(record.fingerprint, "fp");
    assert.equal(record.owner, "worker-7");
    assert.ok(record.leaseExpiresAt instanceof Date);
    await client.purge(key);
    const err = await client.lookup(key).catch((e: unknown) => e);
    assert.ok(err instanceof NotFoundError, String(err));
    assert.equal(err.status, 404);
    await assert.rejects(client.purge(key), NotFoundError);
  });

  test("bad input is a ProblemError naming the field", async () => {
    const err = await client.claim("").catch((e: unknown) => e);
    assert.ok(err instanceof ProblemError, String(err));
    assert.equal(err.status, 400);
    assert.match(err.detail, /key/);
  });
});

describe("bearer tokens", () => {
  let authed: Daemon;
  const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  before(async () => {
    const file = join(tmpdir(), `idemd-ts-auth-${process.pid}.yaml`);
    const sha = createHash("sha256").update(token).digest("hex");
    writeFileSync(file, `tenants:\n  team: {}\ntokens:\n  - tenant: team\n    scopes: [use]\n    sha256: ${sha}\n`);
    authed = await Daemon.start("--auth-file", file);
  });
  after(async () => {
    await authed.stop();
  });

  test("the token is sent as Authorization: Bearer; without it the answer is a plain ProblemError", async () => {
    const key = freshKey("auth");
    const claim = await new IdemClient({ baseUrl: authed.url, token }).claim(key);
    assert.equal(claim.outcome, "acquired");
    const err = await new IdemClient({ baseUrl: authed.url }).claim(key).catch((e: unknown) => e);
    assert.ok(err instanceof ProblemError, String(err));
    assert.equal(err.constructor, ProblemError);
    assert.equal(err.status, 401);
    assert.equal(err.code, "unauthenticated");
    const purge = await new IdemClient({ baseUrl: authed.url, token }).purge(key).catch((e: unknown) => e);
    assert.ok(purge instanceof ProblemError && purge.code === "forbidden", String(purge));
  });
});

describe("transport", () => {
  test("a claim whose answer was lost is resent with its claim secret and gets its own lease back", async () => {
    const proxy = await LossyProxy.start(daemon.url, 1);
    try {
      const key = freshKey("resent");
      const claim = await new IdemClient({ baseUrl: proxy.url, backoffMs: 1 }).claim(key, { leaseMs: 60_000 });
      assert.equal(proxy.dropped, 1, "the first answer was not dropped");
      assert.equal(claim.outcome, "acquired");
      assert.equal(claim.attempt, 1);
      if (claim.outcome !== "acquired") return;
      // The lease is the one the lost answer carried: completing with it works.
      await client.complete(key, claim.leaseToken, { status: 200 });
      assert.equal((await client.lookup(key)).state, "completed");
    } finally {
      await proxy.close();
    }
  });

  test("a claim resent without its secret is refused: the secret is what gets the lease back", async () => {
    const key = freshKey("resent-other");
    await client.claim(key, { leaseMs: 60_000, claimSecret: "a".repeat(32) });
    await assert.rejects(client.claim(key, { claimSecret: "b".repeat(32) }), InProgressError);
    const same = await client.claim(key, { claimSecret: "a".repeat(32) });
    assert.equal(same.outcome, "acquired");
  });

  test("answers that never come are retried, then an UnavailableError with status 0", async () => {
    const proxy = await LossyProxy.start(daemon.url, 10);
    try {
      const err = await new IdemClient({ baseUrl: proxy.url, retries: 2, backoffMs: 1 })
        .claim(freshKey("lost"))
        .catch((e: unknown) => e);
      assert.ok(err instanceof UnavailableError, String(err));
      assert.equal(err.status, 0);
      assert.equal(proxy.dropped, 3, "one send and two resends");
    } finally {
      await proxy.close();
    }
  });

  test("a refused connection is an UnavailableError", async () => {
    const port = await freePort();
    const err = await new IdemClient({ baseUrl: `http://127.0.0.1:${port}`, retries: 1, backoffMs: 1 })
      .lookup("k")
      .catch((e: unknown) => e);
    assert.ok(err instanceof UnavailableError, String(err));
    assert.equal(err.status, 0);
  });

  test("timeoutMs bounds a call; the caller's signal aborts it with its own reason", async () => {
    const { url, server } = await serve(() => {
      // Never answers.
    });
    try {
      const err = await new IdemClient({ baseUrl: url, timeoutMs: 200 }).claim("k").catch((e: unknown) => e);
      assert.ok(err instanceof UnavailableError, String(err));
      assert.match(err.detail, /no answer within 200 ms/);

      const controller = new AbortController();
      const call = new IdemClient({ baseUrl: url }).claim("k", { signal: controller.signal });
      const reason = new Error("shutting down");
      controller.abort(reason);
      assert.equal(await call.catch((e: unknown) => e), reason);
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  test("a problem code the client does not know is a ProblemError with status, code and detail", async () => {
    const { url, server } = await serve((_req, res) => {
      res.writeHead(429, { "Content-Type": "application/problem+json", "Retry-After": "3" });
      res.end(
        JSON.stringify({
          type: "about:blank",
          title: "Quota",
          status: 429,
          code: "monthly_quota_exceeded",
          detail: "monthly quota",
        }),
      );
    });
    try {
      const err = await new IdemClient({ baseUrl: url }).claim("k").catch((e: unknown) => e);
      assert.ok(err instanceof ProblemError, String(err));
      assert.equal(err.constructor, ProblemError);
      assert.equal(err.status, 429);
      assert.equal(err.code, "monthly_quota_exceeded");
      assert.equal(err.detail, "monthly quota");
      assert.equal(err.retryAfterMs, 3000);
    } finally {
      server.close();
    }
  });

  test("an error page from a proxy in front of idemd is an UnavailableError", async () => {
    const { url, server } = await serve((_req, res) => {
      res.writeHead(502, { "Content-Type": "text/html" });
      res.end("<html>Bad Gateway</html>");
    });
    try {
      const err = await new IdemClient({ baseUrl: url }).lookup("k").catch((e: unknown) => e);
      assert.ok(err instanceof UnavailableError, String(err));
      assert.equal(err.status, 502);
      assert.equal(err.code, "");
      assert.match(err.detail, /Bad Gateway/);
    } finally {
      server.close();
    }
  });
});
