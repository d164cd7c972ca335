package io.idemd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.idemd.testing.Daemon;
import io.idemd.testing.Raw;
import io.idemd.testing.Wait;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Sealing against a real idemd (docs/sealing.md): what a client with a ring stores is an envelope,
 * in idemd's answers and in its store's bytes, and opens to the exact answer; rotation; a client
 * with the wrong ring, or none, gets an UnsealableException and runs nothing; require sealed;
 * recovery points sealed and opened by the next holder and by a Completer; batches.
 */
class SealingTest {
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final SealKey OLD = sealKey("k-2026-05");
  private static final SealKey NEW = sealKey("k-2026-11");

  private static Daemon daemon;
  private static IdemClient plain;
  private static IdemClient sealedOld;

  @BeforeAll
  static void start() throws Exception {
    daemon = Daemon.start();
    plain = IdemClient.builder(daemon.url).build();
    sealedOld = sealing(KeyRing.of(OLD));
  }

  @AfterAll
  static void stop() {
    plain.close();
    sealedOld.close();
    daemon.close();
  }

  private static SealKey sealKey(String id) {
    byte[] key = new byte[32];
    RANDOM.nextBytes(key);
    return new SealKey(id, key);
  }

  private static IdemClient sealing(KeyRing ring) {
    return IdemClient.builder(daemon.url).sealing("payments", ring).build();
  }

  private static String key(String what) {
    return "java-seal-" + what + "-" + UUID.randomUUID();
  }

  private static String base64(String s) {
    return Base64.getEncoder().encodeToString(utf8(s));
  }

  private static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  /** The key id an envelope names. */
  private static String envelopeKeyId(byte[] envelope) {
    assertEquals(0xC1, envelope[0] & 0xFF, "not an envelope");
    assertEquals(2, envelope[1], "not version 2");
    return new String(envelope, 3, envelope[2], StandardCharsets.US_ASCII);
  }

  /** Asserts that the raw record holds its result sealed, and returns the envelope. */
  private static byte[] sealedInRecord(JsonNode record, int status) {
    JsonNode response = record.path("response");
    assertEquals(status, response.path("status").asInt(), record.toString());
    assertFalse(response.has("headers"), "headers beside the envelope: " + record);
    assertFalse(response.has("body"), "a body beside the envelope: " + record);
    return Raw.bytes(response.path("sealed"));
  }

  private static void finish(IdemClient client, String key, StoredResponse response) {
    Claim.Acquired lease = (Claim.Acquired) client.claim(key);
    client.complete(key, lease.leaseToken(), response);
  }

  private static StoredResponse replayed(IdemClient client, String key) {
    Claim claim = client.claim(key);
    Claim.Finished finished = assertInstanceOf(Claim.Finished.class, claim);
    return finished.response().orElseThrow();
  }

  private static void assertSameAnswer(StoredResponse want, StoredResponse got) {
    assertEquals(want.status(), got.status());
    assertEquals(want.headers(), got.headers());
    assertArrayEquals(want.body(), got.body());
  }

  private static UnsealableException refused(
      UnsealableException.Reason reason, String keyId, Runnable call) {
    UnsealableException e = assertThrows(UnsealableException.class, call::run);
    assertEquals(reason, e.reason(), e.getMessage());
    assertEquals(keyId, e.keyId());
    return e;
  }

