// The lease reaches the code idemd runs: run and once hand it to fn, the middlewares to
// the handler (docs/middleware.md, L1 and L2; docs/effects.md).
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import express5 from "express";
import express4 from "express4";
import Fastify from "fastify";
import { idemdKey } from "../src/fingerprint.js";
import { IdemClient, InProgressError, type Lease, LeaseLostError } from "../src/index.js";
import { idempotency as expressIdempotency, idempotencyLease } from "../src/express.js";
import { idempotency as fastifyIdempotency } from "../src/fastify.js";
import { send, type Framework, frameworks } from "./apps.js";
import { Daemon, freePort, freshKey, stalledClient, waitFor } from "./daemon.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

/** What a lease says, without its signal. */
const fields = (lease: Lease | undefined) =>
  lease && { key: lease.key, attempt: lease.attempt, recovered: lease.recovered };

describe("run and once hand fn the lease", () => {
  test("a first claim is attempt 1, not recovered; the lease's signal is fn's", async () => {
    const key = freshKey("lease-run");
    let seen: { lease: Lease; signal: AbortSignal } | undefined;
    await client.run(key, (signal, lease) => {
      seen = { lease, signal };
      return "done";
    });
    assert.deepEqual(fields(seen?.lease), { key, attempt: 1, recovered: false });
    assert.equal(seen?.lease.signal, seen?.signal);
  });

  test("once after a release is the next attempt, and no recovery", async () => {
    const key = freshKey("lease-once");
    const leases: Lease[] = [];
    await assert.rejects(
      client.once(key, (_signal, lease) => {
        leases.push(lease);
        throw new Error("transient");
      }),
    );
    assert.equal(
      await client.once(key, (_signal, lease) => {
        leases.push(lease);
      }),
      true,
    );
    assert.deepEqual(leases.map(fields), [
      { key, attempt: 1, recovered: false },
      { key, attempt: 2, recovered: false },
    ]);
  });

  test("taking over a holder whose lease ran out is the next attempt, recovered", async () => {
    const key = freshKey("lease-recovered");
    const stalled = stalledClient(daemon.url);
    let first: Lease | undefined;
    let wake: () => void = () => undefined;
    const woken = new Promise<void>((resolve) => {
      wake = resolve;
    });
    const holding = stalled.client.run(
      key,
      async (_signal, lease) => {
        first = lease;
        stalled.cut(true);
        await woken;
        return "late";
      },
      { leaseMs: 300 },
    );
    await waitFor("the first holder to hold the key", () => first !== undefined);
    let second: Lease | undefined;
    await waitFor("the key to be taken over", async () => {
      try {
        await client.run(key, (_signal, lease) => {
          second = lease;
          return "taken over";
        });
        return true;
      } catch (err) {
        if (err instanceof InProgressError) return false;
        throw err;
      }
    });
    assert.deepEqual(fields(first), { key, attempt: 1, recovered: false });
    assert.deepEqual(fields(second), { key, attempt: 2, recovered: true });
    // Its lease runs out by its own clock (or, once the link is back, idemd says so).
    stalled.cut(false);
    await waitFor("the stalled holder's signal to abort", () => first?.signal.aborted === true);
    wake();
    await assert.rejects(holding, LeaseLostError);
  });
});

interface LeaseApp {
  url: string;
  close(): Promise<void>;
}

/**
 * A service behind the middleware whose POST and GET /orders record the lease the
 * handler finds (undefined for none) and, while hold is set, wait on it.
 */
