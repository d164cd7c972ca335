package io.idemd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** The shared vectors of clients/testdata, which every idemd client reproduces exactly. */
class VectorsTest {
  private static final Path TESTDATA = Path.of("..", "..", "testdata");

  private static List<JsonNode> vectors(String file) throws IOException {
    JsonNode root = new ObjectMapper().readTree(TESTDATA.resolve(file).toFile());
    List<JsonNode> out = new ArrayList<>();
    root.path("vectors").forEach(out::add);
    if (out.isEmpty()) {
      throw new IllegalStateException(file + " has no vectors");
    }
    return out;
  }

  private static byte[] bytes(JsonNode v, String field) {
    if (v.has(field + "_base64")) {
      return Base64.getDecoder().decode(v.path(field + "_base64").asText());
    }
    return v.path(field).asText().getBytes(StandardCharsets.UTF_8);
  }

  private static String text(JsonNode v, String field) {
    return v.has(field) ? v.path(field).asText() : null;
  }

  @TestFactory
  Stream<DynamicTest> fingerprints() throws IOException {
    return vectors("fingerprint.json").stream()
        .map(
            v ->
                DynamicTest.dynamicTest(
                    v.path("name").asText(),
                    () -> {
                      Idempotency.Fingerprint f =
                          Idempotency.fingerprint(
                              new Idempotency.FingerprintInput(
                                  v.path("method").asText(),
                                  v.path("path").asText(),
                                  v.path("query").asText(),
                                  text(v, "content_type"),
                                  text(v, "content_encoding"),
                                  bytes(v, "body")));
                      assertEquals(
                          v.path("canonical_json").asBoolean(),
                          f.canonicalJson(),
                          "canonical_json");
                      assertEquals(
                          new String(bytes(v, "hashed_body"), StandardCharsets.UTF_8),
                          new String(f.hashedBody(), StandardCharsets.UTF_8),
                          "hashed_body");
                      assertArrayEquals(bytes(v, "hashed_body"), f.hashedBody(), "hashed_body");
                      assertEquals(v.path("fingerprint").asText(), f.fingerprint());
                    }));
  }

  @TestFactory
  Stream<DynamicTest> idemdKeys() throws IOException {
    return vectors("idemd_key.json").stream()
        .map(
            v ->
                DynamicTest.dynamicTest(
                    v.path("name").asText(),
                    () ->
                        assertEquals(
                            v.path("idemd_key").asText(),
                            Idempotency.idemdKey(
                                v.path("scope").asText(), v.path("key").asText()))));
  }

  @TestFactory
  Stream<DynamicTest> headers() throws IOException {
    return vectors("idempotency_key_header.json").stream()
        .map(
            v ->
                DynamicTest.dynamicTest(
                    v.path("name").asText(),
                    () -> {
                      List<String> lines = new ArrayList<>();
                      v.path("field_lines").forEach(l -> lines.add(l.asText()));
                      Idempotency.HeaderKey got = Idempotency.parseIdempotencyKey(lines);
                      if (v.has("key")) {
                        assertEquals(new Idempotency.HeaderKey.Key(v.path("key").asText()), got);
                      } else if (v.has("missing")) {
                        assertInstanceOf(Idempotency.HeaderKey.Missing.class, got);
                      } else {
                        assertInstanceOf(Idempotency.HeaderKey.Invalid.class, got);
                      }
                    }));
  }

  @Test
  void theStepKeyIsTheSameInEveryLanguage() {
    assertEquals(
        "msg-828aedf1c68eb588f35320345076e88dc90193e8a33ddf7b632f66ea0d1e46e8",
        Keys.stepKey("req-1", "charge"));
    assertEquals("idemd-key", Keys.MESSAGE_HEADER);
  }

  @Test
  void numbersAreWrittenAsEcmaScriptWritesThem() {
    String[][] cases = {
      {"1", "1"},
      {"1.0", "1"},
      {"10e-1", "1"},
      {"-0", "0"},
      {"1e21", "1e+21"},
      {"1e20", "100000000000000000000"},
      {"0.000001", "0.000001"},
      {"1e-7", "1e-7"},
      {"123.456", "123.456"},
      {"5e-324", "5e-324"},
      {"1.7976931348623157e308", "1.7976931348623157e+308"},
      {"9007199254740993", "9007199254740992"},
      {"0.1", "0.1"},
      {"333333333.33333329", "333333333.3333333"},
      {"1e23", "1e+23"},
      {"2e-3", "0.002"},
      {"4.35", "4.35"},
      {"-1.5e-9", "-1.5e-9"},
    };
    for (String[] c : cases) {
      assertEquals(c[1], Jcs.number(Double.parseDouble(c[0])), c[0]);
    }
  }
}