  @Test
  void aSealedResultIsAnEnvelopeToIdemdAndItsStoreAndOpensToTheExactAnswer() throws Exception {
    String key = key("round-trip");
    String secret = "ada-" + UUID.randomUUID() + "@example.com";
    StoredResponse answer =
        new StoredResponse(
            201,
            Map.of(
                "content-type", List.of("application/json"),
                "location", List.of("/orders/1001"),
                "x-trace", List.of("a", "b")),
            utf8("{\"email\":\"" + secret + "\",\"amount\":4200}"));
    finish(sealedOld, key, answer);

    // idemd answers the envelope as given: status readable, no headers or body.
    JsonNode record = Raw.record(daemon, key);
    assertEquals("completed", record.path("state").asText());
    byte[] envelope = sealedInRecord(record, 201);
    assertEquals(OLD.id(), envelopeKeyId(envelope));
    assertFalse(record.toString().contains(secret), "the answer shows the plaintext");
    assertFalse(record.toString().contains("/orders/1001"), "the answer shows a header");
    // Nor does the store: the embedded store keeps a record as JSON, a plain body in base64,
    // where a plain result's body is found and the sealed one's is not, in either form.
    String plainBody = "plain-" + UUID.randomUUID();
    finish(plain, key("plain"), StoredResponse.of(200, "text/plain", plainBody));
    assertTrue(Raw.storeHolds(daemon, base64(plainBody)), "the store's bytes show no plain body");
    assertFalse(
        Raw.storeHolds(daemon, base64(answer.bodyText())), "the store holds the sealed body");
    assertFalse(Raw.storeHolds(daemon, secret), "the store holds the sealed body in clear");

    // The sealing client's replay and lookup open it to the exact answer.
    assertSameAnswer(answer, replayed(sealedOld, key));
    KeyRecord looked = sealedOld.lookup(key);
    assertSameAnswer(answer, looked.response().orElseThrow());

    // A client without a ring cannot read it, and says with which key it was sealed.
    refused(UnsealableException.Reason.UNKNOWN_KEY, OLD.id(), () -> plain.claim(key));
    refused(UnsealableException.Reason.UNKNOWN_KEY, OLD.id(), () -> plain.lookup(key));
    // The same ring under another tenant's name does not open it.
    try (IdemClient orders =
        IdemClient.builder(daemon.url).sealing("orders", KeyRing.of(OLD)).build()) {
      refused(UnsealableException.Reason.INVALID, OLD.id(), () -> orders.claim(key));
    }
  }

  @Test
  void aResultSealedWithTheOldKeyReplaysThroughTheRotatedRing() throws Exception {
    String key = key("rotation");
    StoredResponse answer = StoredResponse.of(200, "application/json", "{\"charge\":\"ch_1\"}");
    finish(sealedOld, key, answer);
    try (IdemClient rotated = sealing(KeyRing.of(NEW, OLD));
        IdemClient dropped = sealing(KeyRing.of(NEW))) {
      assertSameAnswer(answer, replayed(rotated, key));
      // The rotated ring seals with its first key.
      String next = key("rotated");
      finish(rotated, next, answer);
      assertEquals(NEW.id(), envelopeKeyId(sealedInRecord(Raw.record(daemon, next), 200)));
      assertSameAnswer(answer, replayed(rotated, next));
      refused(UnsealableException.Reason.UNKNOWN_KEY, NEW.id(), () -> sealedOld.claim(next));
      // A ring that dropped the old key names it.
      refused(UnsealableException.Reason.UNKNOWN_KEY, OLD.id(), () -> dropped.claim(key));
      refused(UnsealableException.Reason.UNKNOWN_KEY, OLD.id(), () -> dropped.lookup(key));
    }
  }

