import { createHash } from "node:crypto";
import { canonicalJSON, isJSONMediaType } from "./canonical.js";

/**
 * The digest the middleware claims with, the same as the Go client's Fingerprint:
 * SHA-256, hex, over the method, the escaped path and the body, a JSON body in its
 * canonical form (object keys sorted, spacing dropped, numbers kept as written).
 * `target` is the request target as received (path and query; the query is left out).
 */
export function fingerprint(method: string, target: string, contentType: string | undefined, body: Uint8Array): string {
  const hash = createHash("sha256");
  hash.update(`${method}\n${escapedPath(target)}\n`, "utf8");
  hash.update(isJSONMediaType(contentType) ? canonicalJSON(body) : body);
  return hash.digest("hex");
}

// The bytes Go's url package leaves unescaped in a path.
const pathSafe = /^[A-Za-z0-9\-_.~$&+,/:;=@!'()*]$/;

/**
 * The path of a request target as Go's URL.EscapedPath gives it: as sent when it is
 * validly escaped, else unescaped and escaped again the way Go escapes a path.
 */
export function escapedPath(target: string): string {
  const raw = target.split("?")[0] ?? "";
  const bytes = Buffer.from(raw, "latin1");
  let valid = true;
  for (let i = 0; i < bytes.length && valid; i++) {
    const c = String.fromCharCode(bytes[i] ?? 0);
    if (c === "%") {
      valid = /^[0-9a-fA-F]{2}$/.test(raw.slice(i + 1, i + 3));
      i += 2;
    } else if (c !== "[" && c !== "]" && !pathSafe.test(c)) {
      valid = false;
    }
  }
  if (valid) return raw;
  const unescaped: number[] = [];
  for (let i = 0; i < bytes.length; i++) {
    const hex = raw.slice(i + 1, i + 3);
    if (bytes[i] === 0x25 && /^[0-9a-fA-F]{2}$/.test(hex)) {
      unescaped.push(Number.parseInt(hex, 16));
      i += 2;
    } else {
      unescaped.push(bytes[i] ?? 0);
    }
  }
  let out = "";
  for (const b of unescaped) {
    const c = String.fromCharCode(b);
    out += b < 0x80 && pathSafe.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}
