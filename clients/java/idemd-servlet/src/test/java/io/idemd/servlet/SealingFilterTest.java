package io.idemd.servlet;

import static io.idemd.servlet.FilterTest.code;
import static io.idemd.servlet.FilterTest.key;
import static io.idemd.servlet.FilterTest.post;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.idemd.IdemClient;
import io.idemd.Idempotency;
import io.idemd.KeyRing;
import io.idemd.SealKey;
import io.idemd.UnsealableException;
import io.idemd.testing.Daemon;
import io.idemd.testing.Raw;
import io.idemd.testing.Wait;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.function.Consumer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The filter with a client that seals (docs/sealing.md), in a real Tomcat against a real idemd:
 * every answer it stores is an envelope, a replay opens it identically, and one that does not open
 * is P5 (502 stored_response_unsealable, incident replay_unsealable, the handler not run).
 */
class SealingFilterTest {
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final SealKey OLD = sealKey("k-2026-05");
  private static final SealKey NEW = sealKey("k-2026-11");

  private static Daemon daemon;
  private static IdemClient sealing;
  private static IdemClient otherRing;
  private static IdemClient plain;

  @BeforeAll
  static void start() throws Exception {
    daemon = Daemon.start();
    sealing = IdemClient.builder(daemon.url).sealing("payments", KeyRing.of(OLD)).build();
    otherRing = IdemClient.builder(daemon.url).sealing("payments", KeyRing.of(NEW)).build();
    plain = IdemClient.builder(daemon.url).build();
  }

  @AfterAll
  static void stop() {
    sealing.close();
    otherRing.close();
    plain.close();
    daemon.close();
  }

  private static SealKey sealKey(String id) {
    byte[] key = new byte[32];
    RANDOM.nextBytes(key);
    return new SealKey(id, key);
  }

  private static FilterTest.Server serve(IdemClient client) throws Exception {
    return serve(client, b -> {});
  }

  private static FilterTest.Server serve(
      IdemClient client, Consumer<IdempotencyFilter.Builder> configure) throws Exception {
    return new FilterTest.Server(configure, client);
  }

  /** Asserts that the raw record holds a sealed answer of status, and no headers or body. */
  private static void storedSealed(String derived, int status, String... notShown)
      throws Exception {
    JsonNode record = Raw.record(daemon, derived);
    JsonNode response = record.path("response");
    assertEquals(status, response.path("status").asInt(), record.toString());
    assertFalse(response.has("headers"), record.toString());
    assertFalse(response.has("body"), record.toString());
    byte[] envelope = Raw.bytes(response.path("sealed"));
    assertEquals(0xC1, envelope[0] & 0xFF);
    for (String text : notShown) {
      assertFalse(record.toString().contains(text), "the record shows " + text);
    }
  }

  /** Asserts P5: 502 stored_response_unsealable, the incident with the error, nothing run. */
  private static UnsealableException unsealable(FilterTest.Server s, HttpResponse<String> res)
      throws Exception {
    assertEquals(502, res.statusCode(), res.body());
    assertEquals("stored_response_unsealable", code(res));
    assertEquals("application/problem+json", res.headers().firstValue("Content-Type").orElse(""));
    assertTrue(res.headers().firstValue("Idempotent-Replayed").isEmpty());
    assertEquals(0, s.app.runs.get(), "the handler ran for an answer that does not open");
    Wait.until("an incident is reported", () -> !s.incidents.isEmpty());
    Incident incident = s.incidents.get(0);
    assertEquals(Incident.Kind.REPLAY_UNSEALABLE, incident.kind());
    assertEquals("replay_unsealable", incident.kind().label());
    return assertInstanceOf(UnsealableException.class, incident.error().orElseThrow());
  }

  @Test
  void anAnswerStoredSealedReplaysIdentically() throws Exception {
    String key = key();
    String derived = Idempotency.idemdKey("alice", key);
    try (FilterTest.Server s = serve(sealing)) {
      HttpResponse<String> first = post(s.url + "/orders", "alice", key, "{\"amount\":4200}");
      assertEquals(201, first.statusCode());
      storedSealed(derived, 201, "/orders/1", "4200", "application/json");

      HttpResponse<String> again = post(s.url + "/orders", "alice", key, "{\"amount\":4200}");
      assertEquals(201, again.statusCode());
      assertEquals(first.body(), again.body());
      assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(""));
      assertEquals("/orders/1", again.headers().firstValue("Location").orElse(""));
      assertEquals(
          first.headers().firstValue("Content-Type"), again.headers().firstValue("Content-Type"));
      assertTrue(again.headers().firstValue("Set-Cookie").isEmpty());
      assertEquals(1, s.app.runs.get());
      assertTrue(s.incidents.isEmpty(), s.incidents.toString());
    }

