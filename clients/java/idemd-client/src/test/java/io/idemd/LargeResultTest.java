package io.idemd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.testing.Daemon;
import java.nio.ByteBuffer;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Results over {@link IdemClient#RAW_RESULT_BYTES} (docs/middleware.md R10a) against real idemd
 * daemons: a body, or sealed envelope, over it goes as the raw body of PUT /v1/keys/{key}/result,
 * one up to it base64 in JSON, as idemd's request counts by endpoint show; with a blob store what
 * run stores comes back whole, sealed or not; without one it is not stored.
 */
class LargeResultTest {
  private static final String RAW_PUT = "PUT /v1/keys/:key/result";
  private static final String COMPLETE = "POST /v1/complete";
  private static final SecureRandom RANDOM = new SecureRandom();

  private static Daemon blobs;
  private static Daemon plain;
  private static KeyRing ring;

  @BeforeAll
  static void start() throws Exception {
    blobs = Daemon.start("--blob-store", "file:");
    plain = Daemon.start();
    byte[] key = new byte[32];
    RANDOM.nextBytes(key);
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

  /** A key with the characters a path must escape. */
  private static String key() {
    return "java-large/ ?#%+é-" + UUID.randomUUID();
  }

  private static byte[] random(int n) {
    byte[] b = new byte[n];
    RANDOM.nextBytes(b);
    return b;
  }

  /** How many completions each endpoint of the daemon has answered, raw PUT first. */
  private static long[] completions(Daemon d) throws Exception {
    return new long[] {d.requests(RAW_PUT), d.requests(COMPLETE)};
  }

  @ParameterizedTest
  @ValueSource(booleans = {false, true})
  void runStoresALargeValueByTheRawPutAndReplaysIt(boolean sealed) throws Exception {
    String key = key();
    String value = Base64.getEncoder().encodeToString(random(3 << 20));
    AtomicInteger runs = new AtomicInteger();
    try (IdemClient c = client(blobs, sealed);
        IdemClient other = client(blobs, sealed)) {
      long[] before = completions(blobs);
      RunResult<String> first =
          c.run(
              key,
              String.class,
              lease -> {
                runs.incrementAndGet();
                return value;
              });
      assertFalse(first.replayed());
      assertEquals(value, first.value());
      long[] after = completions(blobs);
      assertEquals(before[0] + 1, after[0], "the value was stored by the raw PUT, once");
      assertEquals(before[1], after[1], "the value was sent base64 in JSON");
      RunResult<String> again = other.run(key, String.class, lease -> "run again");
      assertTrue(again.replayed());
      assertEquals(value, again.value());
      assertEquals(1, runs.get());
    }
  }

  @ParameterizedTest
  @ValueSource(booleans = {false, true})
  void aResultGoesRawJustOverTheBound(boolean sealed) throws Exception {
    Map<String, List<String>> headers =
        Map.of("content-type", List.of("text/plain; charset=utf-8"), "x-name", List.of("café ☕"));
    // Sealed, the envelope decides: a body one byte short of the bound seals to one over it.
    int[] sizes =
        sealed
            ? new int[] {IdemClient.RAW_RESULT_BYTES - 200, IdemClient.RAW_RESULT_BYTES - 1}
            : new int[] {IdemClient.RAW_RESULT_BYTES, IdemClient.RAW_RESULT_BYTES + 1};
    try (IdemClient c = client(blobs, sealed)) {
      for (int size : sizes) {
        String key = key();
        byte[] body = random(size);
        Claim.Acquired acquired = assertInstanceOf(Claim.Acquired.class, c.claim(key));
        long[] before = completions(blobs);
        c.complete(key, acquired.leaseToken(), new StoredResponse(201, headers, body));
        long[] after = completions(blobs);
        boolean raw = size == sizes[1];
        assertEquals(before[0] + (raw ? 1 : 0), after[0], size + " bytes by the raw PUT");
        assertEquals(before[1] + (raw ? 0 : 1), after[1], size + " bytes base64 in JSON");
        StoredResponse stored = c.lookup(key).response().orElseThrow();
        assertEquals(201, stored.status());
        assertEquals(headers, stored.headers());
        assertArrayEquals(body, stored.body());
      }
    }
  }

  @Test
  void aBodyGivenAsABufferIsStoredFromItsPositionAndLeftAsItWas() throws Exception {
    byte[] whole = random(4096 + IdemClient.RAW_RESULT_BYTES + 1);
    ByteBuffer body = ByteBuffer.wrap(whole, 4096, whole.length - 4096);
    String key = key();
    try (IdemClient c = client(blobs, false)) {
      Claim.Acquired acquired = assertInstanceOf(Claim.Acquired.class, c.claim(key));
      long raw = blobs.requests(RAW_PUT);
      c.complete(key, acquired.leaseToken(), 200, Map.of(), body, null);
      assertEquals(raw + 1, blobs.requests(RAW_PUT));
      assertEquals(4096, body.position());
      StoredResponse stored = c.lookup(key).response().orElseThrow();
      assertArrayEquals(java.util.Arrays.copyOfRange(whole, 4096, whole.length), stored.body());
    }
  }

  @ParameterizedTest
  @ValueSource(booleans = {false, true})
  void withoutABlobStoreALargeValueIsNotStored(boolean sealed) throws Exception {
    String key = key();
    String value = Base64.getEncoder().encodeToString(random(3 << 20));
    try (IdemClient c = client(plain, sealed)) {
      long[] before = completions(plain);
      ResultNotStoredException e =
          assertThrows(ResultNotStoredException.class, () -> c.run(key, String.class, l -> value));
      assertEquals(value, e.value());
      assertTrue(
          e.getCause() instanceof PayloadTooLargeException
              || e.getCause() instanceof UnavailableException,
          String.valueOf(e.getCause()));
      long[] after = completions(plain);
      assertTrue(after[0] > before[0], "the value was offered by the raw PUT");
      assertEquals(before[1], after[1], "the value was sent base64 in JSON");
    }
  }
}
