package io.idemd;

import java.time.Duration;

/**
 * The options of a claim, each null for the default: fingerprint (a digest of the payload; the key
 * reused with another one is a FingerprintMismatchException), lease (default the daemon's 30 s),
 * waitFor (up to 30 s for a holder to finish instead of an InProgressException), owner (replaces
 * the client's label for this claim) and claimSecret (replaces the secret made for this one claim;
 * keep it private to the one execution that made it, never derive it from a job ID).
 */
public record ClaimOptions(
    String fingerprint, Duration lease, Duration waitFor, String owner, String claimSecret) {
  public static final ClaimOptions DEFAULT = new ClaimOptions(null, null, null, null, null);

  public ClaimOptions withFingerprint(String fingerprint) {
    return new ClaimOptions(fingerprint, lease, waitFor, owner, claimSecret);
  }

  public ClaimOptions withLease(Duration lease) {
    return new ClaimOptions(fingerprint, lease, waitFor, owner, claimSecret);
  }

  public ClaimOptions withWaitFor(Duration waitFor) {
    return new ClaimOptions(fingerprint, lease, waitFor, owner, claimSecret);
  }

  public ClaimOptions withOwner(String owner) {
    return new ClaimOptions(fingerprint, lease, waitFor, owner, claimSecret);
  }

  public ClaimOptions withClaimSecret(String claimSecret) {
    return new ClaimOptions(fingerprint, lease, waitFor, owner, claimSecret);
  }
}
