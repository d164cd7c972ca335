package io.idemd.testing;

import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/**
 * Waiting on a condition with a deadline, never a bare sleep. Every deadline a test gives a
 * condition is multiplied by IDEMD_TEST_SLOWDOWN, 3 unless set, so that the numbers in the tests
 * are what an ordinary machine needs and a slow or loaded one still gets its condition in time. A
 * condition that holds ends its wait at once, so a larger factor only makes a failing test slower
 * to fail. Lease lengths and timeouts that a test is about are not scaled.
 */
public final class Wait {
  private Wait() {}

  /** The factor of IDEMD_TEST_SLOWDOWN. */
  public static final double SLOWDOWN = slowdown(System.getenv("IDEMD_TEST_SLOWDOWN"));

  private static double slowdown(String value) {
    if (value == null || value.isEmpty()) {
      return 3;
    }
    double factor;
    try {
      factor = Double.parseDouble(value);
    } catch (NumberFormatException e) {
      factor = 0;
    }
    if (!(factor > 0)) {
      throw new IllegalStateException(
          "IDEMD_TEST_SLOWDOWN=\"" + value + "\": want a positive number");
    }
    return factor;
  }

  /** The deadline, in whole seconds, for a condition an ordinary machine meets within seconds. */
  public static long seconds(long seconds) {
    return (long) Math.ceil(seconds * SLOWDOWN);
  }

  /** Returns once condition holds; fails the test if it does not within seconds(20). */
  public static void until(String what, BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds(20));
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("not within " + seconds(20) + " s: " + what);
      }
      Thread.sleep(5);
    }
  }
}
