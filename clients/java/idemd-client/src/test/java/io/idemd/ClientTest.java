package io.idemd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.testing.Daemon;
import io.idemd.testing.Wait;
import java.time.Duration;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** IdemClient against a real idemd. */
class ClientTest {
  private static Daemon daemon;
  private static IdemClient client;

  @BeforeAll
  static void start() throws Exception {
    daemon = Daemon.start();
    client = IdemClient.builder(daemon.url).build();
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    daemon.close();
  }

  private static String key() {
    return "java-" + UUID.randomUUID();
  }

  @Test
  void aClaimAcquiresThenReplaysTheStoredResult() {
    String key = key();
    Claim first = client.claim(key);
    Claim.Acquired acquired = assertInstanceOf(Claim.Acquired.class, first);
    assertEquals(1, acquired.attempt());
    assertFalse(acquired.recovered());
    client.complete(
        key, acquired.leaseToken(), StoredResponse.of(201, "application/json", "{\"id\":42}"));

    Claim.Finished finished = assertInstanceOf(Claim.Finished.class, client.claim(key));
    assertFalse(finished.failed());
    assertEquals(1, finished.attempt());
    StoredResponse stored = finished.response().orElseThrow();
    assertEquals(201, stored.status());
    assertEquals("{\"id\":42}", stored.bodyText());
    assertEquals(java.util.List.of("application/json"), stored.headers().get("content-type"));

    KeyRecord record = client.lookup(key);
    assertEquals("completed", record.state());
    assertEquals(key, record.key());
  }

  @Test
  void aHeldKeyIsInProgressWithRetryAfter() {
    String key = key();
    assertInstanceOf(
        Claim.Acquired.class,
        client.claim(key, ClaimOptions.DEFAULT.withLease(Duration.ofSeconds(20))));
    InProgressException e = assertThrows(InProgressException.class, () -> client.claim(key));
    assertEquals(409, e.status());
    assertEquals("in_progress", e.code());
    assertTrue(
        e.retryAfter().orElseThrow().compareTo(Duration.ZERO) > 0, "retry after " + e.retryAfter());
  }

  @Test
  void aKeyReusedWithAnotherPayloadIsRefused() {
    String key = key();
    client.claim(key, ClaimOptions.DEFAULT.withFingerprint("sha256:aa"));
    FingerprintMismatchException e =
        assertThrows(
            FingerprintMismatchException.class,
            () -> client.claim(key, ClaimOptions.DEFAULT.withFingerprint("sha256:bb")));
    assertEquals(422, e.status());
    assertTrue(e.detail().contains("fingerprint"), e.detail());
  }

  @Test
  void badInputIsAProblemNamingTheMember() {
    IdemProblemException e =
        assertThrows(
            IdemProblemException.class,
            () -> client.claim(key(), ClaimOptions.DEFAULT.withLease(Duration.ofMillis(5))));
    assertEquals(400, e.status());
    assertEquals("invalid_request", e.code());
    assertTrue(e.detail().contains("lease_ms"), e.detail());
  }

  @Test
  void aPurgedKeyIsNotFound() {
    String key = key();
    client.claim(key);
    client.purge(key);
    NotFoundException e = assertThrows(NotFoundException.class, () -> client.lookup(key));
    assertEquals(404, e.status());
  }

  @Test
  void aWaitingClaimGetsTheHoldersResult() throws Exception {
    String key = key();
    Claim.Acquired held = (Claim.Acquired) client.claim(key);
    CompletableFuture<Claim> waiting =
        CompletableFuture.supplyAsync(
            () -> client.claim(key, ClaimOptions.DEFAULT.withWaitFor(Duration.ofSeconds(20))));
    Wait.until(
        "the second claim waits",
        () -> !waiting.isDone() && client.lookup(key).state().equals("pending"));
    client.complete(key, held.leaseToken(), StoredResponse.of(200, "text/plain", "done"));
    Claim.Finished finished =
        assertInstanceOf(Claim.Finished.class, waiting.get(Wait.seconds(20), TimeUnit.SECONDS));
    assertEquals("done", finished.response().orElseThrow().bodyText());
  }

  @Test
  void runRunsOnceAndReplaysTheValue() {
    String key = key();
    AtomicInteger runs = new AtomicInteger();
    AtomicReference<Lease> seen = new AtomicReference<>();
    RunResult<Map<String, Object>> first =
        client.run(
            key,
            castMap(),
            lease -> {
              runs.incrementAndGet();
              seen.set(lease);
              assertEquals(Optional.of(lease), Lease.current());
              return Map.of("charge", "ch_1", "amount", 100);
            });
    assertFalse(first.replayed());
    assertEquals(1, seen.get().attempt());
    assertFalse(seen.get().recovered());
    assertEquals(key, seen.get().key());
    assertEquals(Optional.empty(), Lease.current());

    RunResult<Map<String, Object>> again =
        client.run(
            key,
            castMap(),
            lease -> {
              runs.incrementAndGet();
              return Map.of();
            });
    assertTrue(again.replayed());
    assertEquals("ch_1", again.value().get("charge"));
    assertEquals(100, again.value().get("amount"));
    assertEquals(1, runs.get());
  }

