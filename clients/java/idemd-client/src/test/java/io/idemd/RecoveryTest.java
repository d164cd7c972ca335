package io.idemd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.testing.Daemon;
import io.idemd.testing.Relay;
import io.idemd.testing.Wait;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Recovery points and the abandoned-keys feed against a real idemd: a holder's point reaches the
 * caller that takes the key over and the run after a release for a retry; a stale holder's
 * checkpoint loses its lease; an oversized one is refused and records nothing; the feed lists the
 * keys under a prefix whose holders left them, page by page.
 */
class RecoveryTest {
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

  private static String key(String what) {
    return "java-" + what + "-" + UUID.randomUUID();
  }

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void aTakeoverReadsThePointTheHolderCutOffRecorded() throws Exception {
    String key = key("takeover");
    try (Relay relay = Relay.to(daemon.url);
        IdemClient holder = IdemClient.builder(relay.url).retries(0).build()) {
      AtomicReference<Lease> held = new AtomicReference<>();
      CompletableFuture<RunResult<String>> first =
          CompletableFuture.supplyAsync(
              () ->
                  holder.run(
                      key,
                      String.class,
                      l -> {
                        assertTrue(l.recoveryPoint().isEmpty(), "a new key has no point");
                        l.checkpoint("charged", bytes("ch_1"));
                        // The link breaks after the point is recorded: the lease runs out.
                        relay.cut();
                        held.set(l);
                        Wait.until("the holder's lease runs out", l::isLost);
                        return "the holder's";
                      },
                      RunOptions.DEFAULT.withLease(Duration.ofSeconds(1))));
      Wait.until("the holder recorded its point", () -> held.get() != null || first.isDone());

      AtomicReference<Lease> taken = new AtomicReference<>();
      RunResult<String> other =
          client.run(
              key,
              String.class,
              l -> {
                taken.set(l);
                return "resumed from " + l.recoveryPoint().map(RecoveryPoint::name).orElse("none");
              },
              RunOptions.DEFAULT.withWaitFor(Duration.ofSeconds(20)));
      assertEquals("resumed from charged", other.value());
      Lease l = taken.get();
      assertTrue(l.recovered());
      assertEquals(2, l.attempt());
      RecoveryPoint p = l.recoveryPoint().orElseThrow();
      assertEquals("charged", p.name());
      assertArrayEquals(bytes("ch_1"), p.data());
      assertEquals(1, p.attempt());
      assertNotNull(p.recordedAt());

      ExecutionException failed =
          assertThrows(
              ExecutionException.class, () -> first.get(Wait.seconds(20), TimeUnit.SECONDS));
      assertInstanceOf(LeaseExpiredException.class, failed.getCause());
      // A lease already lost records nothing, without asking idemd.
      int refused = relay.refused();
      assertThrows(
          LeaseExpiredException.class, () -> held.get().checkpoint("too late", bytes("x")));
      assertEquals(refused, relay.refused(), "the lost lease's checkpoint went out");

      // Completing the key drops the point.
      KeyRecord record = client.lookup(key);
      assertEquals("completed", record.state());
      assertEquals(Optional.empty(), record.recoveryPoint());
    }
  }

