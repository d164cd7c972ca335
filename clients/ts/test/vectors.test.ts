// The shared vectors of clients/testdata, which every client reproduces: the middleware's
// fingerprint, key and header, and the sealing format.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { fingerprint, idemdKey, parseIdempotencyKey } from "../src/fingerprint.js";
import { KeyRing, UnsealableError } from "../src/index.js";
import {
  associatedData,
  openEnvelope,
  parseResponsePlaintext,
  responsePlaintext,
  type SealContext,
  Sealer,
  sealEnvelope,
} from "../src/seal.js";

const testdata = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "testdata");

interface Vector {
  name: string;
  [field: string]: unknown;
}

function vectors(file: string): Vector[] {
  const { vectors } = JSON.parse(readFileSync(join(testdata, file), "utf8")) as { vectors: Vector[] };
  assert.ok(vectors.length > 0, `${file} has no vectors`);
  return vectors;
}

/** A byte string of a vector: the field, or its _base64 twin. */
function bytes(v: Vector, field: string): Buffer {
  if (typeof v[`${field}_base64`] === "string") return Buffer.from(v[`${field}_base64`] as string, "base64");
  return Buffer.from(v[field] as string, "utf8");
}

const str = (v: Vector, field: string) => (typeof v[field] === "string" ? (v[field] as string) : undefined);

describe("fingerprint.json", () => {
  for (const v of vectors("fingerprint.json")) {
    test(v.name, () => {
      const got = fingerprint({
        method: v.method as string,
        path: v.path as string,
        query: v.query as string,
        contentType: str(v, "content_type"),
        contentEncoding: str(v, "content_encoding"),
        body: bytes(v, "body"),
      });
      assert.equal(got.canonicalJSON, v.canonical_json);
      assert.deepEqual(Buffer.from(got.hashedBody), bytes(v, "hashed_body"));
      assert.equal(got.fingerprint, v.fingerprint);
    });
  }
});

describe("idemd_key.json", () => {
  for (const v of vectors("idemd_key.json")) {
    test(v.name, () => {
      assert.equal(idemdKey(v.scope as string, v.key as string), v.idemd_key);
    });
  }
});

describe("idempotency_key_header.json", () => {
  for (const v of vectors("idempotency_key_header.json")) {
    test(v.name, () => {
      const got = parseIdempotencyKey(v.field_lines as string[]);
      if (v.missing === true) assert.deepEqual(got, { missing: true });
      else if (v.error === true) assert.ok("error" in got, `read as ${JSON.stringify(got)}`);
      else assert.deepEqual(got, { key: v.key });
    });
  }
});

describe("sealing.json", () => {
  interface Sealed extends Vector {
    kind: "response" | "recovery_point";
    tenant: string;
    key: string;
    status?: number;
    point?: string;
    headers?: Record<string, string[]>;
  }
  const file = JSON.parse(readFileSync(join(testdata, "sealing.json"), "utf8")) as {
    ring: { id: string; key_base64: string }[];
    vectors: Sealed[];
    refusals: (Sealed & { error: string; key_id?: string })[];
  };
  const keys = file.ring.map((k) => ({ id: k.id, key: Buffer.from(k.key_base64, "base64") }));
  const ring = new KeyRing(keys);
  const context = (v: Sealed): SealContext =>
    v.kind === "response"
      ? { kind: "response", tenant: v.tenant, key: v.key, status: v.status as number }
      : { kind: "point", tenant: v.tenant, key: v.key, point: v.point as string };
  const head = (keyId: string) => Buffer.concat([Buffer.from([0xc1, 1, keyId.length]), Buffer.from(keyId)]);

  assert.ok(file.vectors.length > 0 && file.refusals.length > 0, "sealing.json has no vectors or refusals");
  for (const v of file.vectors) {
    test(`seals and opens: ${v.name}`, () => {
      const keyId = v.key_id as string;
      // A ring whose sealing key is the vector's, the others after it.
      const sealing = new KeyRing([...keys.filter((k) => k.id === keyId), ...keys.filter((k) => k.id !== keyId)]);
      assert.equal(sealing.sealingKeyId, keyId);
      const plaintext = v.kind === "response" ? responsePlaintext(v.headers ?? {}, bytes(v, "body")) : bytes(v, "data");
      assert.deepEqual(plaintext, bytes(v, "plaintext"));
      assert.deepEqual(associatedData(context(v), head(keyId)), bytes(v, "aad"));
      const random = bytes(v, "random");
      const drawn: number[] = [];
      const envelope = sealEnvelope(sealing, context(v), plaintext, (n) => {
        drawn.push(n);
        return random;
      });
      assert.deepEqual(drawn, [28]);
      assert.equal(envelope.toString("base64"), v.sealed_base64);

      const opened = openEnvelope(ring, context(v), bytes(v, "sealed"));
      if (v.kind === "response") {
        const { headers, body } = parseResponsePlaintext(opened);
        assert.deepEqual(headers, v.headers ?? {});
        assert.deepEqual(body, bytes(v, "body"));
      } else {
        assert.deepEqual(opened, bytes(v, "data"));
        // The client's path too: a point's data that is an envelope opens.
        const point = new Sealer(v.tenant, ring).openPoint(v.key, v.point as string, bytes(v, "sealed"));
        assert.deepEqual(Buffer.from(point), bytes(v, "data"));
      }
    });
  }
  for (const r of file.refusals) {
    test(`refuses: ${r.name}`, () => {
      assert.throws(
        () => openEnvelope(ring, context(r), bytes(r, "sealed")),
        (err) =>
          err instanceof UnsealableError &&
          err.reason === r.error &&
          err.keyId === (r.key_id ?? "") &&
          err.message.length > 0,
      );
    });
  }
});
