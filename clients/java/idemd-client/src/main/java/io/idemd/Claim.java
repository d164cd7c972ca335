package io.idemd;

import java.time.OffsetDateTime;
import java.util.Optional;

/**
 * What a claim answered: the lease ({@link Acquired}) or the key's stored end ({@link Finished}).
 */
public sealed interface Claim permits Claim.Acquired, Claim.Finished {
  /** How many times the key has been acquired (for Finished, the attempt that finished it). */
  long attempt();

  /** When the record is forgotten. */
  OffsetDateTime expiresAt();

  /**
   * The caller holds the lease: complete, release or extend it with leaseToken. recovered says that
   * the claim took the key over from a holder whose lease ran out. sentAtNanos is the {@link
   * System#nanoTime()} at which the claim call started, before anything was sent: the lease's local
   * deadline is reckoned from it (see {@link Lease}), since idemd started the lease later, when the
   * claim reached it. recoveryPoint is the last point an earlier holder of the key recorded, which
   * this lease starts from: handed on by a takeover and by a claim after a release for a retry.
   */
  record Acquired(
      String leaseToken,
      OffsetDateTime leaseExpiresAt,
      long attempt,
      boolean recovered,
      OffsetDateTime expiresAt,
      long sentAtNanos,
      Optional<RecoveryPoint> recoveryPoint)
      implements Claim {
    public Acquired {
      recoveryPoint = recoveryPoint == null ? Optional.empty() : recoveryPoint;
    }

    /** A lease that starts from no recovery point. */
    public Acquired(
        String leaseToken,
        OffsetDateTime leaseExpiresAt,
        long attempt,
        boolean recovered,
        OffsetDateTime expiresAt,
        long sentAtNanos) {
      this(
          leaseToken, leaseExpiresAt, attempt, recovered, expiresAt, sentAtNanos, Optional.empty());
    }
  }

  /**
   * The key is finished: completed with a result, or failed for good; response is what was stored.
   */
  record Finished(
      boolean failed, long attempt, Optional<StoredResponse> response, OffsetDateTime expiresAt)
      implements Claim {}
}
