// The algorithms docs/middleware.md fixes for every language, pinned by the vectors in
// clients/testdata: the request fingerprint, the idemd key of a scope and a key, and
// the reading of the Idempotency-Key header.
import { createHash } from "node:crypto";
import canonicalize from "canonicalize";

/** What the fingerprint is computed from: the request as received. */
export interface FingerprintInput {
  method: string;
  /** The path of the request-target as sent, percent-encoding untouched. */
  path: string;
  /** The bytes after the first `?` as sent; "" for none. */
  query: string;
  /** The first Content-Type field line, if any. */
  contentType?: string | undefined;
  /** The Content-Encoding field value, if any. */
  contentEncoding?: string | undefined;
  body: Uint8Array;
}

/** A fingerprint, and how it was made (for tests and for debugging a mismatch). */
export interface Fingerprint {
  /** "sha256:" and 64 lowercase hex digits. */
  fingerprint: string;
  /** Whether the body was canonicalised as JSON (RFC 8785) rather than hashed as it is. */
  canonicalJSON: boolean;
  /** The bytes that entered the hash as the body. */
  hashedBody: Uint8Array;
}

const maxDepth = 128;

/** Computes the fingerprint the middleware claims with (docs/middleware.md). */
export function fingerprint(input: FingerprintInput): Fingerprint {
  const media = mediaType(input.contentType);
  const encoding = (input.contentEncoding ?? "").trim().toLowerCase();
  const isJSON =
    (media === "application/json" || media.endsWith("+json")) &&
    (encoding === "" || encoding === "identity") &&
    input.body.length > 0;
  const canonical = isJSON ? canonicalIJSON(input.body) : undefined;
  const hashedBody = canonical ?? input.body;
  const hash = createHash("sha256");
  for (const field of [latin1(input.method), latin1(input.path), latin1(input.query), latin1(media), hashedBody]) {
    const length = Buffer.alloc(8);
    length.writeBigUInt64BE(BigInt(field.length));
    hash.update(length).update(field);
  }
  return { fingerprint: `sha256:${hash.digest("hex")}`, canonicalJSON: canonical !== undefined, hashedBody };
}

/** The media type of a Content-Type: cut at `;`, SP and HTAB trimmed, ASCII letters lowercased. */
export function mediaType(contentType: string | undefined): string {
  const head = (contentType ?? "").split(";")[0] ?? "";
  return head.replace(/^[ \t]+|[ \t]+$/g, "").replace(/[A-Z]/g, (c) => c.toLowerCase());
}

/** The RFC 8785 form of an I-JSON body (RFC 7493) as UTF-8, or undefined when it is not I-JSON. */
export function canonicalIJSON(body: Uint8Array): Uint8Array | undefined {
  let text: string;
  let value: unknown;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(body);
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!namesUniqueAndShallow(text)) return undefined;
  try {
    const out = canonicalize(value);
    return out === undefined ? undefined : Buffer.from(out, "utf8");
  } catch {
    // Infinity from an overflowing number, or a lone surrogate.
    return undefined;
  }
}

/**
 * Scans JSON text that JSON.parse accepted: false when an object repeats a member name
 * (compared after unescaping; JSON.parse keeps the last silently) or when arrays and
 * objects nest deeper than 128.
 */
function namesUniqueAndShallow(text: string): boolean {
  const stack: (Set<string> | null)[] = [];
  let expectName = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      const names = stack[stack.length - 1];
      if (expectName && names) {
        const name = JSON.parse(text.slice(i, j + 1)) as string;
        if (names.has(name)) return false;
        names.add(name);
        expectName = false;
      }
      i = j;
    } else if (c === "{" || c === "[") {
      stack.push(c === "{" ? new Set() : null);
      if (stack.length > maxDepth) return false;
      expectName = c === "{";
    } else if (c === "}" || c === "]") {
      stack.pop();
    } else if (c === ",") {
      expectName = stack[stack.length - 1] !== null;
    }
  }
  return true;
}

/**
 * The key the middleware claims in idemd for a scope and an Idempotency-Key:
 * "idempotency-key:v1:" and the hex SHA-256 of both, each length-prefixed.
 */
export function idemdKey(scope: string, key: string): string {
  const hash = createHash("sha256");
  for (const part of [Buffer.from(scope, "utf8"), latin1(key)]) {
    const length = Buffer.alloc(8);
    length.writeBigUInt64BE(BigInt(part.length));
    hash.update(length).update(part);
  }
  return `idempotency-key:v1:${hash.digest("hex")}`;
}

/** What the Idempotency-Key field lines of a request say. */
export type HeaderKey = { key: string } | { missing: true } | { error: string };

// RFC 9110 tchar, plus ":" and "/" as RFC 8941 tokens allow.
const bareKey = /^[!#$%&'*+\-.^_`|~0-9A-Za-z:/]+$/;

/**
 * Reads the Idempotency-Key field lines (each character one byte) as docs/middleware.md
 * says: one line, an sf-string or a bare token, 1 to 255 bytes.
 */
export function parseIdempotencyKey(fieldLines: readonly string[]): HeaderKey {
  if (fieldLines.length === 0) return { missing: true };
  if (fieldLines.length > 1) return { error: "more than one Idempotency-Key field line" };
  const value = (fieldLines[0] ?? "").replace(/^[ \t]+|[ \t]+$/g, "");
  if (value === "") return { error: "the Idempotency-Key is empty" };
  let key = "";
  if (value.startsWith('"')) {
    let i = 1;
    for (; i < value.length; i++) {
      const c = value.charCodeAt(i);
      if (c === 0x22) break;
      if (c === 0x5c) {
        const next = value[i + 1];
        if (next !== '"' && next !== "\\") return { error: 'a backslash in the key escapes only " or \\' };
        key += next;
        i++;
        continue;
      }
      if (c < 0x20 || c > 0x7e) return { error: "the key holds a character outside 0x20-0x7E" };
      key += value[i];
    }
    if (i >= value.length) return { error: "the key's closing quote is missing" };
    if (i !== value.length - 1) return { error: "nothing may follow the key's closing quote (no parameters)" };
  } else {
    if (!bareKey.test(value)) return { error: "an unquoted key holds only token characters; quote it" };
    key = value;
  }
  if (key.length < 1 || key.length > 255) return { error: "the key must be 1 to 255 bytes" };
  return { key };
}

function latin1(s: string): Buffer {
  return Buffer.from(s, "latin1");
}
