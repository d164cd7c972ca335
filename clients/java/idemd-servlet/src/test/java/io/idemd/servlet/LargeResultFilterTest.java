package io.idemd.servlet;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.IdemClient;
import io.idemd.KeyRing;
import io.idemd.SealKey;
import io.idemd.testing.Daemon;
import io.idemd.testing.Wait;
import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.UUID;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Large results (docs/middleware.md R10a) through the filter in a real Tomcat against real idemd
 * daemons: with a blob store a 20 MiB answer is stored and replayed byte for byte, sealed or not,
 * with the filter's defaults; without one it is response_not_stored. Either way the answer goes to
 * idemd as the raw body of PUT /v1/keys/{key}/result, never base64 in POST /v1/complete, as idemd's
 * request counts by endpoint show.
 */
class LargeResultFilterTest {
  static final String RAW_PUT = "PUT /v1/keys/:key/result";
  static final String COMPLETE = "POST /v1/complete";

  private static Daemon blobs;
  private static Daemon plain;
  private static KeyRing ring;

  @BeforeAll
  static void start() throws Exception {
    blobs = Daemon.start("--blob-store", "file:");
    plain = Daemon.start();
    byte[] key = new byte[32];
    new SecureRandom().nextBytes(key);
    ring = KeyRing.of(new SealKey("k-large", key));
  }

  @AfterAll
  static void stop() {
    blobs.close();
    plain.close();
  }

  private static IdemClient client(Daemon daemon, boolean sealed) {
    IdemClient.Builder b = IdemClient.builder(daemon.url);
    return sealed ? b.sealing("default", ring).build() : b.build();
  }

  private static HttpResponse<byte[]> post(FilterTest.Server s, String key) throws Exception {
    HttpRequest req =
        HttpRequest.newBuilder(URI.create(s.url + "/large"))
            .POST(HttpRequest.BodyPublishers.noBody())
            .header("X-User", "alice")
            .header("Idempotency-Key", "\"" + key + "\"")
            .build();
    return FilterTest.http.send(req, HttpResponse.BodyHandlers.ofByteArray());
  }

  @ParameterizedTest
  @ValueSource(booleans = {false, true})
  void aLargeAnswerWithABlobStoreReplaysByteForByte(boolean sealed) throws Exception {
    String key = UUID.randomUUID().toString();
    try (IdemClient c = client(blobs, sealed);
        IdemClient other = client(blobs, sealed);
        FilterTest.Server s = new FilterTest.Server(b -> {}, c);
        FilterTest.Server t = new FilterTest.Server(b -> {}, other)) {
      long raw = blobs.requests(RAW_PUT);
      long json = blobs.requests(COMPLETE);
      HttpResponse<byte[]> first = post(s, key);
      assertEquals(201, first.statusCode());
      assertArrayEquals(FilterTest.LARGE, first.body());
      HttpResponse<byte[]> again = post(s, key);
      assertEquals(
          201,
          again.statusCode(),
          new String(again.body(), 0, Math.min(300, again.body().length), StandardCharsets.UTF_8));
      assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(""));
      assertEquals(
          "application/octet-stream", again.headers().firstValue("Content-Type").orElse(""));
      assertArrayEquals(FilterTest.LARGE, again.body());
      assertEquals(raw + 1, blobs.requests(RAW_PUT), "the answer was stored by the raw PUT, once");
      assertEquals(json, blobs.requests(COMPLETE), "the answer was sent base64 in JSON");
      // Through another client, past any cache: what idemd keeps.
      HttpResponse<byte[]> third = post(t, key);
      assertEquals(201, third.statusCode());
      assertArrayEquals(FilterTest.LARGE, third.body());
      assertEquals(1, s.app.runs.get());
      assertEquals(0, t.app.runs.get());
      assertTrue(s.incidents.isEmpty(), s.incidents.toString());
    }
  }

  @ParameterizedTest
  @ValueSource(booleans = {false, true})
  void aLargeAnswerWithoutABlobStoreIsNotStored(boolean sealed) throws Exception {
    String key = UUID.randomUUID().toString();
    try (IdemClient c = client(plain, sealed);
        FilterTest.Server s = new FilterTest.Server(b -> {}, c)) {
      long raw = plain.requests(RAW_PUT);
      long json = plain.requests(COMPLETE);
      HttpResponse<byte[]> first = post(s, key);
      assertEquals(201, first.statusCode());
      assertArrayEquals(FilterTest.LARGE, first.body());
      Wait.until("an incident is reported", () -> !s.incidents.isEmpty());
      assertEquals(
          Incident.Kind.RESULT_NOT_STORED, s.incidents.get(0).kind(), s.incidents.toString());
      HttpResponse<byte[]> again = post(s, key);
      assertEquals(409, again.statusCode());
      assertTrue(new String(again.body(), StandardCharsets.UTF_8).contains("response_not_stored"));
      assertEquals(1, s.app.runs.get());
      assertTrue(plain.requests(RAW_PUT) > raw, "the answer was offered by the raw PUT");
      assertEquals(json, plain.requests(COMPLETE), "the answer was sent base64 in JSON");
    }
  }
}
