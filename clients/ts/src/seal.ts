// Sealing: the client seals the results it stores and the recovery points it records
// with keys idemd never sees, and opens them when they come back (docs/sealing.md).
//
// An envelope is
//
//     0xC1 | version 2 | len(key id) | key id | salt (16) | nonce (12) | ciphertext | tag (16)
//
// sealed with AES-256-GCM under a key derived for the one message, HKDF-SHA256(ring key,
// salt, "idemd seal v1"), so that random nonces never meet the 2^32-messages-per-key
// limit of GCM with a fixed key. The associated data binds the envelope's head, what it
// seals (a completed result, a failed one, or a recovery point), the tenant, the idemd
// key and, for a result, its readable status or, for a recovery point, its name: an
// envelope moved to another key, tenant, status, outcome or point fails to open.
// Version 1, which clients wrote before, still opens; it does not bind a result's
// outcome, so a failed result's envelope opens as a completed one and back.
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from "node:crypto";
import { UnsealableError } from "./errors.js";

const marker = 0xc1;
const version = 2;
const version1 = 1;
const saltBytes = 16;
const nonceBytes = 12;
const tagBytes = 16;
const keyBytes = 32;
const maxKeyIdBytes = 32;
const info = "idemd seal v1";

/** One key of a ring: an id of 1 to 32 letters, digits, '.', '_' or '-', and 32 random bytes. */
export interface SealKey {
  id: string;
  key: Uint8Array;
}

export interface KeyRingOptions {
  /**
   * Refuse plain results and recovery points (an UnsealableError with reason
   * not_sealed) instead of passing them through. A ring that allows them reads what was
   * stored before sealing was turned on; one that requires them also stops whoever can
   * write the store from slipping in a plain result of their own. Default false.
   */
  requireSealed?: boolean;
}

/** Draws n random bytes: the salt and nonce of an envelope. */
export type RandomSource = (n: number) => Uint8Array;

/** What an envelope is bound to besides its head: a result's outcome and status, or a point's name. */
export type SealContext =
  | { kind: Outcome; tenant: string; key: string; status: number }
  | { kind: "point"; tenant: string; key: string; point: string };

/** The outcome of a finished record, which a result's envelope is bound to. */
export type Outcome = "completed" | "failed";

/** The byte that says, in the associated data, what an envelope of a version seals. */
function kindByte(kind: SealContext["kind"], envelopeVersion: number | undefined): string {
  if (kind === "point") return "P";
  if (envelopeVersion === version1) return "R";
  return kind === "failed" ? "F" : "C";
}

/**
 * The status under which a failure without a response is stored sealed: a failed
 * result whose envelope holds nothing, not even the count of header names every
 * response's plaintext starts with.
 */
export const noResponseStatus = 500;

let sealWith: (ring: KeyRing, context: SealContext, plaintext: Uint8Array, random: RandomSource) => Buffer;
let openWith: (ring: KeyRing | undefined, context: SealContext, envelope: Uint8Array) => Buffer;

/**
 * The keys that open sealed results and recovery points, and the one that seals (the
 * first). Rotating is making a ring whose first key is new and keeping the old ones in
 * it for as long as results sealed with them are retained (docs/sealing.md).
 *
 *     const ring = KeyRing.parse(process.env.IDEMD_SEAL_KEYS ?? "");
 *     const client = new IdemClient({ baseUrl, sealing: { tenant: "payments", ring } });
 */
export class KeyRing {
  readonly #sealing: { id: string; key: Buffer };
  readonly #keys: ReadonlyMap<string, Buffer>;
  /** Whether the ring refuses plain results and recovery points (KeyRingOptions.requireSealed). */
  readonly requireSealed: boolean;