    // A filter whose client lacks the key, or has no ring, answers 502 and runs nothing.
    for (IdemClient without : new IdemClient[] {otherRing, plain}) {
      try (FilterTest.Server s = serve(without)) {
        UnsealableException e =
            unsealable(s, post(s.url + "/orders", "alice", key, "{\"amount\":4200}"));
        assertEquals(UnsealableException.Reason.UNKNOWN_KEY, e.reason());
        assertEquals(OLD.id(), e.keyId());
        assertEquals(derived, s.incidents.get(0).idemdKey());
      }
    }
  }

  @Test
  void theResponseNotStoredAnswerIsSealedToo() throws Exception {
    String key = key();
    String derived = Idempotency.idemdKey("alice", key);
    try (FilterTest.Server s = serve(sealing, b -> b.maxStoredBytes(1024))) {
      // R10: the answer is too large to store; 409 response_not_stored is stored instead.
      HttpResponse<String> first = post(s.url + "/big", "alice", key, "{}");
      assertEquals(200, first.statusCode());
      assertEquals(4096, first.body().getBytes(StandardCharsets.UTF_8).length);
      assertEquals("failed", Raw.record(daemon, derived).path("state").asText());
      storedSealed(derived, 409, "response_not_stored");

      // P4 through the ring.
      HttpResponse<String> again = post(s.url + "/big", "alice", key, "{}");
      assertEquals(409, again.statusCode());
      assertEquals("response_not_stored", code(again));
      assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(""));
      assertEquals(1, s.app.runs.get());
    }
    try (FilterTest.Server s = serve(plain)) {
      unsealable(s, post(s.url + "/big", "alice", key, "{}"));
    }
  }

  @Test
  void requireSealedRefusesAPlainAnswer() throws Exception {
    String key = key();
    try (FilterTest.Server s = serve(plain)) {
      assertEquals(201, post(s.url + "/orders", "alice", key, "{}").statusCode());
    }
    try (IdemClient strict =
            IdemClient.builder(daemon.url)
                .sealing("payments", KeyRing.of(OLD))
                .requireSealed(true)
                .build();
        FilterTest.Server s = serve(strict)) {
      UnsealableException e = unsealable(s, post(s.url + "/orders", "alice", key, "{}"));
      assertEquals(UnsealableException.Reason.NOT_SEALED, e.reason());
      assertEquals("", e.keyId());
    }
    // A ring that does not require sealing replays it.
    try (FilterTest.Server s = serve(sealing)) {
      HttpResponse<String> replay = post(s.url + "/orders", "alice", key, "{}");
      assertEquals(201, replay.statusCode());
      assertEquals("true", replay.headers().firstValue("Idempotent-Replayed").orElse(""));
    }
  }

  @Test
  void aHandlerResumesFromAPointItsPredecessorRecordedSealed() throws Exception {
    String key = key();
    String derived = Idempotency.idemdKey("alice", key);
    try (FilterTest.Server s = serve(sealing)) {
      // /checkpoint records "reserved" with "room 1" and answers 503: the key is released.
      assertEquals(503, post(s.url + "/checkpoint", "alice", key, "{}").statusCode());
      JsonNode point = Raw.record(daemon, derived).path("recovery_point");
      assertEquals("reserved", point.path("name").asText());
      byte[] data = Raw.bytes(point.path("data"));
      assertEquals(0xC1, data[0] & 0xFF);
      assertFalse(new String(data, StandardCharsets.ISO_8859_1).contains("room 1"));
      assertEquals(
          "room 1",
          new String(
              sealing.lookup(derived).recoveryPoint().orElseThrow().data(),
              StandardCharsets.UTF_8));
    }
    // A filter without the key cannot start from it: P5, nothing run, and the key released for
    // a retry (the point kept), since its work is not finished.
    try (FilterTest.Server s = serve(otherRing)) {
      UnsealableException e = unsealable(s, post(s.url + "/checkpoint", "alice", key, "{}"));
      assertEquals(UnsealableException.Reason.UNKNOWN_KEY, e.reason());
      assertEquals(OLD.id(), e.keyId());
      JsonNode record = Raw.record(daemon, derived);
      assertEquals("released", record.path("state").asText(), record.toString());
      assertEquals("reserved", record.path("recovery_point").path("name").asText());
    }
    // So a filter with the key resumes it at once, from the point as it was recorded.
    try (FilterTest.Server s = serve(sealing)) {
      assertEquals(
          503,
          post(s.url + "/checkpoint", "alice", key, "{}", "X-Request-Id", "resumed").statusCode());
      io.idemd.RecoveryPoint p = s.app.leases.get("resumed").recoveryPoint().orElseThrow();
      assertEquals("reserved", p.name());
      assertEquals("room 1", new String(p.data(), StandardCharsets.UTF_8));
      assertTrue(s.incidents.isEmpty(), s.incidents.toString());
    }
  }
}
