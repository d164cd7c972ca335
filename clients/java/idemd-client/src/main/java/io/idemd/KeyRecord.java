package io.idemd;

import java.time.OffsetDateTime;
import java.util.Optional;

/**
 * The record of a key, as lookup shows it. state is pending, released, completed or failed, an open
 * set: accept others. recoveryPoint is the last point a holder recorded while the key is not
 * finished; completing or failing the key drops it.
 */
public record KeyRecord(
    String key,
    String state,
    long attempt,
    String fingerprint,
    String owner,
    OffsetDateTime createdAt,
    OffsetDateTime updatedAt,
    Optional<OffsetDateTime> leaseExpiresAt,
    OffsetDateTime expiresAt,
    Optional<StoredResponse> response,
    Optional<RecoveryPoint> recoveryPoint) {
  public KeyRecord {
    recoveryPoint = recoveryPoint == null ? Optional.empty() : recoveryPoint;
  }

  /** A record without a recovery point. */
  public KeyRecord(
      String key,
      String state,
      long attempt,
      String fingerprint,
      String owner,
      OffsetDateTime createdAt,
      OffsetDateTime updatedAt,
      Optional<OffsetDateTime> leaseExpiresAt,
      OffsetDateTime expiresAt,
      Optional<StoredResponse> response) {
    this(
        key,
        state,
        attempt,
        fingerprint,
        owner,
        createdAt,
        updatedAt,
        leaseExpiresAt,
        expiresAt,
        response,
        Optional.empty());
  }
}
