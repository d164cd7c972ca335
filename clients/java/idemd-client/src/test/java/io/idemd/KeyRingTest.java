package io.idemd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.function.Consumer;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The envelope of docs/sealing.md: the shared vectors of clients/testdata/sealing.json, sealed byte
 * for byte and opened, and their refusals; the ring's text form and its checks; and how a client
 * with a ring, without one, or requiring sealed results reads what comes back.
 */
class KeyRingTest {
  private static final JsonNode FILE = read();
  private static final Base64.Decoder B64 = Base64.getDecoder();

  private static JsonNode read() {
    try {
      return new ObjectMapper().readTree(Path.of("..", "..", "testdata", "sealing.json").toFile());
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  private static List<SealKey> fileKeys() {
    List<SealKey> keys = new ArrayList<>();
    FILE.path("ring")
        .forEach(k -> keys.add(new SealKey(k.path("id").asText(), bytes(k.path("key_base64")))));
    if (keys.isEmpty()) {
      throw new IllegalStateException("sealing.json has no ring");
    }
    return keys;
  }

  /** The file's ring with keyId first, so that keyId seals. */
  private static KeyRing sealingWith(String keyId) {
    List<SealKey> keys = new ArrayList<>(fileKeys());
    SealKey first = keys.stream().filter(k -> k.id().equals(keyId)).findFirst().orElseThrow();
    keys.remove(first);
    keys.add(0, first);
    return KeyRing.of(keys);
  }

  private static byte[] bytes(JsonNode base64) {
    return B64.decode(base64.asText());
  }

  private static List<JsonNode> all(String field) {
    List<JsonNode> out = new ArrayList<>();
    FILE.path(field).forEach(out::add);
    if (out.isEmpty()) {
      throw new IllegalStateException("sealing.json has no " + field);
    }
    return out;
  }

  private static Map<String, List<String>> headers(JsonNode v) {
    Map<String, List<String>> headers = new LinkedHashMap<>();
    for (Map.Entry<String, JsonNode> e : v.path("headers").properties()) {
      List<String> values = new ArrayList<>();
      e.getValue().forEach(x -> values.add(x.asText()));
      headers.put(e.getKey(), values);
    }
    return headers;
  }

  /** A random source that hands out exactly the given bytes, once. */
  private static Consumer<byte[]> fixed(byte[] random) {
    boolean[] used = {false};
    return out -> {
      assertFalse(used[0], "the seal drew its random bytes twice");
      assertEquals(random.length, out.length, "the seal draws salt and nonce, 28 bytes");
      System.arraycopy(random, 0, out, 0, out.length);
      used[0] = true;
    };
  }

  private static byte[] head(int version, String keyId) {
    byte[] id = keyId.getBytes(StandardCharsets.US_ASCII);
    byte[] head = new byte[3 + id.length];
    head[0] = (byte) 0xC1;
    head[1] = (byte) version;
    head[2] = (byte) id.length;
    System.arraycopy(id, 0, head, 3, id.length);
    return head;
  }

  private static io.idemd.api.model.StoredResponse sealedWire(int status, byte[] envelope) {
    return new io.idemd.api.model.StoredResponse().status(status).sealed(envelope);
  }

  private static io.idemd.api.model.RecoveryPoint pointWire(String name, byte[] data) {
    return new io.idemd.api.model.RecoveryPoint().name(name).data(data).attempt(1L);
  }

  /**
   * Opens a result vector's envelope as the result of a record of the given state, and checks it is
   * the vector's response, or none for a failure sealed without one.
   */
  private static void opensAs(Sealing opener, JsonNode v, String state, byte[] envelope) {
    int status = v.path("status").asInt();
    Optional<StoredResponse> opened =
        opener.fromWire(v.path("key").asText(), state, sealedWire(status, envelope));
    if (v.path("no_response").asBoolean()) {
      assertEquals(Optional.empty(), opened, "a failure sealed without a response");
      return;
    }
    StoredResponse r = opened.orElseThrow();
    assertEquals(status, r.status());
    assertEquals(headers(v), r.headers());
    assertArrayEquals(bytes(v.path("body_base64")), r.body());
  }

  @TestFactory
  Stream<DynamicTest> theVectorsSealByteForByteAndOpenWithTheWholeRing() {
    KeyRing whole = KeyRing.of(fileKeys());
    return all("vectors").stream()
        .map(
            v ->
                DynamicTest.dynamicTest(
                    "version " + v.path("version").asInt() + ", " + v.path("name").asText(),
                    () -> {
                      int version = v.path("version").asInt();
                      String tenant = v.path("tenant").asText();
                      String key = v.path("key").asText();
                      String keyId = v.path("key_id").asText();
                      byte[] random = bytes(v.path("random_base64"));
                      Sealing sealer =
                          new Sealing(tenant, sealingWith(keyId), false, fixed(random));
                      Sealing opener = new Sealing(tenant, whole, false);
                      byte[] wantSealed = bytes(v.path("sealed_base64"));
                      assertEquals(version, wantSealed[1], "the envelope's version");
                      // Clients write version 2 only; the vectors of version 1 are opened.
                      boolean current = version == KeyRing.VERSION;
                      if (v.path("kind").asText().equals("response")) {
                        int status = v.path("status").asInt();
                        boolean failed = v.path("outcome").asText().equals("failed");
                        boolean none = v.path("no_response").asBoolean();
                        Map<String, List<String>> headers = headers(v);
                        byte[] body = none ? new byte[0] : bytes(v.path("body_base64"));
                        assertArrayEquals(
                            bytes(v.path("plaintext_base64")),
                            none ? new byte[0] : KeyRing.responsePlaintext(headers, body),
                            "plaintext");
                        assertArrayEquals(
                            bytes(v.path("aad_base64")),
                            KeyRing.Context.result(tenant, key, failed, status)
                                .aad(head(version, keyId)),
                            "aad");
                        if (current) {
                          io.idemd.api.model.StoredResponse wire =
                              none
                                  ? sealer.noResponse(key)
                                  : sealer.toWire(
                                      key, failed, new StoredResponse(status, headers, body));
                          assertEquals(status, wire.getStatus());
                          assertEquals(null, wire.getHeaders(), "headers beside the envelope");
                          assertEquals(null, wire.getBody(), "a body beside the envelope");
                          assertArrayEquals(wantSealed, wire.getSealed(), "sealed");
                          opensAs(opener, v, failed ? "failed" : "completed", wantSealed);
                        } else {
                          // Version 1 does not bind the outcome: it opens as either.
                          opensAs(opener, v, "completed", wantSealed);
                          opensAs(opener, v, "failed", wantSealed);
                        }
                      } else {
                        String point = v.path("point").asText();
                        byte[] data = bytes(v.path("data_base64"));
                        assertArrayEquals(
                            bytes(v.path("plaintext_base64")), data, "a point's plaintext");
                        assertArrayEquals(
                            bytes(v.path("aad_base64")),
                            KeyRing.Context.point(tenant, key, point).aad(head(version, keyId)),
                            "aad");
                        if (current) {
                          assertArrayEquals(
                              wantSealed, sealer.sealPoint(key, point, data), "sealed");
                        }
                        RecoveryPoint opened = opener.openPoint(key, pointWire(point, wantSealed));
                        assertEquals(point, opened.name());
                        assertArrayEquals(data, opened.data());
                      }
                    }));
  }

  @TestFactory
  Stream<DynamicTest> theRingTextsReadAsEveryClientReadsThem() {
    return all("ring_texts").stream()
        .map(
            v ->
                DynamicTest.dynamicTest(
                    v.path("name").asText(),
                    () -> {
                      String text = v.path("text").asText();
                      if (v.path("error").asBoolean()) {
                        assertThrows(IllegalArgumentException.class, () -> KeyRing.parse(text));
                        return;
                      }
                      List<String> ids = new ArrayList<>();
                      v.path("key_ids").forEach(id -> ids.add(id.asText()));
                      KeyRing ring = KeyRing.parse(text);
                      assertEquals(ids, ring.keyIds());
                      assertEquals(ids.get(0), ring.sealingKeyId());
                    }));
  }

  @TestFactory
  Stream<DynamicTest> theRefusalsFailWithTheirReasonAndKeyId() {
    return all("refusals").stream()
        .map(
            v ->
                DynamicTest.dynamicTest(
                    v.path("name").asText(),
                    () -> {
                      Sealing o =
                          new Sealing(v.path("tenant").asText(), KeyRing.of(fileKeys()), false);
                      String key = v.path("key").asText();
                      byte[] envelope = bytes(v.path("sealed_base64"));
                      UnsealableException e =
                          assertThrows(
                              UnsealableException.class,
                              () -> {
                                if (v.path("kind").asText().equals("response")) {
                                  o.fromWire(
                                      key,
                                      v.path("outcome").asText("completed"),
                                      sealedWire(v.path("status").asInt(), envelope));
                                } else {
                                  o.openPoint(key, pointWire(v.path("point").asText(), envelope));
                                }
                              });
                      assertEquals(v.path("error").asText(), e.reason().label());
                      assertEquals(v.path("key_id").asText(""), e.keyId());
                      assertTrue(e instanceof IdemException);
                    }));
  }

  private static final String K1 = Base64.getEncoder().encodeToString(filled(1));
  private static final String K2 = Base64.getEncoder().encodeToString(filled(2));

  private static byte[] filled(int b) {
    byte[] key = new byte[32];
    Arrays.fill(key, (byte) b);
    return key;
  }

  @Test
  void theTextFormTakesCommasNewlinesAndComments() {
    KeyRing ring =
        KeyRing.parse(
            "# the ring of payments\n"
                + "  new-2026="
                + K1
                + " , old.1="
                + K2
                + "\r\n"
                + "\n"
                + "# old_0 stays while its results are retained\n"
                + "old_0="
                + K1
                + "\n");
    assertEquals(List.of("new-2026", "old.1", "old_0"), ring.keyIds());
    assertEquals("new-2026", ring.sealingKeyId());
    // The key bytes stay out of the text forms.
    assertEquals("KeyRing[new-2026, old.1, old_0]", ring.toString());
    assertEquals("SealKey[id=k]", new SealKey("k", filled(1)).toString());
    assertEquals(new SealKey("k", filled(1)), new SealKey("k", filled(1)));
  }

  @Test
  void aRingThatCannotBeIsRefusedNamingTheEntry() {
    String[][] cases = {
      {"", "at least one key"},
      {"# only a comment\n", "at least one key"},
      {"k1=" + K1 + ",k2", "entry 1 is not id=base64"},
      {"k1=not base64!", "not standard base64"},
      {"short=" + Base64.getEncoder().encodeToString(new byte[31]), "is 31 bytes"},
      {"x".repeat(33) + "=" + K1, "1 to 32"},
      {"=" + K1, "1 to 32"},
      {"k é=" + K1, "only letters, digits"},
      {"k1=" + K1 + "\nk1=" + K2, "\"k1\" is in the ring twice"},
    };
    for (String[] c : cases) {
      IllegalArgumentException e =
          assertThrows(IllegalArgumentException.class, () -> KeyRing.parse(c[0]), c[0]);
      assertTrue(e.getMessage().contains(c[1]), c[0] + ": " + e.getMessage());
      assertFalse(e.getMessage().contains(K1), "the message shows a key");
    }
    assertThrows(IllegalArgumentException.class, () -> KeyRing.of());
    assertThrows(IllegalArgumentException.class, () -> KeyRing.of(new SealKey("k", new byte[33])));
  }

  @Test
  void eachSealDrawsItsOwnSaltAndNonce() {
    Sealing s = new Sealing("t", KeyRing.parse("k=" + K1), false);
    StoredResponse r = StoredResponse.of(200, "text/plain", "same");
    byte[] a = s.toWire("key", false, r).getSealed();
    byte[] b = s.toWire("key", false, r).getSealed();
    assertFalse(Arrays.equals(a, b), "two envelopes of one result are equal");
    assertEquals(
        "same", s.fromWire("key", "completed", sealedWire(200, a)).orElseThrow().bodyText());
    assertEquals(
        "same", s.fromWire("key", "completed", sealedWire(200, b)).orElseThrow().bodyText());
    // The head (3 bytes and the key id), salt (16), nonce (12) and tag (16) over the plaintext.
    assertEquals(KeyRing.responsePlaintext(r.headers(), r.body()).length + 47 + 1, a.length);
  }

  @Test
  void aClientWithoutARingRefusesASealedResultAndHandsEveryPointOnAsItIs() {
    Sealing ring = new Sealing("t", KeyRing.parse("k-2026=" + K1), false);
    byte[] envelope =
        ring.toWire("key", false, StoredResponse.of(201, "text/plain", "x")).getSealed();
    UnsealableException e =
        assertThrows(
            UnsealableException.class,
            () -> Sealing.NONE.fromWire("key", "completed", sealedWire(201, envelope)));
    assertEquals(UnsealableException.Reason.UNKNOWN_KEY, e.reason());
    assertEquals("k-2026", e.keyId());
    assertTrue(e.getMessage().contains("k-2026"), e.getMessage());

    // A recovery point has no mark of its own: whatever its first byte, a client without a
    // ring hands its data on as it is, an envelope's whole head included.
    byte[] point = ring.sealPoint("key", "charged", "ch_1".getBytes(StandardCharsets.UTF_8));
    RecoveryPoint passed = Sealing.NONE.openPoint("key", pointWire("charged", point));
    assertEquals("charged", passed.name());
    assertArrayEquals(point, passed.data());

    // Plain passes through, results and points; so does binary data that only starts
    // with the envelope's first byte.
    StoredResponse plain =
        Sealing.NONE
            .fromWire(
                "key",
                "completed",
                new io.idemd.api.model.StoredResponse()
                    .status(200)
                    .headers(Map.of("content-type", List.of("text/plain")))
                    .body("plain".getBytes(StandardCharsets.UTF_8)))
            .orElseThrow();
    assertEquals("plain", plain.bodyText());
    assertEquals(List.of("text/plain"), plain.headers().get("content-type"));
    byte[] binary = {(byte) 0xC1, 7, 7};
    assertArrayEquals(binary, Sealing.NONE.openPoint("key", pointWire("p", binary)).data());
    // Without a ring, data is recorded as given, and empty data records none.
    assertArrayEquals(binary, Sealing.NONE.sealPoint("key", "p", binary));
    assertEquals(null, Sealing.NONE.sealPoint("key", "p", new byte[0]));
  }

  @Test
  void requireSealedRefusesPlainResultsAndPoints() {
    KeyRing ring = KeyRing.parse("k=" + K1);
    Sealing required = new Sealing("t", ring, true);
    UnsealableException e =
        assertThrows(
            UnsealableException.class,
            () ->
                required.fromWire(
                    "key",
                    "completed",
                    new io.idemd.api.model.StoredResponse()
                        .status(200)
                        .body("plain".getBytes(StandardCharsets.UTF_8))));
    assertEquals(UnsealableException.Reason.NOT_SEALED, e.reason());
    assertEquals("", e.keyId());
    e =
        assertThrows(
            UnsealableException.class,
            () ->
                required.openPoint(
                    "key", pointWire("p", "plain".getBytes(StandardCharsets.UTF_8))));
    assertEquals(UnsealableException.Reason.NOT_SEALED, e.reason());
    e =
        assertThrows(
            UnsealableException.class, () -> required.openPoint("key", pointWire("p", null)));
    assertEquals(UnsealableException.Reason.NOT_SEALED, e.reason());
    // An empty point is sealed, so that it opens under require sealed.
    byte[] empty = required.sealPoint("key", "p", null);
    assertEquals(0, required.openPoint("key", pointWire("p", empty)).data().length);
    // The same ring without the requirement passes plain through.
    assertEquals(
        "plain",
        new Sealing("t", ring, false)
            .fromWire(
                "key",
                "completed",
                new io.idemd.api.model.StoredResponse()
                    .status(200)
                    .body("plain".getBytes(StandardCharsets.UTF_8)))
            .orElseThrow()
            .bodyText());
  }

  @Test
  void aClientIsNotBuiltWithARequirementItCannotMeet() {
    IllegalStateException e =
        assertThrows(
            IllegalStateException.class,
            () -> IdemClient.builder("http://127.0.0.1:9").requireSealed(true).build());
    assertTrue(e.getMessage().contains("sealing"), e.getMessage());
    assertThrows(
        IllegalArgumentException.class,
        () -> IdemClient.builder("http://127.0.0.1:9").sealing("", KeyRing.parse("k=" + K1)));
  }
}