  @Test
  void runOnceAndConsumeWithTheWrongRingRaiseAndRunNothing() throws Exception {
    String key = key("run");
    RunResult<String> first = sealedOld.run(key, String.class, l -> "ch_" + l.attempt());
    assertFalse(first.replayed());
    sealedInRecord(Raw.record(daemon, key), 200);
    RunResult<String> again = sealedOld.run(key, String.class, l -> "ran twice");
    assertTrue(again.replayed());
    assertEquals("ch_1", again.value());

    AtomicInteger runs = new AtomicInteger();
    try (IdemClient wrong = sealing(KeyRing.of(NEW))) {
      for (IdemClient c : List.of(wrong, plain)) {
        refused(
            UnsealableException.Reason.UNKNOWN_KEY,
            OLD.id(),
            () -> c.run(key, String.class, l -> "ran " + runs.incrementAndGet()));
        refused(
            UnsealableException.Reason.UNKNOWN_KEY,
            OLD.id(),
            () -> c.once(key, l -> runs.incrementAndGet()));
        // A consumer requeues the message with the error, never acknowledging or dropping it:
        // a consumer whose ring holds the key can take it.
        Verdict v = c.consume(key, l -> runs.incrementAndGet());
        assertEquals(Verdict.Action.REQUEUE, v.action());
        assertTrue(v.delay().compareTo(Duration.ZERO) > 0, v.delay().toString());
        assertFalse(v.ran());
        UnsealableException e =
            assertInstanceOf(UnsealableException.class, v.error().orElseThrow());
        assertEquals(UnsealableException.Reason.UNKNOWN_KEY, e.reason());
        assertEquals(OLD.id(), e.keyId());
      }
    }
    assertEquals(0, runs.get(), "the work ran for a result that does not open");
    // The key is as it was: the ring that sealed it still replays its value.
    assertEquals("ch_1", sealedOld.run(key, String.class, l -> "ran twice").value());
  }

  @Test
  void aPermanentFailureIsStoredSealedAndReplaysAsTheFailure() throws Exception {
    String key = key("failed");
    String reason = "card-" + UUID.randomUUID();
    assertThrows(
        PermanentException.class,
        () ->
            sealedOld.run(
                key,
                String.class,
                l -> {
                  throw new PermanentException(reason, Map.of("code", 7), null);
                }));
    JsonNode record = Raw.record(daemon, key);
    assertEquals("failed", record.path("state").asText());
    sealedInRecord(record, 200);
    assertFalse(record.toString().contains(reason));
    FailedException failed =
        assertThrows(
            FailedException.class, () -> sealedOld.run(key, String.class, l -> "ran twice"));
    assertEquals(reason, failed.getMessage());
    assertEquals(7, failed.value().path("code").asInt());
  }

  /**
   * Plays whoever can write the store: replaces the record of key by one of the same fingerprint
   * finished by "complete" or a "fail" release with response (none when null), an envelope copied
   * as it is.
   */
  private static void rewrite(String key, String finish, JsonNode response) throws Exception {
    JsonNode was = Raw.record(daemon, key);
    plain.purge(key);
    com.fasterxml.jackson.databind.ObjectMapper json =
        new com.fasterxml.jackson.databind.ObjectMapper();
    com.fasterxml.jackson.databind.node.ObjectNode claim = json.createObjectNode().put("key", key);
    if (was.hasNonNull("fingerprint")) {
      claim.put("fingerprint", was.path("fingerprint").asText());
    }
    String token = Raw.post(daemon, "/v1/claim", claim).path("lease_token").asText();
    com.fasterxml.jackson.databind.node.ObjectNode finished =
        json.createObjectNode().put("key", key).put("lease_token", token);
    if (response != null) {
      finished.set("response", response);
    }
    if (finish.equals("fail")) {
      Raw.post(daemon, "/v1/release", finished.put("mode", "fail"));
    } else {
      Raw.post(daemon, "/v1/complete", finished);
    }
  }

  @Test
  void anEnvelopeDoesNotOpenUnderTheOtherOutcome() throws Exception {
    for (String stored : List.of("fail", "complete")) {
      String key = key("outcome-" + stored);
      StoredResponse answer =
          StoredResponse.of(stored.equals("fail") ? 402 : 201, "text/plain", "x");
      Claim.Acquired lease = (Claim.Acquired) sealedOld.claim(key);
      if (stored.equals("fail")) {
        sealedOld.releaseAsFailed(key, lease.leaseToken(), answer, null);
      } else {
        sealedOld.complete(key, lease.leaseToken(), answer);
      }
      JsonNode before = Raw.record(daemon, key);
      byte[] envelope = sealedInRecord(before, answer.status());
      String swapTo = stored.equals("fail") ? "complete" : "fail";
      rewrite(key, swapTo, before.path("response"));
      JsonNode after = Raw.record(daemon, key);
      assertEquals(swapTo.equals("fail") ? "failed" : "completed", after.path("state").asText());
      assertArrayEquals(envelope, sealedInRecord(after, answer.status()));
      AtomicInteger runs = new AtomicInteger();
      for (boolean strict : List.of(true, false)) {
        try (IdemClient reader =
            IdemClient.builder(daemon.url)
                .sealing("payments", KeyRing.of(OLD))
                .requireSealed(strict)
                .build()) {
          String id = OLD.id();
          refused(UnsealableException.Reason.INVALID, id, () -> reader.claim(key));
          refused(UnsealableException.Reason.INVALID, id, () -> reader.lookup(key));
          refused(
              UnsealableException.Reason.INVALID,
              id,
              () -> reader.run(key, String.class, l -> "ran " + runs.incrementAndGet()));
        }
      }
      assertEquals(0, runs.get());
    }
  }

