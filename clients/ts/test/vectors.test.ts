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
    version?: number;
    kind: "response" | "recovery_point";
    outcome?: "completed" | "failed";
    no_response?: boolean;
    tenant: string;
    key: string;
    status?: number;
    point?: string;
    headers?: Record<string, string[]>;
  }
  const file = JSON.parse(readFileSync(join(testdata, "sealing.json"), "utf8")) as {
    ring: { id: string; key_base64: string }[];
    ring_texts: { name: string; text: string; key_ids?: string[]; error?: boolean }[];
    vectors: Sealed[];
    refusals: (Sealed & { error: string; key_id?: string })[];
  };
  const keys = file.ring.map((k) => ({ id: k.id, key: Buffer.from(k.key_base64, "base64") }));
  const ring = new KeyRing(keys);
  const context = (v: Sealed, outcome = v.outcome ?? "completed"): SealContext =>
    v.kind === "response"
      ? { kind: outcome, tenant: v.tenant, key: v.key, status: v.status as number }
      : { kind: "point", tenant: v.tenant, key: v.key, point: v.point as string };
  const head = (version: number, keyId: string) =>
    Buffer.concat([Buffer.from([0xc1, version, keyId.length]), Buffer.from(keyId)]);
  /** Opens a result's envelope as the client does, for a record of outcome. */
  const openAs = (v: Sealed, outcome: "completed" | "failed") => {
    const stored = { present: true, status: v.status as number, sealed: bytes(v, "sealed") };
    const opened = new Sealer(v.tenant, ring).openResponse(v.key, outcome, stored, () => assert.fail("plain"));
    if (v.no_response) {
      assert.equal(opened, undefined);
      return;
    }
    assert.deepEqual(opened?.headers, v.headers ?? {});
    assert.deepEqual(opened?.body, bytes(v, "body"));
  };

  assert.ok(file.vectors.length > 0 && file.refusals.length > 0, "sealing.json has no vectors or refusals");
  assert.ok(file.ring_texts.length > 0, "sealing.json has no ring texts");
  for (const rt of file.ring_texts) {
    test(`reads the ring text: ${rt.name}`, () => {
      if (rt.error) {
        assert.throws(() => KeyRing.parse(rt.text), TypeError);
        return;
      }
      const parsed = KeyRing.parse(rt.text);
      assert.deepEqual(parsed.keyIds, rt.key_ids);
      assert.equal(parsed.sealingKeyId, rt.key_ids?.[0]);
    });
  }
  for (const v of file.vectors) {
    test(`seals and opens: version ${v.version}, ${v.name}`, () => {
      const keyId = v.key_id as string;
      const plaintext =
        v.kind === "recovery_point"
          ? bytes(v, "data")
          : v.no_response
            ? Buffer.alloc(0)
            : responsePlaintext(v.headers ?? {}, bytes(v, "body"));
      assert.deepEqual(plaintext, bytes(v, "plaintext"));
      assert.deepEqual(associatedData(context(v), head(v.version as number, keyId)), bytes(v, "aad"));
      assert.equal(bytes(v, "sealed")[1], v.version);
      if (v.version === 2) {
        // Clients write version 2 only; the vectors of version 1 are opened.
        const sealing = new KeyRing([...keys.filter((k) => k.id === keyId), ...keys.filter((k) => k.id !== keyId)]);
        assert.equal(sealing.sealingKeyId, keyId);
        const random = bytes(v, "random");
        const drawn: number[] = [];
        const sealer = new Sealer(v.tenant, sealing, (n) => {
          drawn.push(n);
          return random;
        });
        const envelope =
          v.kind === "recovery_point"
            ? sealer.sealPoint(v.key, v.point as string, plaintext)
            : v.no_response
              ? sealer.sealNoResponse(v.key)
              : sealer.sealResponse(
                  v.key,
                  v.outcome ?? "completed",
                  v.status as number,
                  v.headers ?? {},
                  bytes(v, "body"),
                );
        assert.deepEqual(drawn, [28]);
        assert.equal(Buffer.from(envelope ?? []).toString("base64"), v.sealed_base64);
        assert.equal(sealEnvelope(sealing, context(v), plaintext, () => random).toString("base64"), v.sealed_base64);
      }

      const opened = openEnvelope(ring, context(v), bytes(v, "sealed"));
      if (v.kind === "response") {
        if (!v.no_response) {
          const { headers, body } = parseResponsePlaintext(opened);
          assert.deepEqual(headers, v.headers ?? {});
          assert.deepEqual(body, bytes(v, "body"));
        }
        // Version 1 does not bind the outcome: its results open as either.
        if (v.version === 1) {
          openAs(v, "completed");
          openAs(v, "failed");
        } else openAs(v, v.outcome ?? "completed");
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
      const sealed = bytes(r, "sealed");
      const stored = { present: true, status: r.status as number, sealed };
      const opener = new Sealer(r.tenant, ring);
      assert.throws(
        () =>
          r.kind === "response"
            ? opener.openResponse(r.key, r.outcome ?? "completed", stored, () => assert.fail("plain"))
            : opener.openPoint(r.key, r.point as string, sealed),
        (err) =>
          err instanceof UnsealableError &&
          err.reason === r.error &&
          err.keyId === (r.key_id ?? "") &&
          err.message.length > 0,
      );
    });
  }
});
