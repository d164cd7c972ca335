package io.idemd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.testing.Daemon;
import io.idemd.testing.Relay;
import io.idemd.testing.Wait;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The Completer against a real idemd: keys whose holders died are finished once each by two
 * completers at once; keys another caller holds or finished meanwhile are skipped; a handler's
 * failure leaves its key pending and a PermanentException stores a failure; run takes keys pass
 * after pass, waits out an unreachable idemd, and stops cleanly.
 */
class CompleterTest {
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

  private static String prefix(String what) {
    return "java-completer-" + what + "-" + UUID.randomUUID() + "/";
  }

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  /**
   * Claims key with fingerprint and never finishes it, as a holder that died; with a point name it
   * records that point first. The lease is long enough for the point to be recorded under it on a
   * loaded machine.
   */
  private static void abandon(String key, String fingerprint, String point) {
    Claim claim =
        client.claim(
            key,
            ClaimOptions.DEFAULT.withFingerprint(fingerprint).withLease(Duration.ofSeconds(1)));
    Claim.Acquired a = assertInstanceOf(Claim.Acquired.class, claim);
    if (point != null) {
      client.recordRecoveryPoint(key, a.leaseToken(), point, bytes("data of " + point));
    }
  }

  /**
   * Waits until the feed under prefix lists every one of keys, and returns what it says of them.
   */
  private static Map<String, AbandonedKey> waitAbandoned(String prefix, String... keys)
      throws InterruptedException {
    Set<String> want = Set.of(keys);
    AtomicReference<Map<String, AbandonedKey>> listed = new AtomicReference<>();
    Wait.until(
        "the feed to list " + want,
        () -> {
          Map<String, AbandonedKey> m =
              client
                  .abandonedKeys(AbandonedQuery.of(prefix))
                  .filter(k -> want.contains(k.key()))
                  .collect(Collectors.toMap(AbandonedKey::key, k -> k, (a, b) -> b));
          listed.set(m);
          return m.keySet().equals(want);
        });
    return listed.get();
  }

  /** Counts a handler's runs per key. */
  private static final class Runs {
    final Map<String, AtomicInteger> runs = new ConcurrentHashMap<>();

    void add(String key) {
      runs.computeIfAbsent(key, k -> new AtomicInteger()).incrementAndGet();
    }

    int of(String key) {
      AtomicInteger n = runs.get(key);
      return n == null ? 0 : n.get();
    }

    int total() {
      return runs.values().stream().mapToInt(AtomicInteger::get).sum();
    }
  }

  @Test
  void twoCompletersFinishEachKeyOnce() throws Exception {
    String prefix = prefix("once");
    int n = 12;
    List<String> keys = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      String key = String.format("%sorder-%02d", prefix, i);
      keys.add(key);
      abandon(key, i % 2 == 0 ? "sha256:" + key : null, i % 3 == 0 ? "step-" + i : null);
    }
    String live = prefix + "live";
    assertInstanceOf(
        Claim.Acquired.class,
        client.claim(live, ClaimOptions.DEFAULT.withLease(Duration.ofMinutes(1))));
    waitAbandoned(prefix, keys.toArray(new String[0]));