  @Test
  void requireSealedRefusesAnUnsealedFailureAndReplaysASealedOneWithoutAResponse()
      throws Exception {
    String bare = key("bare-failure");
    Claim.Acquired lease = (Claim.Acquired) sealedOld.claim(bare);
    sealedOld.releaseAsFailed(bare, lease.leaseToken(), null, null);
    JsonNode record = Raw.record(daemon, bare);
    assertEquals("failed", record.path("state").asText());
    assertEquals(OLD.id(), envelopeKeyId(sealedInRecord(record, 500)));

    String key = key("unsealed-failure");
    sealedOld.run(key, String.class, l -> "ch_1");
    sealedInRecord(Raw.record(daemon, key), 200);
    rewrite(key, "fail", null);
    JsonNode swapped = Raw.record(daemon, key);
    assertEquals("failed", swapped.path("state").asText());
    assertFalse(swapped.has("response"), swapped.toString());

    AtomicInteger runs = new AtomicInteger();
    try (IdemClient strict =
        IdemClient.builder(daemon.url)
            .sealing("payments", KeyRing.of(OLD))
            .requireSealed(true)
            .build()) {
      Claim.Finished replay = assertInstanceOf(Claim.Finished.class, strict.claim(bare));
      assertTrue(replay.failed());
      assertTrue(replay.response().isEmpty());
      assertTrue(strict.lookup(bare).response().isEmpty());

      refused(UnsealableException.Reason.NOT_SEALED, "", () -> strict.claim(key));
      refused(UnsealableException.Reason.NOT_SEALED, "", () -> strict.lookup(key));
      refused(
          UnsealableException.Reason.NOT_SEALED,
          "",
          () -> strict.run(key, String.class, l -> "ran " + runs.incrementAndGet()));
      refused(
          UnsealableException.Reason.NOT_SEALED,
          "",
          () -> strict.once(key, l -> runs.incrementAndGet()));
      Verdict v = strict.consume(key, l -> runs.incrementAndGet());
      assertEquals(Verdict.Action.REQUEUE, v.action());
      assertInstanceOf(UnsealableException.class, v.error().orElseThrow());
    }
    assertEquals(0, runs.get());
    assertThrows(
        FailedException.class,
        () -> sealedOld.run(key, String.class, l -> "ran " + runs.incrementAndGet()));
    assertEquals(0, runs.get());
  }

  @Test
  void requireSealedRefusesAPlainResultThatAnotherClientPassesOn() throws Exception {
    String key = key("plain");
    plain.run(key, String.class, l -> "stored plain");
    assertTrue(Raw.record(daemon, key).path("response").has("body"));
    // A ring that does not require sealing passes a plain result on.
    RunResult<String> passed = sealedOld.run(key, String.class, l -> "ran twice");
    assertTrue(passed.replayed());
    assertEquals("stored plain", passed.value());

    AtomicInteger runs = new AtomicInteger();
    try (IdemClient strict =
        IdemClient.builder(daemon.url)
            .sealing("payments", KeyRing.of(OLD))
            .requireSealed(true)
            .build()) {
      refused(UnsealableException.Reason.NOT_SEALED, "", () -> strict.claim(key));
      refused(UnsealableException.Reason.NOT_SEALED, "", () -> strict.lookup(key));
      refused(
          UnsealableException.Reason.NOT_SEALED,
          "",
          () -> strict.run(key, String.class, l -> "ran " + runs.incrementAndGet()));
      assertEquals(0, runs.get());
      // What it seals itself it opens.
      String own = key("strict");
      assertFalse(strict.run(own, String.class, l -> "sealed").replayed());
      assertEquals("sealed", strict.run(own, String.class, l -> "ran twice").value());
    }
  }

