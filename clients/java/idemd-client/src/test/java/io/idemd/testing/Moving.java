package io.idemd.testing;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;

/**
 * An idemd over a Redis of its own, with the strings layout, whose records a test marks as being
 * moved to another store (docs/moving.md, "Moving to another store while serving"): idemd then
 * answers 503 store_moved for them.
 */
public final class Moving implements AutoCloseable {
  /**
   * Turns the record of KEYS[1] (the strings layout) into the marker a live move leaves while it
   * hands the record over: the record's fields kept, its state m.
   */
  private static final String MARK_MOVED =
      """
      local v = redis.call('GET', KEYS[1])
      if not v then return 0 end
      local l, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa = cmsgpack.unpack(v)
      redis.call('SET', KEYS[1], cmsgpack.pack(l, k, t, 'm', fp, ow, at, tok, lx, rec, ca, ua, xa), 'KEEPTTL')
      return 1""";

  private final Redis redis;
  public final Daemon daemon;

  private Moving(Redis redis, Daemon daemon) {
    this.redis = redis;
    this.daemon = daemon;
  }

  /** Starts the Redis (or skips the test without one) and the daemon over it. */
  public static Moving start() throws IOException, InterruptedException {
    Redis redis = Redis.start();
    try {
      return new Moving(
          redis, Daemon.start("--store", redis.url(), "--redis-record-layout", "strings"));
    } catch (IOException | InterruptedException | RuntimeException e) {
      redis.close();
      throw e;
    }
  }

  /** Marks the record of key (tenant default) as being moved; fails when there is none. */
  public void mark(String key) throws IOException {
    String stored;
    try {
      stored =
          "idem:default:"
              + HexFormat.of()
                  .formatHex(
                      MessageDigest.getInstance("SHA-256")
                          .digest(key.getBytes(StandardCharsets.UTF_8)));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
    String answer = redis.command("EVAL", MARK_MOVED, "1", stored);
    if (!answer.equals(":1")) {
      throw new AssertionError("no record of \"" + key + "\" to mark: " + answer);
    }
  }

  @Override
  public void close() {
    daemon.close();
    redis.close();
  }
}