    Runs runs = new Runs();
    Work<StoredResponse> handler =
        l -> {
          runs.add(l.key());
          if (Lease.current().orElse(null) != l) {
            throw new IllegalStateException(l.key() + ": the lease is not the current one");
          }
          int i = Integer.parseInt(l.key().substring((prefix + "order-").length()));
          if (!l.recovered() || l.attempt() != 2) {
            throw new IllegalStateException(l + ": want recovered attempt 2");
          }
          Optional<RecoveryPoint> p = l.recoveryPoint();
          if (i % 3 == 0) {
            RecoveryPoint want = p.orElseThrow();
            if (!want.name().equals("step-" + i)
                || !Arrays.equals(want.data(), bytes("data of step-" + i))
                || want.attempt() != 1) {
              throw new IllegalStateException(l.key() + ": point " + want);
            }
          } else if (p.isPresent()) {
            throw new IllegalStateException(l.key() + ": point " + p + ", want none");
          }
          return StoredResponse.of(200, "text/plain", "finished " + l.key());
        };
    Map<String, Throwable> errors = new ConcurrentHashMap<>();
    ExecutorService threads = Executors.newFixedThreadPool(2);
    try (IdemClient c1 = IdemClient.builder(daemon.url).build();
        IdemClient c2 = IdemClient.builder(daemon.url).build();
        Completer first = completer(c1, prefix, handler, errors);
        Completer second = completer(c2, prefix, handler, errors)) {
      Future<CompleterStats> a = threads.submit(first::runOnce);
      Future<CompleterStats> b = threads.submit(second::runOnce);
      List<CompleterStats> stats =
          List.of(
              a.get(Wait.seconds(60), TimeUnit.SECONDS), b.get(Wait.seconds(60), TimeUnit.SECONDS));
      assertEquals(Map.of(), errors);

      int finished = 0;
      for (CompleterStats s : stats) {
        assertEquals(
            s.listed(), s.finished() + s.failed() + s.skipped() + s.errors(), s.toString());
        assertEquals(0, s.failed(), s.toString());
        assertEquals(0, s.errors(), s.toString());
        finished += s.finished();
      }
      assertEquals(n, finished, stats.toString());
      for (String key : keys) {
        assertEquals(1, runs.of(key), key + ": the handler's runs");
        KeyRecord r = client.lookup(key);
        assertEquals("completed", r.state(), key);
        assertEquals(2, r.attempt(), key);
        assertEquals("finished " + key, r.response().orElseThrow().bodyText());
        assertEquals(Optional.empty(), r.recoveryPoint(), key);
      }
      assertEquals(0, runs.of(live), "the live key's handler ran");
      KeyRecord r = client.lookup(live);
      assertEquals("pending", r.state());
      assertEquals(1, r.attempt());

      assertEquals(CompleterStats.NONE, first.runOnce(), "a pass once all was finished");
    } finally {
      threads.shutdownNow();
    }
  }

  private static Completer completer(
      IdemClient c, String prefix, Work<?> handler, Map<String, Throwable> errors) {
    return Completer.builder(c)
        .prefix(prefix)
        .concurrency(3)
        .handler(handler)
        .onError(errors::put)
        .build();
  }

  @Test
  void keysHeldOrFinishedMeanwhileAreSkippedAndAFailureLeavesTheKeyPending() throws Exception {
    String prefix = prefix("mixed");
    List<String> keys = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      keys.add(prefix + "k" + i);
      abandon(prefix + "k" + i, null, null);
    }
    waitAbandoned(prefix, keys.toArray(new String[0]));

    // The roles are dealt when the first handler runs, so that whatever order the feed lists
    // the keys in, the others are taken or finished by another caller after the feed was read
    // and before the completer claims them.
    Map<String, String> roles = new ConcurrentHashMap<>();
    Runs runs = new Runs();
    Map<String, Throwable> reported = new ConcurrentHashMap<>();
    try (IdemClient other = IdemClient.builder(daemon.url).build();
        IdemClient mine = IdemClient.builder(daemon.url).build()) {
      Completer completer =
          Completer.builder(mine)
              .prefix(prefix)
              .concurrency(1)
              .lease(Duration.ofSeconds(1))
              .onError(reported::put)
              .handler(
                  l -> {
                    runs.add(l.key());
                    synchronized (roles) {
                      if (roles.isEmpty()) {
                        roles.put(l.key(), "fine");
                        List<String> rest =
                            keys.stream().filter(k -> !k.equals(l.key())).sorted().toList();
                        List<String> dealt = List.of("taken", "finished", "failing", "permanent");
                        for (int i = 0; i < rest.size(); i++) {
                          roles.put(rest.get(i), dealt.get(i));
                        }
                        other.claim(
                            key(roles, "taken"),
                            ClaimOptions.DEFAULT.withLease(Duration.ofMinutes(1)));
                        Claim.Acquired a =
                            (Claim.Acquired)
                                other.claim(
                                    key(roles, "finished"),
                                    ClaimOptions.DEFAULT.withLease(Duration.ofSeconds(30)));
                        other.complete(
                            key(roles, "finished"),
                            a.leaseToken(),
                            StoredResponse.of(200, "text/plain", "by the other caller"));
                      }
                    }
                    switch (roles.get(l.key())) {
                      case "failing" ->
                          throw new IllegalStateException("the refund provider is down");
                      case "permanent" ->
                          throw new PermanentException(
                              "the card is closed",
                              StoredResponse.of(402, "text/plain", "declined"),
                              null);
                      default -> {
                        return StoredResponse.of(201, "text/plain", "refunded");
                      }
                    }
                  })
              .build();
      CompleterStats stats = completer.runOnce();
      assertEquals(new CompleterStats(5, 1, 1, 2, 1), stats);
      assertEquals(0, runs.of(key(roles, "taken")));
      assertEquals(0, runs.of(key(roles, "finished")));
      assertEquals(1, runs.of(key(roles, "failing")));
      assertEquals(1, runs.of(key(roles, "permanent")));
      assertEquals(1, runs.of(key(roles, "fine")));
      assertEquals(Set.of(key(roles, "failing")), reported.keySet());
      assertEquals("the refund provider is down", reported.get(key(roles, "failing")).getMessage());

      KeyRecord taken = client.lookup(key(roles, "taken"));
      assertEquals("pending", taken.state());
      assertEquals(2, taken.attempt());
      KeyRecord finished = client.lookup(key(roles, "finished"));
      assertEquals("completed", finished.state());
      assertEquals("by the other caller", finished.response().orElseThrow().bodyText());
      KeyRecord permanent = client.lookup(key(roles, "permanent"));
      assertEquals("failed", permanent.state());
      assertEquals(402, permanent.response().orElseThrow().status());
      assertEquals("declined", permanent.response().orElseThrow().bodyText());
      KeyRecord fine = client.lookup(key(roles, "fine"));
      assertEquals("completed", fine.state());
      assertEquals(201, fine.response().orElseThrow().status());
      assertEquals("refunded", fine.response().orElseThrow().bodyText());
      // Left pending, not released: the feed lists it again once the completer's lease runs out.
      KeyRecord failing = client.lookup(key(roles, "failing"));
      assertEquals("pending", failing.state());
      assertEquals(2, failing.attempt());
      AbandonedKey again = waitAbandoned(prefix, key(roles, "failing")).get(key(roles, "failing"));
      assertEquals(2, again.attempt());
    }
  }

  private static String key(Map<String, String> roles, String role) {
    return roles.entrySet().stream()
        .filter(e -> e.getValue().equals(role))
        .map(Map.Entry::getKey)
        .findFirst()
        .orElseThrow(() -> new AssertionError("no key had the role " + role + ": " + roles));
  }

  @Test
  void aValueIsStoredAsRunStoresIt() throws Exception {
    String prefix = prefix("values");
    String refunded = prefix + "refunded";
    String declined = prefix + "declined";
    abandon(refunded, null, null);
    abandon(declined, null, null);
    waitAbandoned(prefix, refunded, declined);
    try (Completer completer =
        Completer.builder(client)
            .prefix(prefix)
            .handler(
                l -> {
                  if (l.key().equals(declined)) {
                    throw new PermanentException("the card is closed", Map.of("code", 7), null);
                  }
                  return Map.of("refund", "r_1");
                })
            .build()) {
      assertEquals(new CompleterStats(2, 1, 1, 0, 0), completer.runOnce());
    }
    RunResult<Map<?, ?>> replay =
        client.run(
            refunded,
            castMap(),
            l -> {
              throw new AssertionError("ran again");
            });
    assertTrue(replay.replayed());
    assertEquals(Map.of("refund", "r_1"), replay.value());
    FailedException failed =
        assertThrows(
            FailedException.class,
            () ->
                client.run(
                    declined,
                    String.class,
                    l -> {
                      throw new AssertionError("ran again");
                    }));
    assertEquals("the card is closed", failed.getMessage());
    assertEquals(7, failed.value().path("code").asInt());
  }

  @SuppressWarnings("unchecked")
  private static Class<Map<?, ?>> castMap() {
    return (Class<Map<?, ?>>) (Class<?>) Map.class;
  }

  @Test
  void runTakesKeysPassAfterPassAndStopsOnceItsHandlersReturned() throws Exception {
    String prefix = prefix("run");
    String slow = prefix + "slow";
    String quick = prefix + "quick";
    String late = prefix + "late";
    Runs runs = new Runs();
    AtomicInteger inFlight = new AtomicInteger();
    CountDownLatch slowStarted = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    Completer completer =
        Completer.builder(client)
            .prefix(prefix)
            .concurrency(2)
            .pollInterval(Duration.ofMillis(20))
            .handler(
                l -> {
                  inFlight.incrementAndGet();
                  try {
                    runs.add(l.key());
                    if (l.key().equals(slow)) {
                      slowStarted.countDown();
                      if (!release.await(Wait.seconds(60), TimeUnit.SECONDS)) {
                        throw new IllegalStateException("never released");
                      }
                    }
                    return StoredResponse.of(200, "text/plain", l.key());
                  } finally {
                    inFlight.decrementAndGet();
                  }
                })
            .build();
    AtomicReference<Throwable> runFailed = new AtomicReference<>();
    CountDownLatch returned = new CountDownLatch(1);
    Thread runner =
        new Thread(
            () -> {
              try {
                completer.run();
              } catch (Throwable t) {
                runFailed.set(t);
              } finally {
                returned.countDown();
              }
            },
            "completer-run");
    runner.start();

    abandon(slow, null, null);
    assertTrue(slowStarted.await(Wait.seconds(30), TimeUnit.SECONDS), "the slow key was not run");
    abandon(quick, null, null);
    Wait.until(
        "a later pass to finish the quick key beside the slow one",
        () -> client.lookup(quick).state().equals("completed"));

    CountDownLatch closed = new CountDownLatch(1);
    Thread closer =
        new Thread(
            () -> {
              completer.close();
              closed.countDown();
            },
            "completer-close");
    closer.start();
    Wait.until("the completer to be stopped", completer::isStopped);
    // The slow handler has not been let go: neither run nor close can have returned.
    assertEquals(1, returned.getCount(), "run returned with a handler in flight");
    assertEquals(1, closed.getCount(), "close returned with a handler in flight");
    release.countDown();
    assertTrue(
        returned.await(Wait.seconds(30), TimeUnit.SECONDS), "run did not return once stopped");
    assertTrue(closed.await(Wait.seconds(30), TimeUnit.SECONDS), "close did not return");
    assertNull(runFailed.get());
    assertEquals(0, inFlight.get(), "a handler still runs");
    // The handler in flight returned a result, which was stored.
    assertEquals("completed", client.lookup(slow).state());
    assertEquals(slow, client.lookup(slow).response().orElseThrow().bodyText());

    int before = runs.total();
    abandon(late, null, null);
    waitAbandoned(prefix, late);
    assertEquals(CompleterStats.NONE, completer.runOnce(), "a stopped completer took a key");
    completer.run();
    assertEquals(before, runs.total(), "a handler ran after run returned");
    KeyRecord r = client.lookup(late);
    assertEquals("pending", r.state());
    assertEquals(1, r.attempt());
  }

  @Test
  void runWaitsOutAnUnreachableIdemd() throws Exception {
    String prefix = prefix("outage");
    List<Long> failures = new ArrayList<>();
    List<Throwable> others = new ArrayList<>();
    try (Relay relay = Relay.to(daemon.url);
        IdemClient cut = IdemClient.builder(relay.url).retries(0).build()) {
      relay.cut();
      Completer completer =
          Completer.builder(cut)
              .prefix(prefix)
              .pollInterval(Duration.ofMillis(20))
              .onError(
                  (key, e) -> {
                    synchronized (failures) {
                      if (key.isEmpty() && e instanceof UnavailableException) {
                        failures.add(System.nanoTime());
                      } else {
                        others.add(e);
                      }
                    }
                  })
              .handler(l -> StoredResponse.of(200, "text/plain", "after"))
              .build();
      AtomicReference<Throwable> runFailed = new AtomicReference<>();
      CountDownLatch returned = new CountDownLatch(1);
      Thread runner =
          new Thread(
              () -> {
                try {
                  completer.run();
                } catch (Throwable t) {
                  runFailed.set(t);
                } finally {
                  returned.countDown();
                }
              },
              "completer-run");
      runner.start();
      try {
        Wait.until(
            "three passes to fail",
            () -> {
              synchronized (failures) {
                return failures.size() >= 3;
              }
            });
        assertEquals(1, returned.getCount(), "run returned while idemd could not be reached");
        long gap;
        synchronized (failures) {
          // The third pass came after a wait drawn from [250 ms, 500 ms], the backoff's
          // second step: far longer than the poll interval.
          gap = failures.get(2) - failures.get(1);
          assertEquals(List.of(), others);
        }
        assertTrue(
            gap >= TimeUnit.MILLISECONDS.toNanos(250),
            "the third pass came " + gap / 1_000_000 + " ms after the second");

        relay.restore();
        String key = prefix + "k";
        abandon(key, null, null);
        Wait.until(
            "the completer to finish the key once idemd is back",
            () -> {
              KeyRecord r = client.lookup(key);
              return r.state().equals("completed")
                  && r.response().orElseThrow().bodyText().equals("after");
            });
      } finally {
        completer.close();
      }
      assertTrue(
          returned.await(Wait.seconds(30), TimeUnit.SECONDS), "run did not return once closed");
      assertNull(runFailed.get());
    }
  }

  @Test
  void aCompleterWithoutAPrefixOrAHandlerOrOutOfLimitsIsNotBuilt() {
    Work<String> h = l -> "x";
    assertThrows(IllegalStateException.class, () -> Completer.builder(client).prefix("p/").build());
    assertThrows(IllegalStateException.class, () -> Completer.builder(client).handler(h).build());
    assertThrows(
        IllegalStateException.class,
        () -> Completer.builder(client).handler(h).prefix("p/").allKeys().build());
    assertThrows(
        IllegalArgumentException.class,
        () -> Completer.builder(client).handler(h).prefix("é".repeat(128)).build());
    assertThrows(
        IllegalArgumentException.class,
        () -> Completer.builder(client).handler(h).prefix("p\ud800").build());
    assertThrows(
        IllegalArgumentException.class,
        () ->
            Completer.builder(client).handler(h).prefix("p/").lease(Duration.ofMillis(99)).build());
    assertThrows(
        IllegalArgumentException.class,
        () -> Completer.builder(client).handler(h).prefix("p/").concurrency(0).build());
    assertThrows(
        IllegalArgumentException.class,
        () ->
            Completer.builder(client)
                .handler(h)
                .prefix("p/")
                .olderThan(Duration.ofMillis(-1))
                .build());
    try (Completer all = Completer.builder(client).handler(h).allKeys().build();
        Completer longest = Completer.builder(client).handler(h).prefix("é".repeat(127)).build()) {
      assertFalse(all.isStopped());
      assertFalse(longest.isStopped());
    }
  }

  @Test
  void aCheckpointInAHandlerIsRecordedForTheNextHolder() throws Exception {
    String prefix = prefix("checkpoint");
    String key = prefix + "k";
    abandon(key, null, "first");
    waitAbandoned(prefix, key);
    try (Completer completer =
        Completer.builder(client)
            .prefix(prefix)
            .lease(Duration.ofSeconds(1))
            .handler(
                l -> {
                  assertEquals("first", l.recoveryPoint().orElseThrow().name());
                  l.checkpoint("second", bytes("more"));
                  throw new IllegalStateException("not yet");
                })
            .build()) {
      assertEquals(new CompleterStats(1, 0, 0, 0, 1), completer.runOnce());
    }
    AbandonedKey listed = waitAbandoned(prefix, key).get(key);
    assertEquals("second", listed.recoveryPoint());
    RecoveryPoint p = client.lookup(key).recoveryPoint().orElseThrow();
    assertEquals(2, p.attempt());
    assertArrayEquals(bytes("more"), p.data());
  }
}
