package io.idemd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.testing.Daemon;
import io.idemd.testing.Relay;
import io.idemd.testing.Wait;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The lease's local deadline against a real idemd: a holder whose link to idemd is cut (by a relay
 * in between) gives its lease up before idemd hands the key to another caller, a short cut does not
 * cost the lease, and a slow link costs no healthy holder its lease.
 */
class LeaseDeadlineTest {
  private static Daemon daemon;
  private static IdemClient client;

  @BeforeAll
  static void start() throws Exception {
    daemon = Daemon.start();
    client = IdemClient.builder(daemon.url).build();
  }

  @AfterAll
  static void stop() {
    client.close();
    daemon.close();
  }

  private static String key() {
    return "java-deadline-" + UUID.randomUUID();
  }

  @Test
  void aHolderCutOffFromIdemdExpiresAndTheTakeoverStands() throws Exception {
    Duration lease = Duration.ofSeconds(1);
    String key = key();
    try (Relay relay = Relay.to(daemon.url);
        IdemClient holder = IdemClient.builder(relay.url).retries(0).build()) {
      AtomicReference<Lease> held = new AtomicReference<>();
      long sentBefore = System.nanoTime();
      CompletableFuture<RunResult<String>> first =
          CompletableFuture.supplyAsync(
              () ->
                  holder.run(
                      key,
                      String.class,
                      l -> {
                        // The link breaks right after the claim: no renewal can be answered.
                        relay.cut();
                        held.set(l);
                        Wait.until("the holder's lease runs out", l::isLost);
                        return "the holder's, after its lease ended";
                      },
                      RunOptions.DEFAULT.withLease(lease)));
      Wait.until("the holder runs", () -> held.get() != null || first.isDone());

      AtomicReference<Lease> taken = new AtomicReference<>();
      RunResult<String> other =
          client.run(
              key,
              String.class,
              l -> {
                taken.set(l);
                // idemd expires the holder's lease a whole lease after it received the claim;
                // the holder's own deadline came at 95 % of it, counted from the send.
                assertTrue(held.get().isLost(), "the holder still believed it held the key");
                return "the other caller's";
              },
              RunOptions.DEFAULT
                  .withLease(Duration.ofSeconds(10))
                  .withWaitFor(Duration.ofSeconds(20)));
      assertFalse(other.replayed());
      assertEquals(2, taken.get().attempt());
      assertTrue(taken.get().recovered());

      ExecutionException failed =
          assertThrows(
              ExecutionException.class, () -> first.get(Wait.seconds(20), TimeUnit.SECONDS));
      LeaseExpiredException expired =
          assertInstanceOf(LeaseExpiredException.class, failed.getCause());
      assertEquals("lease_lost", expired.code());
      assertEquals(0, expired.status(), "no answer reached the holder");
      Lease l = held.get();
      assertTrue(l.isLost());
      assertEquals(Duration.ZERO, l.remaining());
      assertThrows(LeaseExpiredException.class, l::checkLive);
      assertTrue(
          l.deadlineNanos() - (sentBefore + lease.toNanos()) <= 0,
          "the deadline is later than the claim's send time plus the lease");
      assertTrue(relay.refused() > 0, "the holder tried to renew");

      // The other caller's result stands.
      KeyRecord record = client.lookup(key);
      assertEquals("completed", record.state());
      assertEquals(2, record.attempt());
      RunResult<String> replay =
          client.run(
              key,
              String.class,
              x -> {
                throw new AssertionError("ran again after the takeover was stored");
              });
      assertTrue(replay.replayed());
      assertEquals("the other caller's", replay.value());
    }
  }

  @Test
  void aLinkRestoredBeforeTheDeadlineKeepsTheLease() throws Exception {
    Duration lease = Duration.ofSeconds(Wait.seconds(3));
    String key = key();
    try (Relay relay = Relay.to(daemon.url);
        IdemClient holder = IdemClient.builder(relay.url).retries(0).build()) {
      AtomicReference<Lease> held = new AtomicReference<>();
      RunResult<String> r =
          holder.run(
              key,
              String.class,
              l -> {
                held.set(l);
                long claimDeadline = l.deadlineNanos();
                relay.cut();
                Wait.until("two renewals fail", () -> relay.refused() >= 2 || l.isLost());
                relay.restore();
                Wait.until(
                    "a renewal is answered",
                    () -> l.deadlineNanos() != claimDeadline || l.isLost());
                l.checkLive();
                // Without the renewals answered after the cut, the lease would end here.
                Wait.until(
                    "the claim's own deadline passes", () -> System.nanoTime() - claimDeadline > 0);
                l.checkLive();
                assertTrue(l.remaining().compareTo(Duration.ZERO) > 0);
                return "kept";
              },
              RunOptions.DEFAULT.withLease(lease));
      assertEquals("kept", r.value());
      assertFalse(r.replayed());
      assertFalse(held.get().isLost(), "the lease is as the work left it");
      assertTrue(relay.refused() >= 2, "renewals failed while the link was cut");
      KeyRecord record = client.lookup(key);
      assertEquals("completed", record.state());
      assertEquals(1, record.attempt());
      assertEquals("\"kept\"", record.response().orElseThrow().bodyText());
    }
  }