  @Test
  void aStaleHoldersCheckpointIsLeaseLostAndLosesTheLease() throws Exception {
    String key = key("stale");
    Claim.Acquired acquired =
        (Claim.Acquired) client.claim(key, ClaimOptions.DEFAULT.withLease(Duration.ofSeconds(2)));
    CountDownLatch recorded = new CountDownLatch(1);
    CountDownLatch takenOver = new CountDownLatch(1);
    AtomicReference<Lease> held = new AtomicReference<>();
    AtomicReference<Throwable> second = new AtomicReference<>();
    // The holder reckons its lease as 30 s while idemd gave it 2 s, as a holder whose process
    // stalled would: only idemd's answer can tell it that the key is no longer its.
    CompletableFuture<Object> holder =
        CompletableFuture.supplyAsync(
            () -> {
              try {
                return client.underLease(
                    key,
                    acquired,
                    Duration.ofSeconds(30),
                    l -> {
                      held.set(l);
                      l.checkpoint("step-1", bytes("first"));
                      recorded.countDown();
                      assertTrue(takenOver.await(Wait.seconds(20), TimeUnit.SECONDS));
                      try {
                        l.checkpoint("step-2", bytes("second"));
                      } catch (RuntimeException e) {
                        second.set(e);
                      }
                      return "the stale holder's";
                    });
              } catch (Exception e) {
                throw new java.util.concurrent.CompletionException(e);
              }
            });
    assertTrue(
        recorded.await(Wait.seconds(20), TimeUnit.SECONDS), "the holder did not record its point");

    Claim taken =
        client.claim(
            key,
            ClaimOptions.DEFAULT
                .withLease(Duration.ofSeconds(30))
                .withWaitFor(Duration.ofSeconds(20)));
    takenOver.countDown();
    Claim.Acquired other = assertInstanceOf(Claim.Acquired.class, taken);
    assertTrue(other.recovered());
    assertEquals(2, other.attempt());
    RecoveryPoint p = other.recoveryPoint().orElseThrow();
    assertEquals("step-1", p.name());
    assertArrayEquals(bytes("first"), p.data());
    assertEquals(1, p.attempt());

    ExecutionException failed =
        assertThrows(
            ExecutionException.class, () -> holder.get(Wait.seconds(20), TimeUnit.SECONDS));
    LeaseLostException lost = assertInstanceOf(LeaseLostException.class, failed.getCause());
    assertFalse(lost instanceof LeaseExpiredException, "idemd answered: " + lost);
    LeaseLostException fromCheckpoint =
        assertInstanceOf(LeaseLostException.class, second.get(), "the stale checkpoint");
    assertEquals(409, fromCheckpoint.status());
    assertEquals("lease_lost", fromCheckpoint.code());
    assertTrue(held.get().isLost(), "the checkpoint answered lease_lost did not lose the lease");

    // The stale point was not recorded: the record still shows the holder's first one.
    KeyRecord record = client.lookup(key);
    assertEquals("pending", record.state());
    assertEquals(2, record.attempt());
    assertEquals("step-1", record.recoveryPoint().orElseThrow().name());

    // The low-level call says the same of the stale token.
    assertThrows(
        LeaseLostException.class,
        () -> client.recordRecoveryPoint(key, acquired.leaseToken(), "step-2", null));
    client.releaseForRetry(key, other.leaseToken());
  }

  @Test
  void theRunAfterARetryReleaseReadsThePoint() throws Exception {
    String key = key("retry");
    IllegalStateException failed =
        assertThrows(
            IllegalStateException.class,
            () ->
                client.once(
                    key,
                    l -> {
                      l.checkpoint("half", bytes("{\"done\":1}"));
                      throw new IllegalStateException("the provider timed out");
                    }));
    assertEquals("the provider timed out", failed.getMessage());
    assertEquals("released", client.lookup(key).state());
    assertEquals("half", client.lookup(key).recoveryPoint().orElseThrow().name());

    AtomicReference<Lease> next = new AtomicReference<>();
    assertTrue(client.once(key, next::set));
    Lease l = next.get();
    assertFalse(l.recovered(), "a release is no takeover");
    assertEquals(2, l.attempt());
    RecoveryPoint p = l.recoveryPoint().orElseThrow();
    assertEquals("half", p.name());
    assertArrayEquals(bytes("{\"done\":1}"), p.data());
    assertEquals(1, p.attempt());
    assertEquals(Optional.empty(), client.lookup(key).recoveryPoint());
  }

  @Test
  void anOversizedCheckpointIsRefusedAndChangesNothing() throws Exception {
    String key = key("oversized");
    AtomicReference<KeyRecord> before = new AtomicReference<>();
    AtomicReference<KeyRecord> after = new AtomicReference<>();
    AtomicReference<PayloadTooLargeException> refused = new AtomicReference<>();
    AtomicReference<Lease> held = new AtomicReference<>();
    RunResult<String> r =
        client.run(
            key,
            String.class,
            l -> {
              held.set(l);
              l.checkpoint("small", bytes("ok"));
              before.set(client.lookup(key));
              refused.set(
                  assertThrows(
                      PayloadTooLargeException.class, () -> l.checkpoint("big", new byte[4097])));
              after.set(client.lookup(key));
              assertFalse(l.isLost(), "a refused point cost the lease");
              return "stored";
            },
            RunOptions.DEFAULT.withLease(Duration.ofSeconds(30)));
    assertEquals("stored", r.value());
    assertEquals(413, refused.get().status());
    assertEquals("payload_too_large", refused.get().code());
    RecoveryPoint small = before.get().recoveryPoint().orElseThrow();
    assertEquals("small", small.name());
    assertEquals(before.get().recoveryPoint(), after.get().recoveryPoint());
    assertEquals(before.get().state(), after.get().state());
    assertEquals(before.get().attempt(), after.get().attempt());
    assertEquals("completed", client.lookup(key).state());
    // The work is over: its lease checkpoints no more.
    assertThrows(LeaseLostException.class, () -> held.get().checkpoint("after", null));
    assertFalse(held.get().isLost());
  }

