package io.idemd;

import java.time.OffsetDateTime;
import java.util.Optional;

/**
 * The record of a key, as lookup shows it. state is pending, released, completed or failed, an open
 * set: accept others.
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
    Optional<StoredResponse> response) {}
