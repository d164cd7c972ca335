import { createHash } from "node:crypto";

/**
 * Derives a key from a message's stable fields (for example the topic, the partition and
 * the producer's message ID; never the delivery count or the receive time). Each part is
 * length-prefixed before hashing, so ("ab", "c") and ("a", "bc") give different keys.
 * The Go client's MessageKey gives the same key for the same parts.
 */
export function messageKey(...parts: string[]): string {
  const hash = createHash("sha256");
  for (const part of parts) {
    const bytes = Buffer.from(part, "utf8");
    const length = Buffer.alloc(8);
    length.writeBigUInt64BE(BigInt(bytes.length));
    hash.update(length).update(bytes);
  }
  return `msg-${hash.digest("hex")}`;
}

/**
 * The message header that carries an idemd key from the request that published a message
 * to its consumers: the lease's key, as idempotencyLease gives it inside a request
 * handled by the middleware (or run). The name and the value are the same in every idemd
 * client.
 */
export const messageHeader = "idemd-key";

/**
 * Derives the key of one step of the work that key started: a consumer of a message
 * whose messageHeader is key runs step "charge" under stepKey(key, "charge"), so one
 * request can fan out to several steps without their keys colliding. The Go client's
 * StepKey gives the same key.
 */
export function stepKey(key: string, step: string): string {
  return messageKey("step", key, step);
}
