package io.idemd;

import java.time.Duration;

/**
 * What page of the abandoned-keys feed to read ({@link IdemClient#abandoned}): the keys that begin
 * with prefix ("" for every key; at most 255 bytes), whose lease ran out at least olderThan ago, at
 * most limit of them (1 to 1000; 0 leaves it to idemd, which reads 100), from cursor on (the next
 * cursor of the page before, read with the same prefix; "" for the first page). null stands for the
 * default of each.
 */
public record AbandonedQuery(String prefix, Duration olderThan, int limit, String cursor) {
  /** The first page of every abandoned key, as many as idemd puts in a page. */
  public static final AbandonedQuery DEFAULT = new AbandonedQuery("", Duration.ZERO, 0, "");

  public AbandonedQuery {
    prefix = prefix == null ? "" : prefix;
    olderThan = olderThan == null ? Duration.ZERO : olderThan;
    cursor = cursor == null ? "" : cursor;
    if (olderThan.isNegative()) {
      throw new IllegalArgumentException("idem: olderThan must not be negative");
    }
    if (limit < 0 || limit > 1000) {
      throw new IllegalArgumentException("idem: limit is " + limit + "; a page holds 1 to 1000");
    }
  }

  /** The first page of the keys that begin with prefix. */
  public static AbandonedQuery of(String prefix) {
    return DEFAULT.withPrefix(prefix);
  }

  public AbandonedQuery withPrefix(String prefix) {
    return new AbandonedQuery(prefix, olderThan, limit, cursor);
  }

  public AbandonedQuery withOlderThan(Duration olderThan) {
    return new AbandonedQuery(prefix, olderThan, limit, cursor);
  }

  public AbandonedQuery withLimit(int limit) {
    return new AbandonedQuery(prefix, olderThan, limit, cursor);
  }

  public AbandonedQuery withCursor(String cursor) {
    return new AbandonedQuery(prefix, olderThan, limit, cursor);
  }
}