  @Test
  void aRecoveryPointIsSealedAndTheRunAfterARetryReleaseOpensIt() throws Exception {
    String key = key("point");
    String charge = "ch_" + UUID.randomUUID();
    assertThrows(
        IllegalStateException.class,
        () ->
            sealedOld.run(
                key,
                String.class,
                l -> {
                  l.checkpoint("charged", utf8(charge));
                  throw new IllegalStateException("the provider timed out after the charge");
                }));
    JsonNode record = Raw.record(daemon, key);
    assertEquals("released", record.path("state").asText());
    JsonNode point = record.path("recovery_point");
    assertEquals("charged", point.path("name").asText());
    byte[] data = Raw.bytes(point.path("data"));
    assertEquals(OLD.id(), envelopeKeyId(data));
    assertFalse(record.toString().contains(charge));
    assertFalse(Raw.storeHolds(daemon, base64(charge)), "the store holds the point's data");
    assertArrayEquals(
        utf8(charge), sealedOld.lookup(key).recoveryPoint().orElseThrow().data(), "lookup");
    // A client without a ring hands the point's data on as it is: a point has no mark of its
    // own, so its envelope cannot be told from plain data starting with the same byte.
    assertArrayEquals(data, plain.lookup(key).recoveryPoint().orElseThrow().data(), "no ring");

    AtomicReference<RecoveryPoint> resumed = new AtomicReference<>();
    RunResult<String> r =
        sealedOld.run(
            key,
            String.class,
            l -> {
              resumed.set(l.recoveryPoint().orElseThrow());
              return "done";
            });
    assertFalse(r.replayed());
    assertEquals("charged", resumed.get().name());
    assertArrayEquals(utf8(charge), resumed.get().data());

    // Under require sealed a plain point is refused, and the work does not run.
    String plainKey = key("plain-point");
    assertThrows(
        IllegalStateException.class,
        () ->
            plain.run(
                plainKey,
                String.class,
                l -> {
                  l.checkpoint("charged", utf8("plain"));
                  throw new IllegalStateException("retry");
                }));
    try (IdemClient strict =
        IdemClient.builder(daemon.url)
            .sealing("payments", KeyRing.of(OLD))
            .requireSealed(true)
            .build()) {
      AtomicInteger runs = new AtomicInteger();
      refused(
          UnsealableException.Reason.NOT_SEALED,
          "",
          () -> strict.run(plainKey, String.class, l -> "ran " + runs.incrementAndGet()));
      assertEquals(0, runs.get());
    }
  }

