// The "Sealing" snippet of clients/ts/README.md, cut from the region below;
// test/examples.test.ts runs it against a real idemd.
import { IdemClient, KeyRing, UnsealableError } from "../src/index.js";

export interface Charge {
  id: string;
  amount: number;
}

/**
 * Charges an order at most once through a client that seals, and tells what happened:
 * the charge, whether it was replayed, or why the stored one does not open here.
 */
export async function chargeOnce(
  baseUrl: string,
  orderId: string,
  createCharge: (signal: AbortSignal) => Promise<Charge>,
): Promise<{ charge: Charge; replayed: boolean } | { unsealable: string }> {
  // #region readme-sealing
  // IDEMD_SEAL_KEYS holds "id=base64 of 32 random bytes" entries, separated by commas or
  // newlines; the first key seals, every key opens.
  const ring = KeyRing.parse(process.env.IDEMD_SEAL_KEYS ?? "");
  const client = new IdemClient({ baseUrl, token: process.env.IDEMD_TOKEN, sealing: { tenant: "default", ring } });
  try {
    const { value, replayed } = await client.run(`charge:${orderId}`, async (signal, lease) => {
      const charge = await createCharge(signal);
      await lease.checkpoint("charged", charge.id); // sealed as well
      return charge;
    });
    return { charge: value, replayed };
  } catch (err) {
    // The charge ran before, and its stored result does not open with this ring:
    // err.reason is unknown_key (err.keyId names the key), invalid or not_sealed.
    if (err instanceof UnsealableError) return { unsealable: `${err.reason} ${err.keyId}` };
    throw err;
  }
  // #endregion
}