async function leaseApp(
  framework: Framework,
  idem: IdemClient,
  seen: (Lease | undefined)[],
  options: { leaseMs?: number; failOpen?: boolean; hold?: Promise<void> } = {},
): Promise<LeaseApp> {
  const guard = {
    scope: (req: { headers: Record<string, string | string[] | undefined> }) => String(req.headers["x-user"]),
    leaseMs: options.leaseMs ?? 30_000,
    failOpen: options.failOpen ?? false,
  };
  const handle = async (lease: Lease | undefined) => {
    seen.push(lease);
    if (seen.length === 1 && options.hold) await options.hold;
  };
  if (framework === "fastify") {
    const app = Fastify();
    await app.register(fastifyIdempotency, { client: idem, ...guard });
    app.route({
      method: ["POST", "GET"],
      url: "/orders",
      handler: async (request, reply) => {
        await handle(request.idemdLease);
        return reply.code(201).send({ ok: true });
      },
    });
    await app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = app.server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}`, close: () => app.close() };
  }
  const app = framework === "express4" ? express4() : express5();
  app.use(expressIdempotency(idem, guard));
  app.all("/orders", (req, res, next) => {
    // The same lease, whichever way the handler asks.
    assert.equal(res.locals.idemdLease, idempotencyLease(req));
    handle(res.locals.idemdLease as Lease | undefined).then(() => res.status(201).json({ ok: true }), next);
  });
  const server = app.listen(0, "127.0.0.1");
  await new Promise<void>((resolve) => server.once("listening", () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const order = (key: string | undefined, method = "POST") => ({
  method,
  headers: {
    "content-type": "application/json",
    "x-user": "user-1",
    ...(key === undefined ? {} : { "idempotency-key": `"${key}"` }),
  },
  body: method === "GET" ? undefined : "{}",
});

for (const framework of frameworks) {
  describe(`${framework}: the handler finds its lease`, () => {
    test("L1 on a first request, none on a replay, L2 none when passed through", async () => {
      const seen: (Lease | undefined)[] = [];
      const app = await leaseApp(framework, client, seen);
      try {
        const key = freshKey("mw-lease");
        assert.equal((await send(`${app.url}/orders`, order(key))).status, 201);
        const replay = await send(`${app.url}/orders`, order(key));
        assert.equal(replay.headers["idempotent-replayed"], "true");
        assert.equal((await send(`${app.url}/orders`, order(undefined))).status, 201);
        assert.equal((await send(`${app.url}/orders`, order(key, "GET"))).status, 201);
        assert.deepEqual(seen.map(fields), [
          { key: idemdKey("user-1", key), attempt: 1, recovered: false },
          undefined,
          undefined,
        ]);
      } finally {
        await app.close();
      }
    });

    test("L1: a request that takes over a stalled one runs with the next attempt, recovered", async () => {
      const seen: (Lease | undefined)[] = [];
      let wake: () => void = () => undefined;
      const hold = new Promise<void>((resolve) => {
        wake = resolve;
      });
      const stalled = stalledClient(daemon.url);
      const stalledApp = await leaseApp(framework, stalled.client, seen, { leaseMs: 300, hold });
      const app = await leaseApp(framework, client, seen);
      try {
        const key = freshKey("mw-recovered");
        const first = send(`${stalledApp.url}/orders`, order(key));
        await waitFor("the first request to run", () => seen.length === 1);
        stalled.cut(true);
        await waitFor("a retry to take the key over", async () => {
          const res = await send(`${app.url}/orders`, order(key));
          if (res.status === 409) return false;
          assert.equal(res.status, 201);
          return true;
        });
        stalled.cut(false);
        wake();
        await first;
        const ikey = idemdKey("user-1", key);
        assert.deepEqual(seen.map(fields), [
          { key: ikey, attempt: 1, recovered: false },
          { key: ikey, attempt: 2, recovered: true },
        ]);
      } finally {
        wake();
        await stalledApp.close();
        await app.close();
      }
    });

    test("L2: a request run unprotected (failOpen, idemd unreachable) has no lease", async () => {
      const seen: (Lease | undefined)[] = [];
      const dead = new IdemClient({ baseUrl: `http://127.0.0.1:${await freePort()}`, retries: 0 });
      const app = await leaseApp(framework, dead, seen, { failOpen: true });
      try {
        assert.equal((await send(`${app.url}/orders`, order(freshKey("mw-open")))).status, 201);
        assert.deepEqual(seen, [undefined]);
      } finally {
        await app.close();
      }
    });
  });
}
