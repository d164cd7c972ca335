package io.idemd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The lease's local deadline and the renewals' pace, by arithmetic alone. */
class LeaseTest {
  private static final long MS = TimeUnit.MILLISECONDS.toNanos(1);

  @Test
  void theDeadlineIsTheSendTimePlus95PercentOfTheLease() {
    long sent = System.nanoTime();
    Lease lease = new Lease("k", 1, false, Duration.ofSeconds(1), sent);
    assertEquals(sent + 950 * MS, lease.deadlineNanos());
    assertFalse(lease.isLost());
    Duration left = lease.remaining();
    assertTrue(left.compareTo(Duration.ZERO) > 0, "time left: " + left);
    assertTrue(left.compareTo(Duration.ofMillis(950)) <= 0, "time left: " + left);
    lease.checkLive();
  }

  @Test
  void aLeaseWhoseDeadlinePassedIsLostByExpiry() {
    Lease lease = new Lease("k", 1, false, Duration.ofSeconds(1), System.nanoTime() - 2000 * MS);
    assertTrue(lease.isLost());
    assertEquals(Duration.ZERO, lease.remaining());
    LeaseExpiredException e = assertThrows(LeaseExpiredException.class, lease::checkLive);
    assertInstanceOf(LeaseLostException.class, e);
    assertEquals("lease_lost", e.code());
    assertEquals(0, e.status(), "no answer came");
    assertSame(e, assertThrows(LeaseExpiredException.class, lease::checkLive));
  }

  @Test
  void anAnsweredRenewalMovesTheDeadlineToItsOwnSendTime() {
    long now = System.nanoTime();
    Lease lease = new Lease("k", 1, false, Duration.ofSeconds(1), now - 500 * MS);
    assertEquals(now + 450 * MS, lease.deadlineNanos());
    assertTrue(lease.renewed(now));
    assertEquals(now + 950 * MS, lease.deadlineNanos());
    // An answer to an earlier renewal, coming late, does not move it back.
    assertTrue(lease.renewed(now - 100 * MS));
    assertEquals(now + 950 * MS, lease.deadlineNanos());
  }

  @Test
  void aRenewalAnsweredAfterTheDeadlineDoesNotSaveTheLease() {
    long now = System.nanoTime();
    Lease lease = new Lease("k", 1, false, Duration.ofSeconds(1), now - 2000 * MS);
    long deadline = lease.deadlineNanos();
    assertFalse(lease.renewed(now));
    assertEquals(deadline, lease.deadlineNanos());
    assertTrue(lease.isLost());
    assertThrows(LeaseExpiredException.class, lease::checkLive);
  }

  @Test
  void anAnsweredLossIsNotAnExpiry() {
    Lease lease = new Lease("k", 1, false, Duration.ofSeconds(30), System.nanoTime());
    LeaseLostException answered =
        new LeaseLostException(
            new IdemProblemException.Problem(409, "lease_lost", "Lease lost", "", "gone", null),
            null);
    lease.lose(answered);
    assertTrue(lease.isLost());
    assertEquals(Duration.ZERO, lease.remaining());
    assertSame(answered, assertThrows(LeaseLostException.class, lease::checkLive));
    assertFalse(lease.renewed(System.nanoTime()), "a lost lease is not renewed");
  }

  @Test
  void aFailedRenewalIsRetriedSoonerAsTheDeadlineNears() {
    long lease = 30_000 * MS;
    // Far from the deadline: a sixth of the lease at most.
    assertBetween(2_500 * MS, 5_000 * MS, lease, 28_500 * MS);
    // Near it: a third of the time left.
    assertBetween(50 * MS, 100 * MS, lease, 300 * MS);
    // At the very end, and for a short lease: never below 10 ms.
    assertBetween(5 * MS, 10 * MS, lease, 15 * MS);
    assertBetween(5 * MS, 10 * MS, 30 * MS, 1_000 * MS);
    assertEquals(2_500 * MS, IdemClient.retryDelayNanos(lease, 28_500 * MS, 0));
  }

  private static void assertBetween(long low, long high, long lease, long left) {
    Random random = new Random(7);
    for (int i = 0; i < 1000; i++) {
      double u = i == 0 ? 0 : i == 1 ? Math.nextDown(1.0) : random.nextDouble();
      long delay = IdemClient.retryDelayNanos(lease, left, u);
      assertTrue(
          delay >= low && delay <= high,
          "a delay of " + delay + " ns is outside [" + low + ", " + high + "] for " + left);
    }
  }
}
