package io.idemd;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Optional;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * The client's own decoders on mutated inputs (a seeded, bounded fuzz; the long run is
 * IDEMD_FUZZ_ITERATIONS=... mvn test -Dtest=DecodersTest): the header reader and the RFC 8785
 * canonicalisation never throw, a canonical form is its own canonical form, and every key that can
 * be quoted reads back as itself.
 */
class DecodersTest {
  private static final int ITERATIONS =
      Integer.parseInt(System.getenv().getOrDefault("IDEMD_FUZZ_ITERATIONS", "20000"));

  private static final String JSON_BYTES = "{}[]\",:\\0-e.";

  /** The bodies of the shared fingerprint vectors: the seeds of the mutations. */
  private static List<byte[]> seeds() throws Exception {
    JsonNode root =
        new ObjectMapper().readTree(Path.of("..", "..", "testdata", "fingerprint.json").toFile());
    List<byte[]> out = new ArrayList<>();
    for (JsonNode v : root.path("vectors")) {
      out.add(
          v.has("body_base64")
              ? Base64.getDecoder().decode(v.path("body_base64").asText())
              : v.path("body").asText().getBytes(StandardCharsets.UTF_8));
    }
    return out;
  }

  private static byte[] mutate(byte[] seed, Random r) {
    byte[] b = seed.clone();
    int edits = 1 + r.nextInt(4);
    for (int i = 0; i < edits && b.length > 0; i++) {
      int at = r.nextInt(b.length);
      switch (r.nextInt(4)) {
        case 0 -> b[at] = (byte) r.nextInt(256);
        case 1 -> b[at] = (byte) JSON_BYTES.charAt(r.nextInt(JSON_BYTES.length()));
        case 2 -> {
          byte[] shorter = new byte[b.length - 1];
          System.arraycopy(b, 0, shorter, 0, at);
          System.arraycopy(b, at + 1, shorter, at, b.length - at - 1);
          b = shorter;
        }
        default -> {
          byte[] longer = new byte[b.length + 1];
          System.arraycopy(b, 0, longer, 0, at);
          longer[at] = b[at];
          System.arraycopy(b, at, longer, at + 1, b.length - at);
          b = longer;
        }
      }
    }
    return b;
  }

  @Test
  void canonicalFormsAreStableAndNothingThrows() throws Exception {
    List<byte[]> seeds = seeds();
    Random r = new Random(20261125);
    int canonical = 0;
    for (int i = 0; i < ITERATIONS; i++) {
      byte[] body = mutate(seeds.get(r.nextInt(seeds.size())), r);
      Optional<byte[]> once = Jcs.canonicalIJson(body);
      if (once.isPresent()) {
        canonical++;
        Optional<byte[]> twice = Jcs.canonicalIJson(once.get());
        assertTrue(twice.isPresent(), () -> "the canonical form of a body is not I-JSON");
        assertArrayEquals(once.get(), twice.get());
      }
    }
    assertTrue(canonical > 0, "no mutation stayed I-JSON: the fuzz tests nothing");
  }

  @Test
  void everyQuotedKeyReadsBackAndNoHeaderThrows() {
    Random r = new Random(7);
    for (int i = 0; i < ITERATIONS; i++) {
      StringBuilder key = new StringBuilder();
      int n = 1 + r.nextInt(255);
      for (int j = 0; j < n; j++) {
        key.append((char) (0x20 + r.nextInt(0x7f - 0x20)));
      }
      String quoted = "\"" + key.toString().replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
      assertEquals(
          new Idempotency.HeaderKey.Key(key.toString()),
          Idempotency.parseIdempotencyKey(List.of(" \t" + quoted + " ")));

      StringBuilder junk = new StringBuilder();
      for (int j = r.nextInt(300); j > 0; j--) {
        junk.append((char) r.nextInt(256));
      }
      Idempotency.HeaderKey read = Idempotency.parseIdempotencyKey(List.of(junk.toString()));
      if (read instanceof Idempotency.HeaderKey.Key k) {
        assertTrue(k.key().length() >= 1 && k.key().length() <= 255, k.key());
        assertTrue(k.key().chars().allMatch(c -> c >= 0x20 && c <= 0x7e), k.key());
      }
    }
  }
}