  @Test
  void aCompleterOpensTheAbandonedPointAndSealsTheResultItStores() throws Exception {
    String prefix = "java-seal-completer-" + UUID.randomUUID() + "/";
    String key = prefix + "order-1";
    String secret = "ch_" + UUID.randomUUID();
    Claim.Acquired held =
        (Claim.Acquired)
            sealedOld.claim(key, ClaimOptions.DEFAULT.withLease(Duration.ofMillis(200)));
    sealedOld.recordRecoveryPoint(key, held.leaseToken(), "charged", utf8(secret));
    // The holder dies: its lease runs out with the point recorded.
    Wait.until(
        "the feed lists the key",
        () -> !sealedOld.abandoned(AbandonedQuery.of(prefix)).keys().isEmpty());
    assertEquals(
        "charged", sealedOld.abandoned(AbandonedQuery.of(prefix)).keys().get(0).recoveryPoint());

    // A completer without the key cannot open the point: an error, and nothing runs.
    AtomicInteger runs = new AtomicInteger();
    Map<String, Throwable> errors = new ConcurrentHashMap<>();
    try (IdemClient wrong = sealing(KeyRing.of(NEW));
        Completer completer =
            Completer.builder(wrong)
                .prefix(prefix)
                .lease(Duration.ofMillis(200))
                .handler(l -> runs.incrementAndGet())
                .onError(errors::put)
                .build()) {
      assertEquals(new CompleterStats(1, 0, 0, 0, 1), completer.runOnce());
    }
    assertEquals(0, runs.get());
    UnsealableException e = assertInstanceOf(UnsealableException.class, errors.get(key));
    assertEquals(OLD.id(), e.keyId());
    // The completer leaves the key pending, so that it stays in the feed: no release.
    assertEquals("pending", Raw.record(daemon, key).path("state").asText());

    // The key comes back to the feed, and a completer with the ring finishes it.
    Wait.until(
        "the feed lists the key again",
        () -> !sealedOld.abandoned(AbandonedQuery.of(prefix)).keys().isEmpty());
    AtomicReference<Lease> seen = new AtomicReference<>();
    StoredResponse refund =
        StoredResponse.of(200, "application/json", "{\"refund\":\"" + secret + "\"}");
    try (IdemClient rotated = sealing(KeyRing.of(NEW, OLD));
        Completer completer =
            Completer.builder(rotated)
                .prefix(prefix)
                .handler(
                    l -> {
                      seen.set(l);
                      return refund;
                    })
                .build()) {
      assertEquals(new CompleterStats(1, 1, 0, 0, 0), completer.runOnce());
    }
    assertTrue(seen.get().recovered());
    assertArrayEquals(utf8(secret), seen.get().recoveryPoint().orElseThrow().data());
    byte[] stored = sealedInRecord(Raw.record(daemon, key), 200);
    assertEquals(NEW.id(), envelopeKeyId(stored));
    try (IdemClient rotated = sealing(KeyRing.of(NEW, OLD))) {
      assertSameAnswer(refund, rotated.lookup(key).response().orElseThrow());
    }
  }

  /** Records a point sealed with OLD for a fresh key, then releases the key for a retry. */
  private static String keyWithSealedPoint(String what, String data) {
    String key = key(what);
    Claim.Acquired held = (Claim.Acquired) sealedOld.claim(key);
    sealedOld.recordRecoveryPoint(key, held.leaseToken(), "charged", utf8(data));
    sealedOld.releaseForRetry(key, held.leaseToken());
    return key;
  }

  private static void assertReleased(String key) throws Exception {
    JsonNode record = Raw.record(daemon, key);
    assertEquals("released", record.path("state").asText(), record.toString());
    assertEquals("charged", record.path("recovery_point").path("name").asText());
  }