  @Test
  void aClaimThatWaitedIsRenewedBeforeTheWorkStarts() throws Exception {
    Duration lease = Duration.ofMillis(1500);
    String key = key();
    Claim.Acquired first =
        (Claim.Acquired) client.claim(key, ClaimOptions.DEFAULT.withLease(Duration.ofSeconds(20)));
    AtomicReference<Lease> held = new AtomicReference<>();
    long sentBefore = System.nanoTime();
    CompletableFuture<RunResult<String>> waiting =
        CompletableFuture.supplyAsync(
            () ->
                client.run(
                    key,
                    String.class,
                    l -> {
                      held.set(l);
                      return "after the wait";
                    },
                    RunOptions.DEFAULT.withLease(lease).withWaitFor(Duration.ofSeconds(20))));
    // The claim waits for more than a third of its lease before the first holder lets go.
    Wait.until(
        "the claim has waited half its lease",
        () -> System.nanoTime() - sentBefore > lease.toNanos() / 2);
    assertFalse(waiting.isDone());
    long releasedAt = System.nanoTime();
    client.releaseForRetry(key, first.leaseToken());
    assertEquals("after the wait", waiting.get(Wait.seconds(20), TimeUnit.SECONDS).value());
    // Reckoned from the claim, sent before the release, the lease would have had less than
    // half of itself left; the renewal sent once the claim was answered starts it anew.
    assertTrue(
        held.get().deadlineNanos() - (releasedAt + Lease.reckoned(lease.toNanos())) > 0,
        "the deadline is still the claim's");
    assertEquals(2, held.get().attempt());
  }

  /**
   * Runs a few holders at once through c until each has had a renewal answered (or lost its lease:
   * the warming is what counts here).
   */
  private static void warm(IdemClient c) throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(4);
    try {
      List<Future<RunResult<String>>> runs = new ArrayList<>();
      for (int i = 0; i < 4; i++) {
        runs.add(
            pool.submit(
                () ->
                    c.run(
                        key(),
                        String.class,
                        l -> {
                          long first = l.deadlineNanos();
                          Wait.until(
                              "a renewal is answered",
                              () -> l.deadlineNanos() != first || l.isLost());
                          return "warm";
                        },
                        RunOptions.DEFAULT.withLease(Duration.ofSeconds(1)))));
      }
      for (Future<RunResult<String>> r : runs) {
        try {
          r.get(Wait.seconds(60), TimeUnit.SECONDS);
        } catch (ExecutionException e) {
          if (!(e.getCause() instanceof LeaseLostException)) {
            throw e;
          }
        }
      }
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void healthyHoldersBehindASlowLinkKeepTheirLeases() throws Exception {
    int holders = 20;
    List<Duration> leases =
        List.of(
            Duration.ofSeconds(Wait.seconds(1)),
            Duration.ofSeconds(Wait.seconds(2)),
            Duration.ofSeconds(Wait.seconds(3)));
    ExecutorService pool = Executors.newFixedThreadPool(holders * leases.size());
    try (Relay relay = Relay.to(daemon.url);
        IdemClient slow = IdemClient.builder(relay.url).build()) {
      // idemd slowed but answering: every request held on the way.
      relay.latency(Duration.ofMillis(30));
      // A service's client is warm: its first calls of each kind (a connection made, classes
      // loaded, code compiled) can take longer than a short lease has, and a lease that is
      // not renewed in time ends at idemd too.
      warm(slow);
      List<Duration> leaseOf = new ArrayList<>();
      List<String> keys = new ArrayList<>();
      List<Future<RunResult<String>>> runs = new ArrayList<>();
      for (Duration lease : leases) {
        for (int i = 0; i < holders; i++) {
          // Holders come one after another, as requests do, rather than all in one instant.
          long start = System.nanoTime() + lease.toNanos() * i / holders;
          String key = key();
          leaseOf.add(lease);
          keys.add(key);
          runs.add(
              pool.submit(
                  () -> {
                    Wait.until("the holder's turn", () -> System.nanoTime() - start >= 0);
                    return slow.run(
                        key,
                        String.class,
                        l -> {
                          // Work that lasts two and a half leases, checking the lease as work
                          // with effects would.
                          long end = System.nanoTime() + lease.toNanos() * 5 / 2;
                          for (long left; (left = end - System.nanoTime()) > 0; ) {
                            l.checkLive();
                            TimeUnit.NANOSECONDS.sleep(Math.min(left, 50_000_000));
                          }
                          l.checkLive();
                          return key;
                        },
                        RunOptions.DEFAULT.withLease(lease));
                  }));
        }
      }
      for (int i = 0; i < runs.size(); i++) {
        RunResult<String> r;
        try {
          r = runs.get(i).get(Wait.seconds(60), TimeUnit.SECONDS);
        } catch (ExecutionException e) {
          throw new AssertionError(
              "a holder of a " + leaseOf.get(i) + " lease failed", e.getCause());
        }
        assertEquals(keys.get(i), r.value());
        assertFalse(r.replayed());
      }
      for (String key : keys) {
        KeyRecord record = client.lookup(key);
        assertEquals("completed", record.state(), key);
        assertEquals(1, record.attempt(), key);
      }
    } finally {
      pool.shutdownNow();
    }
  }
}
