package io.idemd.testing;

import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/** Waiting on a condition with a deadline, never a bare sleep. */
public final class Wait {
  private Wait() {}

  /** Returns once condition holds; fails the test if it does not within 20 s. */
  public static void until(String what, BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("not within 20 s: " + what);
      }
      Thread.sleep(5);
    }
  }
}
