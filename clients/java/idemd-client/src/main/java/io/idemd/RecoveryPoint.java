package io.idemd;

import java.time.OffsetDateTime;
import java.util.Arrays;
import java.util.Objects;

/**
 * How far a holder of a key got, as it recorded it with {@link Lease#checkpoint} (or {@link
 * IdemClient#recordRecoveryPoint}): the next acquisition of the key receives it in {@link
 * Lease#recoveryPoint()}, so that the work resumes from there instead of starting over. name is the
 * point reached (such as "charged"), data what the holder recorded with it (empty when nothing),
 * attempt the attempt of the holder that recorded it, and recordedAt when idemd recorded it, by
 * idemd's clock.
 */
public record RecoveryPoint(String name, byte[] data, long attempt, OffsetDateTime recordedAt) {
  public RecoveryPoint {
    Objects.requireNonNull(name, "name");
    data = data == null ? new byte[0] : data.clone();
  }

  /** A copy of the data, so that the point stays as it was recorded. */
  @Override
  public byte[] data() {
    return data.clone();
  }

  // A record compares arrays by identity; two points with the same bytes are the same point.
  @Override
  public boolean equals(Object o) {
    return o instanceof RecoveryPoint p
        && name.equals(p.name)
        && Arrays.equals(data, p.data)
        && attempt == p.attempt
        && Objects.equals(recordedAt, p.recordedAt);
  }

  @Override
  public int hashCode() {
    return Objects.hash(name, Arrays.hashCode(data), attempt, recordedAt);
  }

  @Override
  public String toString() {
    return "RecoveryPoint[name="
        + name
        + ", data="
        + data.length
        + " bytes, attempt="
        + attempt
        + ", recordedAt="
        + recordedAt
        + "]";
  }
}