  @Test
  void aRecoveryPointThatDoesNotOpenReleasesTheKeyForARetryInClaimRunOnceAndConsume()
      throws Exception {
    String charge = "ch_" + UUID.randomUUID();
    AtomicInteger runs = new AtomicInteger();
    try (IdemClient wrong = sealing(KeyRing.of(NEW))) {
      String claimed = keyWithSealedPoint("point-claim", charge);
      refused(UnsealableException.Reason.UNKNOWN_KEY, OLD.id(), () -> wrong.claim(claimed));
      assertReleased(claimed);

      String ran = keyWithSealedPoint("point-run", charge);
      refused(
          UnsealableException.Reason.UNKNOWN_KEY,
          OLD.id(),
          () -> wrong.run(ran, String.class, l -> "ran " + runs.incrementAndGet()));
      assertReleased(ran);

      String once = keyWithSealedPoint("point-once", charge);
      refused(
          UnsealableException.Reason.UNKNOWN_KEY,
          OLD.id(),
          () -> wrong.once(once, l -> runs.incrementAndGet()));
      assertReleased(once);

      String consumed = keyWithSealedPoint("point-consume", charge);
      Verdict v = wrong.consume(consumed, l -> runs.incrementAndGet());
      assertEquals(Verdict.Action.REQUEUE, v.action());
      assertFalse(v.ran());
      UnsealableException e = assertInstanceOf(UnsealableException.class, v.error().orElseThrow());
      assertEquals(UnsealableException.Reason.UNKNOWN_KEY, e.reason());
      assertEquals(OLD.id(), e.keyId());
      assertReleased(consumed);
      assertEquals(0, runs.get(), "the work ran from a point that does not open");

      // A holder of the key resumes each at once, from the point as it was recorded.
      for (String k : List.of(claimed, ran, once, consumed)) {
        AtomicReference<RecoveryPoint> resumed = new AtomicReference<>();
        RunResult<String> r =
            sealedOld.run(
                k,
                String.class,
                l -> {
                  resumed.set(l.recoveryPoint().orElseThrow());
                  return "done";
                });
        assertFalse(r.replayed(), k);
        assertArrayEquals(utf8(charge), resumed.get().data(), k);
      }
    }
  }

  @Test
  void aClientWithoutARingHandsEveryPointOnAsItIs() throws Exception {
    // A point sealed by a client with a ring reaches a ring-less one as its bytes.
    String sealedKey = keyWithSealedPoint("point-plain-client", "ch_sealed");
    byte[] envelope = Raw.bytes(Raw.record(daemon, sealedKey).path("recovery_point").path("data"));
    assertEquals(OLD.id(), envelopeKeyId(envelope));
    AtomicReference<RecoveryPoint> resumed = new AtomicReference<>();
    assertFalse(
        plain
            .run(
                sealedKey,
                String.class,
                l -> {
                  resumed.set(l.recoveryPoint().orElseThrow());
                  return "done";
                })
            .replayed());
    assertArrayEquals(envelope, resumed.get().data());

    // Plain binary data with a whole envelope head (marker, version, a key id's length and
    // enough bytes after it) is recorded and handed back unchanged.
    byte[] binary = new byte[80];
    RANDOM.nextBytes(binary);
    binary[0] = (byte) 0xC1;
    binary[1] = 1;
    binary[2] = 4;
    String key = key("point-binary");
    Claim.Acquired held = (Claim.Acquired) plain.claim(key);
    plain.recordRecoveryPoint(key, held.leaseToken(), "raw", binary);
    plain.releaseForRetry(key, held.leaseToken());
    assertArrayEquals(binary, plain.lookup(key).recoveryPoint().orElseThrow().data(), "lookup");
    Claim.Acquired again = assertInstanceOf(Claim.Acquired.class, plain.claim(key));
    assertArrayEquals(binary, again.recoveryPoint().orElseThrow().data(), "claim");

    // A sealed result still does not reach it: unknown_key, naming the key.
    String done = key("point-then-result");
    sealedOld.run(done, String.class, l -> "ch_1");
    refused(UnsealableException.Reason.UNKNOWN_KEY, OLD.id(), () -> plain.lookup(done));
  }

  @Test
  void batchedCompletesCarryTheEnvelopeAlone() throws Exception {
    List<String> keys = new ArrayList<>();
    for (int i = 0; i < 256; i++) {
      keys.add(key("batch-" + i));
    }
    long before = BatchTest.batches(daemon);
    List<RunResult<String>> first = BatchTest.storm(sealedOld, keys);
    assertTrue(BatchTest.batches(daemon) > before, "no call shared a batch");
    for (int i = 0; i < keys.size(); i++) {
      assertFalse(first.get(i).replayed());
      sealedInRecord(Raw.record(daemon, keys.get(i)), 200);
    }
    List<RunResult<String>> again = BatchTest.storm(sealedOld, keys);
    for (int i = 0; i < keys.size(); i++) {
      assertTrue(again.get(i).replayed());
      assertEquals("value of " + keys.get(i), again.get(i).value());
    }
  }
}
