// The shared vectors of clients/testdata, which every client's middleware reproduces.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { fingerprint, idemdKey, parseIdempotencyKey } from "../src/fingerprint.js";

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
