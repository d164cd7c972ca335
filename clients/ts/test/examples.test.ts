import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { fastifyApp } from "../examples/fastify.js";
import { consume, expressApp, runOnce } from "../examples/readme.js";
import { chargeOnce } from "../examples/sealing.js";
import { IdemClient } from "../src/index.js";
import { Daemon, freshKey } from "./daemon.js";

let daemon: Daemon;
before(async () => {
  daemon = await Daemon.start();
});
after(async () => {
  await daemon.stop();
});

test("the README's run example sends once and replays", async () => {
  const sent: string[] = [];
  const sendEmail = async (to: string) => {
    sent.push(to);
    return { messageId: `m-${sent.length}` };
  };
  assert.deepEqual(await runOnce(daemon.url, sendEmail), { value: { messageId: "m-1" }, replayed: false });
  assert.deepEqual(await runOnce(daemon.url, sendEmail), { value: { messageId: "m-1" }, replayed: true });
  assert.deepEqual(sent, ["user-42@example.org"]);
});

test("the README's queue example handles a redelivered message once", async () => {
  const client = new IdemClient({ baseUrl: daemon.url });
  const message = { topic: "orders", partition: 0, id: freshKey("message") };
  let handled = 0;
  const handle = async () => {
    handled++;
  };
  assert.equal(await consume(client, message, handle), true);
  assert.equal(await consume(client, message, handle), false);
  assert.equal(handled, 1);
});

test("the README's Express and Fastify apps run an order once per key and user", async () => {
  const client = new IdemClient({ baseUrl: daemon.url });
  let orders = 0;
  const order = () => ({ id: ++orders });
  const ex = expressApp(
    client,
    (req, _res, next) => {
      req.user = { id: String(req.headers["x-user"]) };
      next();
    },
    (_req, res) => {
      res.status(201).json(order());
    },
  );
  const server = ex.listen(0, "127.0.0.1");
  await new Promise((resolve) => server.once("listening", resolve));
  const fa = await fastifyApp(
    client,
    async (request) => {
      request.user = { id: String(request.headers["x-user"]) };
    },
    async (_request, reply) => reply.code(201).send(order()),
  );
  await fa.listen({ port: 0, host: "127.0.0.1" });
  try {
    for (const port of [(server.address() as AddressInfo).port, (fa.server.address() as AddressInfo).port]) {
      const key = freshKey("readme-order");
      const post = (user: string) =>
        fetch(`http://127.0.0.1:${port}/orders`, {
          method: "POST",
          headers: { "Idempotency-Key": key, "Content-Type": "application/json", "X-User": user },
          body: JSON.stringify({ item: "book" }),
        });
      const before = orders;
      const first = await post("alice");
      const retry = await post("alice");
      const other = await post("bob");
      assert.equal(first.status, 201);
      assert.equal(retry.headers.get("Idempotent-Replayed"), "true");
      assert.deepEqual(await retry.json(), await first.json());
      assert.equal(other.headers.get("Idempotent-Replayed"), null);
      assert.equal(orders - before, 2, "alice's retry did not run; bob's request did");
    }
  } finally {
    server.closeAllConnections();
    server.close();
    await fa.close();
  }
});

test("the client README's sealing example charges once, replays it opened, and names a key it lacks", async () => {
  const previous = process.env.IDEMD_SEAL_KEYS;
  const key = (id: string) => `${id}=${randomBytes(32).toString("base64")}`;
  const old = key("k-2026-05");
  const charges: string[] = [];
  const createCharge = async () => {
    charges.push(`ch_${charges.length + 1}`);
    return { id: charges.at(-1) as string, amount: 4200 };
  };
  const orderId = freshKey("sealed-order");
  try {
    process.env.IDEMD_SEAL_KEYS = `# the ring\n${old}`;
    const first = await chargeOnce(daemon.url, orderId, createCharge);
    assert.deepEqual(first, { charge: { id: "ch_1", amount: 4200 }, replayed: false });
    process.env.IDEMD_SEAL_KEYS = `${key("k-2026-11")},${old}`;
    assert.deepEqual(await chargeOnce(daemon.url, orderId, createCharge), { ...first, replayed: true });
    process.env.IDEMD_SEAL_KEYS = key("k-2026-11");
    assert.deepEqual(await chargeOnce(daemon.url, orderId, createCharge), { unsealable: "unknown_key k-2026-05" });
    assert.deepEqual(charges, ["ch_1"]);
  } finally {
    if (previous === undefined) delete process.env.IDEMD_SEAL_KEYS;
    else process.env.IDEMD_SEAL_KEYS = previous;
  }
});

test("the client README shows the sealing example's code", () => {
  const here = dirname(fileURLToPath(import.meta.url));
  const source = readFileSync(join(here, "..", "..", "examples", "sealing.ts"), "utf8");
  const readme = readFileSync(join(here, "..", "..", "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("## Sealing"));
  const blocks = [...section.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
  const regions = [...source.matchAll(/\/\/ #region readme-[\w-]+\n([\s\S]*?)\s*\/\/ #endregion/g)].map((m) =>
    dedent(m[1] ?? ""),
  );
  assert.equal(blocks.length, 1, "one ts block in the client README's Sealing section");
  assert.equal(regions.length, 1, "one readme region in examples/sealing.ts");
  const lines = (blocks[0] ?? "").split("\n").filter((l) => l.trim() !== "" && !l.startsWith("import "));
  assert.deepEqual(
    lines,
    (regions[0] ?? "").split("\n").filter((l) => l.trim() !== ""),
  );
});

test("the README shows the examples' code", () => {
  const here = dirname(fileURLToPath(import.meta.url));
  // Compiled to dist/test; the sources are two and four levels up.
  const source = ["readme.ts", "fastify.ts", "effects.ts"]
    .map((f) => readFileSync(join(here, "..", "..", "examples", f), "utf8"))
    .join("\n");
  const readme = readFileSync(join(here, "..", "..", "..", "..", "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("## From TypeScript"));
  const blocks = [...section.slice(0, section.indexOf("\n## ", 3)).matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
  const regions = [...source.matchAll(/\/\/ #region readme-[\w-]+\n([\s\S]*?)\s*\/\/ #endregion/g)].map((m) =>
    dedent(m[1] ?? ""),
  );
  assert.ok(blocks.length > 0, "no ts blocks in the README's From TypeScript section");
  for (const block of blocks) {
    const lines = (block ?? "").split("\n").filter((l) => l.trim() !== "" && !l.startsWith("import "));
    for (const line of lines) {
      assert.ok(
        regions.some((r) => r.split("\n").includes(line)),
        `README line not cut from examples/: ${JSON.stringify(line)}`,
      );
    }
  }
});

function dedent(text: string): string {
  const lines = text.split("\n");
  const indent = Math.min(...lines.filter((l) => l.trim() !== "").map((l) => l.length - l.trimStart().length));
  return lines.map((l) => l.slice(indent)).join("\n");
}