  @Test
  void aFailedRunIsReleasedForTheNextRun() {
    String key = key();
    IllegalStateException boom =
        assertThrows(
            IllegalStateException.class,
            () ->
                client.run(
                    key,
                    String.class,
                    lease -> {
                      throw new IllegalStateException("boom");
                    }));
    assertEquals("boom", boom.getMessage());
    AtomicReference<Lease> second = new AtomicReference<>();
    RunResult<String> r =
        client.run(
            key,
            String.class,
            lease -> {
              second.set(lease);
              return "ok";
            });
    assertEquals("ok", r.value());
    assertEquals(2, second.get().attempt());
    assertFalse(second.get().recovered(), "a released key is not recovered");
  }

  @Test
  void aPermanentFailureIsStoredAndReplayed() {
    String key = key();
    assertThrows(
        PermanentException.class,
        () ->
            client.run(
                key,
                String.class,
                lease -> {
                  throw new PermanentException(
                      "card declined", Map.of("reason", "insufficient_funds"), null);
                }));
    AtomicInteger runs = new AtomicInteger();
    FailedException e =
        assertThrows(
            FailedException.class,
            () ->
                client.run(
                    key,
                    String.class,
                    lease -> {
                      runs.incrementAndGet();
                      return "never";
                    }));
    assertEquals("card declined", e.getMessage());
    assertEquals("insufficient_funds", e.value().path("reason").asText());
    assertEquals(0, runs.get());
  }

  @Test
  void aTakeoverIsTheNextAttemptAndRecovered() throws Exception {
    String key = key();
    client.claim(key, ClaimOptions.DEFAULT.withLease(Duration.ofMillis(200)));
    AtomicReference<Lease> taken = new AtomicReference<>();
    Wait.until(
        "the first lease runs out and run takes the key over",
        () -> {
          try {
            client.once(key, taken::set);
            return true;
          } catch (InProgressException e) {
            return false;
          }
        });
    assertEquals(2, taken.get().attempt());
    assertTrue(taken.get().recovered());
  }

  @Test
  void aLostLeaseTurnsLostAndRunThrows() {
    String key = key();
    AtomicReference<Lease> held = new AtomicReference<>();
    LeaseLostException e =
        assertThrows(
            LeaseLostException.class,
            () ->
                client.run(
                    key,
                    String.class,
                    lease -> {
                      held.set(lease);
                      // Another caller takes the key away; the next renewal finds it gone.
                      client.purge(key);
                      Wait.until("the lease is seen lost", lease::isLost);
                      return "written after the lease was lost";
                    },
                    RunOptions.DEFAULT.withLease(Duration.ofMillis(300))));
    assertEquals("lease_lost", e.code());
    assertFalse(e instanceof LeaseExpiredException, "idemd answered: the lease did not run out");
    assertTrue(held.get().isLost());
    assertThrows(LeaseLostException.class, held.get()::checkLive);
  }

  @Test
  void anUnreachableIdemdIsUnavailableAndNothingRuns() throws Exception {
    try (IdemClient nowhere =
        IdemClient.builder("http://127.0.0.1:" + Daemon.freePort())
            .retries(1)
            .backoff(Duration.ofMillis(5))
            .build()) {
      UnavailableException e = assertThrows(UnavailableException.class, () -> nowhere.claim(key()));
      assertEquals(0, e.status());
      AtomicInteger runs = new AtomicInteger();
      Verdict v = nowhere.consume(key(), lease -> runs.incrementAndGet());
      assertEquals(Verdict.Action.REQUEUE, v.action());
      assertFalse(v.ran());
      assertEquals(0, runs.get());
    }
  }

  @Test
  void consumeFollowsTheVerdictTable() {
    String key = key();
    Verdict ran = client.consume(key, lease -> {});
    assertEquals(Verdict.Action.ACK, ran.action());
    assertTrue(ran.ran());
    Verdict redelivered =
        client.consume(
            key,
            lease -> {
              throw new AssertionError("ran twice");
            });
    assertEquals(Verdict.Action.ACK, redelivered.action());
    assertFalse(redelivered.ran());

    String held = key();
    client.claim(held, ClaimOptions.DEFAULT.withLease(Duration.ofSeconds(20)));
    Verdict busy =
        client.consume(
            held,
            lease -> {
              throw new AssertionError("ran without the lease");
            });
    assertEquals(Verdict.Action.REQUEUE, busy.action());
    assertFalse(busy.ran());
    assertTrue(
        busy.delay().compareTo(Duration.ofSeconds(1)) > 0,
        "requeued after the lease's time: " + busy.delay());
    assertInstanceOf(InProgressException.class, busy.error().orElseThrow());

    String transientKey = key();
    Verdict failed =
        client.consume(
            transientKey,
            lease -> {
              throw new java.io.IOException("the bank timed out");
            });
    assertEquals(Verdict.Action.REQUEUE, failed.action());
    assertTrue(failed.ran());
    assertEquals(Verdict.Action.ACK, client.consume(transientKey, lease -> {}).action());

    String permanent = key();
    Verdict dead =
        client.consume(
            permanent,
            lease -> {
              throw new PermanentException("malformed order");
            });
    assertEquals(Verdict.Action.DEAD_LETTER, dead.action());
    assertTrue(dead.ran());
    Verdict deadAgain =
        client.consume(
            permanent,
            lease -> {
              throw new AssertionError("a dead letter ran again");
            });
    assertEquals(Verdict.Action.DEAD_LETTER, deadAgain.action());
    assertFalse(deadAgain.ran());
    assertInstanceOf(FailedException.class, deadAgain.error().orElseThrow());
  }

  @SuppressWarnings({"unchecked", "rawtypes"})
  private static Class<Map<String, Object>> castMap() {
    return (Class) Map.class;
  }
}