  static {
    sealWith = (ring, context, plaintext, random) => seal(ring.#sealing, context, plaintext, random);
    openWith = (ring, context, envelope) => open(ring === undefined ? undefined : ring.#keys, context, envelope);
  }

  /**
   * Makes a ring of keys; the first seals, every one opens. Throws a TypeError for no
   * keys, an id that is not 1 to 32 letters, digits, '.', '_' or '-', a key that is not
   * 32 bytes, or an id given twice. The key bytes are copied.
   */
  constructor(keys: readonly SealKey[], options: KeyRingOptions = {}) {
    if (!Array.isArray(keys) || keys.length === 0) throw new TypeError("idem: a key ring needs at least one key");
    const ring = new Map<string, Buffer>();
    keys.forEach((k, i) => {
      const problem = keyIdProblem(k?.id);
      if (problem) throw new TypeError(`idem: key ring entry ${i}: ${problem}`);
      if (!(k.key instanceof Uint8Array) || k.key.length !== keyBytes) {
        const size = k.key instanceof Uint8Array ? `${k.key.length} bytes` : "not bytes";
        throw new TypeError(`idem: key ${JSON.stringify(k.id)} is ${size}; a sealing key is ${keyBytes} random bytes`);
      }
      if (ring.has(k.id)) throw new TypeError(`idem: key id ${JSON.stringify(k.id)} is in the ring twice`);
      ring.set(k.id, Buffer.from(k.key));
    });
    const first = keys[0] as SealKey;
    this.#sealing = { id: first.id, key: ring.get(first.id) as Buffer };
    this.#keys = ring;
    this.requireSealed = options.requireSealed ?? false;
  }

  /**
   * Reads a ring from its text form, as the IDEMD_SEAL_KEYS variable and key files hold
   * it (docs/sealing.md): entries "id=base64 of 32 bytes" separated by commas or line
   * feeds, the first of which seals. Spaces, tabs and carriage returns around lines,
   * entries, ids and keys are skipped, and so are blank lines and lines starting with
   * '#'. A key is standard base64 with its padding and zero pad bits. Throws a TypeError
   * naming the entry (never the key) that is wrong.
   */
  static parse(text: string, options: KeyRingOptions = {}): KeyRing {
    const keys: SealKey[] = [];
    for (const rawLine of String(text).split("\n")) {
      const line = trimRingSpace(rawLine);
      if (line === "" || line.startsWith("#")) continue;
      for (const rawEntry of line.split(",")) {
        const entry = trimRingSpace(rawEntry);
        if (entry === "") continue;
        const at = entry.indexOf("=");
        if (at < 0) throw new TypeError(`idem: key ring entry ${keys.length} is not id=base64`);
        const id = trimRingSpace(entry.slice(0, at));
        const b64 = trimRingSpace(entry.slice(at + 1));
        if (!isStdBase64(b64)) throw new TypeError(`idem: key ${JSON.stringify(id)}: not standard base64`);
        keys.push({ id, key: Buffer.from(b64, "base64") });
      }
    }
    return new KeyRing(keys, options);
  }

  /** The id of the key that seals. */
  get sealingKeyId(): string {
    return this.#sealing.id;
  }

  /** The ids of the ring's keys, the sealing one first; never the keys. */
  get keyIds(): string[] {
    return [...this.#keys.keys()];
  }
}

/**
 * Trims what the ring's text form counts as space: ASCII spaces, tabs and carriage
 * returns, so that every client reads a ring alike.
 */
function trimRingSpace(s: string): string {
  return s.replace(/^[ \t\r]+|[ \t\r]+$/g, "");
}

/** Why id is not a key id, or undefined when it is one. */
function keyIdProblem(id: unknown): string | undefined {
  if (typeof id !== "string") return "the key id is not a string";
  if (!/^[A-Za-z0-9._-]{1,32}$/.test(id)) {
    return `key id ${JSON.stringify(id)}: 1 to ${maxKeyIdBytes} letters, digits, '.', '_' or '-'`;
  }
  return undefined;
}

/** Standard base64 with its padding, as Go's base64.StdEncoding reads it. */
function isStdBase64(s: string): boolean {
  return s.length % 4 === 0 && /^[A-Za-z0-9+/]*={0,2}$/.test(s) && Buffer.from(s, "base64").toString("base64") === s;
}

function u16(n: number, what: string): Buffer {
  if (!Number.isInteger(n) || n < 0 || n > 0xffff)
    throw new RangeError(`idem: ${what} is ${n}; sealing holds 0 to 65535`);
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n);
  return b;
}

function string16(s: string, what: string): Buffer[] {
  const bytes = Buffer.from(s, "utf8");
  return [u16(bytes.length, `the length of ${what}`), bytes];
}

/** The associated data of an envelope whose head (marker, version, id length and id) is head. */
export function associatedData(context: SealContext, head: Uint8Array): Buffer {
  const parts: Buffer[] = [Buffer.from(head), Buffer.from(kindByte(context.kind, head[1]), "latin1")];
  parts.push(...string16(context.tenant, "the tenant"), ...string16(context.key, "the key"));
  if (context.kind === "point") parts.push(...string16(context.point, "the recovery point's name"));
  else parts.push(u16(context.status, "the status"));
  return Buffer.concat(parts);
}

function subkey(key: Buffer, salt: Uint8Array): Buffer {
  return Buffer.from(hkdfSync("sha256", key, salt, info, keyBytes));
}

function seal(
  sealing: { id: string; key: Buffer },
  context: SealContext,
  plaintext: Uint8Array,
  random: RandomSource,
): Buffer {
  const head = Buffer.concat([Buffer.from([marker, version, sealing.id.length]), Buffer.from(sealing.id, "ascii")]);
  const drawn = random(saltBytes + nonceBytes);
  if (drawn.length !== saltBytes + nonceBytes) throw new Error("idem: the random source gave too few bytes");
  const salt = drawn.subarray(0, saltBytes);
  const nonce = drawn.subarray(saltBytes);
  const cipher = createCipheriv("aes-256-gcm", subkey(sealing.key, salt), nonce, { authTagLength: tagBytes });
  cipher.setAAD(associatedData(context, head));
  const sealed = Buffer.concat([cipher.update(plaintext), cipher.final()]);
  return Buffer.concat([head, drawn, sealed, cipher.getAuthTag()]);
}

/**
 * The key id an envelope names, or undefined when it is not an envelope this format
 * reads: another first byte or version, or shorter than its head, salt, nonce and tag.
 */
function envelopeHead(envelope: Uint8Array): { id: string; head: number } | undefined {
  if (envelope.length < 3 || envelope[0] !== marker || (envelope[1] !== version && envelope[1] !== version1))
    return undefined;
  const n = envelope[2] as number;
  const head = 3 + n;
  if (n === 0 || envelope.length < head + saltBytes + nonceBytes + tagBytes) return undefined;
  return { id: Buffer.from(envelope.subarray(3, head)).toString("latin1"), head };
}

/** Opens an envelope with keys; no keys (a client without a ring) holds no key it names. */
function open(keys: ReadonlyMap<string, Buffer> | undefined, context: SealContext, envelope: Uint8Array): Buffer {
  const parsed = envelopeHead(envelope);
  if (parsed === undefined) throw new UnsealableError("invalid");
  const { id, head } = parsed;
  const key = keys?.get(id);
  if (key === undefined) throw new UnsealableError("unknown_key", id);
  const salt = envelope.subarray(head, head + saltBytes);
  const nonce = envelope.subarray(head + saltBytes, head + saltBytes + nonceBytes);
  const body = envelope.subarray(head + saltBytes + nonceBytes);
  try {
    const decipher = createDecipheriv("aes-256-gcm", subkey(key, salt), nonce, { authTagLength: tagBytes });
    decipher.setAAD(associatedData(context, envelope.subarray(0, head)));
    decipher.setAuthTag(body.subarray(body.length - tagBytes));
    return Buffer.concat([decipher.update(body.subarray(0, body.length - tagBytes)), decipher.final()]);
  } catch (err) {
    throw new UnsealableError("invalid", id, { cause: err });
  }
}

/**
 * What a result's envelope holds: its headers, names in byte order and each name's
 * values in order, then its body.
 *
 *     u16 names | per name: u16 len, name, u16 values, per value: u32 len, value | body
 */
export function responsePlaintext(headers: Readonly<Record<string, readonly string[]>>, body: Uint8Array): Buffer {
  const names = Object.keys(headers)
    .map((name) => Buffer.from(name, "utf8"))
    .sort(Buffer.compare);
  const parts: Buffer[] = [u16(names.length, "the number of header names")];
  for (const name of names) {
    const values = headers[name.toString("utf8")] ?? [];
    parts.push(u16(name.length, "a header name's length"), name, u16(values.length, "the number of a header's values"));
    for (const value of values) {
      const bytes = Buffer.from(value, "utf8");
      const length = Buffer.alloc(4);
      length.writeUInt32BE(bytes.length);
      parts.push(length, bytes);
    }
  }
  parts.push(Buffer.from(body));
  return Buffer.concat(parts);
}

/** Reads a result's plaintext back into its headers and body. */
export function parseResponsePlaintext(
  plaintext: Buffer,
  keyId?: string,
): { headers: Record<string, string[]>; body: Buffer } {
  let at = 0;
  const take = (n: number): Buffer => {
    if (at + n > plaintext.length) throw new UnsealableError("invalid", keyId);
    const b = plaintext.subarray(at, at + n);
    at += n;
    return b;
  };
  const headers: Record<string, string[]> = {};
  const names = take(2).readUInt16BE();
  for (let i = 0; i < names; i++) {
    const name = take(take(2).readUInt16BE()).toString("utf8");
    const count = take(2).readUInt16BE();
    const values: string[] = [];
    for (let j = 0; j < count; j++) values.push(take(take(4).readUInt32BE()).toString("utf8"));
    headers[name] = values;
  }
  return { headers, body: Buffer.from(plaintext.subarray(at)) };
}

/** Seals plaintext with ring's sealing key; random gives the salt and nonce (crypto's outside the vectors' tests). */
export function sealEnvelope(
  ring: KeyRing,
  context: SealContext,
  plaintext: Uint8Array,
  random: RandomSource = randomBytes,
): Buffer {
  return sealWith(ring, context, plaintext, random);
}

/**
 * Opens an envelope sealed under context with any key of ring; without a ring, every
 * envelope names a key the client does not hold (unknown_key).
 */
export function openEnvelope(ring: KeyRing | undefined, context: SealContext, envelope: Uint8Array): Buffer {
  return openWith(ring, context, envelope);
}

/**
 * The sealing of one client: its tenant and ring, or none. It seals what the client
 * stores and records, and opens what comes back.
 */
export class Sealer {
  readonly tenant: string;
  readonly ring: KeyRing | undefined;
  readonly #random: RandomSource;

  constructor(tenant: string, ring: KeyRing | undefined, random: RandomSource = randomBytes) {
    this.tenant = tenant;
    this.ring = ring;
    this.#random = random;
  }

  /** A client without sealing: it stores plain, and refuses what comes back sealed. */
  static readonly none = new Sealer("", undefined);

  /**
   * The envelope of a result's headers and body, bound to key, its status and outcome;
   * undefined without a ring.
   */
  sealResponse(
    key: string,
    outcome: Outcome,
    status: number,
    headers: Readonly<Record<string, readonly string[]>>,
    body: Uint8Array,
  ): Buffer | undefined {
    if (this.ring === undefined) return undefined;
    const context: SealContext = { kind: outcome, tenant: this.tenant, key, status };
    return sealEnvelope(this.ring, context, responsePlaintext(headers, body), this.#random);
  }

  /**
   * The envelope of a failure released without a response (under noResponseStatus), so
   * that a ring requiring sealing can tell it from a failure slipped into the store;
   * undefined without a ring.
   */
  sealNoResponse(key: string): Buffer | undefined {
    if (this.ring === undefined) return undefined;
    const context: SealContext = { kind: "failed", tenant: this.tenant, key, status: noResponseStatus };
    return sealEnvelope(this.ring, context, Buffer.alloc(0), this.#random);
  }

  /**
   * Opens the stored result of a record in state (completed, failed, or one not
   * finished): sealed opens into its headers and body, or into none for a failure
   * sealed without a response; a plain one (sealed undefined) is given back as it is,
   * unless the ring requires sealed results. Under such a ring, a finished record
   * without a result at all (present false) is refused too.
   */
  openResponse(
    key: string,
    state: string,
    stored: { present: boolean; status: number; sealed: Uint8Array | undefined },
    plain: () => { headers: Record<string, string[]>; body: Buffer },
  ): { headers: Record<string, string[]>; body: Buffer } | undefined {
    const finished = state === "completed" || state === "failed";
    if (!stored.present) {
      if (finished && this.ring?.requireSealed) throw new UnsealableError("not_sealed");
      return undefined;
    }
    const { status, sealed } = stored;
    if (sealed === undefined) {
      if (this.ring?.requireSealed) throw new UnsealableError("not_sealed");
      return plain();
    }
    const outcome: Outcome = state === "failed" ? "failed" : "completed";
    const context: SealContext = { kind: outcome, tenant: this.tenant, key, status };
    const plaintext = openEnvelope(this.ring, context, sealed);
    if (plaintext.length === 0 && outcome === "failed" && sealed[1] !== version1) return undefined;
    return parseResponsePlaintext(plaintext, envelopeHead(sealed)?.id);
  }

  /** A recovery point's data as recorded: its envelope, bound to key and name; the data itself without a ring. */
  sealPoint(key: string, name: string, data: Uint8Array): Uint8Array {
    if (this.ring === undefined) return data;
    return sealEnvelope(this.ring, { kind: "point", tenant: this.tenant, key, point: name }, data, this.#random);
  }

  /**
   * A recovery point's data as the holder recorded it. Data that does not start with
   * 0xC1 is plain (recorded before sealing was turned on, or by a client without a
   * ring): given back as it is, unless the ring requires sealing. A client without a
   * ring gives every point back as it is (docs/sealing.md): a recovery point has no mark
   * of its own, and plain data may begin with the envelope's first byte.
   */
  openPoint(key: string, name: string, data: Uint8Array): Uint8Array {
    if (this.ring === undefined) return data;
    if (data.length === 0 || data[0] !== marker) {
      if (this.ring.requireSealed) throw new UnsealableError("not_sealed");
      return data;
    }
    return openEnvelope(this.ring, { kind: "point", tenant: this.tenant, key, point: name }, data);
  }
}
