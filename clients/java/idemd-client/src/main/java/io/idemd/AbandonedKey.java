package io.idemd;

import java.time.OffsetDateTime;

/**
 * A key whose holder left it pending, as the abandoned-keys feed lists it: its lease ran out at
 * leaseExpiredAt (by idemd's clock) and nobody has claimed it since. attempt is the attempt of the
 * holder that left it (a claim now is the next); fingerprint the key's fingerprint, which a claim
 * must carry to acquire it ("" when it has none, and a claim must then carry none); owner the label
 * of that holder's claim ("" when none); recoveryPoint the name of the last recovery point recorded
 * ("" when none), whose whole point a claim of the key receives.
 */
public record AbandonedKey(
    String key,
    long attempt,
    String fingerprint,
    String owner,
    OffsetDateTime leaseExpiredAt,
    String recoveryPoint) {}