  /**
   * Claims key under a short lease and never finishes it, as a holder that died; the lease is long
   * enough for the point to be recorded under it on a loaded machine.
   */
  private static void abandon(String key, String fingerprint, String owner, String point) {
    ClaimOptions o =
        ClaimOptions.DEFAULT
            .withLease(Duration.ofSeconds(1))
            .withFingerprint(fingerprint)
            .withOwner(owner);
    Claim.Acquired a = assertInstanceOf(Claim.Acquired.class, client.claim(key, o));
    if (point != null) {
      client.recordRecoveryPoint(key, a.leaseToken(), point, bytes("data of " + point));
    }
  }

  /** Every key of the feed under prefix, read page by page with limit, at most 50 pages. */
  private static List<AbandonedKey> readPages(String prefix, int limit) {
    List<AbandonedKey> out = new ArrayList<>();
    AbandonedQuery q = AbandonedQuery.of(prefix).withLimit(limit);
    for (int pages = 0; pages < 50; pages++) {
      AbandonedPage page = client.abandoned(q);
      assertTrue(page.keys().size() <= limit, "a page over its limit: " + page);
      out.addAll(page.keys());
      if (page.next().isEmpty()) {
        return out;
      }
      q = q.withCursor(page.next().get());
    }
    throw new AssertionError("the feed did not end within 50 pages");
  }

  @Test
  void theFeedListsTheAbandonedKeysOfAPrefixPageByPage() throws Exception {
    String prefix = key("feed") + "/";
    abandon(prefix + "a", "sha256:a", "worker-1", "charged");
    abandon(prefix + "b", null, "worker-2", null);
    abandon(prefix + "c", "sha256:c", null, "shipped");
    // Not abandoned: a live lease, a finished key, and a key under another prefix.
    client.claim(prefix + "live", ClaimOptions.DEFAULT.withLease(Duration.ofMinutes(1)));
    Claim.Acquired done =
        (Claim.Acquired)
            client.claim(prefix + "done", ClaimOptions.DEFAULT.withLease(Duration.ofSeconds(30)));
    client.complete(prefix + "done", done.leaseToken(), StoredResponse.of(200, "text/plain", ""));
    abandon(key("elsewhere"), null, null, null);

    Set<String> want = Set.of(prefix + "a", prefix + "b", prefix + "c");
    Wait.until(
        "the three short leases to run out",
        () ->
            readPages(prefix, 100).stream()
                .map(AbandonedKey::key)
                .collect(Collectors.toSet())
                .equals(want));

    List<AbandonedKey> paged = readPages(prefix, 1);
    assertEquals(3, paged.size(), "limit 1: " + paged);
    Map<String, AbandonedKey> byKey =
        paged.stream().collect(Collectors.toMap(AbandonedKey::key, k -> k));
    assertEquals(want, byKey.keySet());
    AbandonedKey a = byKey.get(prefix + "a");
    assertEquals(1, a.attempt());
    assertEquals("sha256:a", a.fingerprint());
    assertEquals("worker-1", a.owner());
    assertEquals("charged", a.recoveryPoint());
    assertNotNull(a.leaseExpiredAt());
    AbandonedKey b = byKey.get(prefix + "b");
    assertEquals("", b.fingerprint());
    assertEquals("worker-2", b.owner());
    assertEquals("", b.recoveryPoint());
    AbandonedKey c = byKey.get(prefix + "c");
    assertEquals("sha256:c", c.fingerprint());
    assertEquals("shipped", c.recoveryPoint());

    // The stream reads every page too, and olderThan leaves out leases that ran out lately.
    assertEquals(
        want,
        client
            .abandonedKeys(AbandonedQuery.of(prefix).withLimit(1))
            .map(AbandonedKey::key)
            .collect(Collectors.toSet()));
    assertEquals(
        0,
        client.abandonedKeys(AbandonedQuery.of(prefix).withOlderThan(Duration.ofHours(1))).count());
    assertThrows(IllegalArgumentException.class, () -> AbandonedQuery.of(prefix).withLimit(1001));
  }
}
