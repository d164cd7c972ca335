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
