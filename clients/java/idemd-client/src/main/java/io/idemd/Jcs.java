package io.idemd;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.StreamReadFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * RFC 8785 (JCS) canonicalisation of an I-JSON body (RFC 7493), as docs/middleware.md specifies it.
 * Jackson parses (strict UTF-8, RFC 8259 grammar, duplicate names, depth); the canonical form is
 * written here, numbers as ECMAScript writes them. No JCS library for Java is kept up today (the
 * one on Maven Central has had one release, in 2020), so this small one is pinned by the shared
 * vectors instead.
 */
final class Jcs {
  private static final int MAX_DEPTH = 128;
  private static final ObjectMapper STRICT =
      new ObjectMapper(
          JsonFactory.builder()
              .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION)
              .streamReadConstraints(
                  StreamReadConstraints.builder().maxNestingDepth(MAX_DEPTH).build())
              .build());

  private Jcs() {}

  /** The canonical form of body as UTF-8, or empty when body is not I-JSON. */
  static Optional<byte[]> canonicalIJson(byte[] body) {
    String text;
    try {
      CharBuffer chars =
          StandardCharsets.UTF_8
              .newDecoder()
              .onMalformedInput(CodingErrorAction.REPORT)
              .onUnmappableCharacter(CodingErrorAction.REPORT)
              .decode(ByteBuffer.wrap(body));
      text = chars.toString();
    } catch (CharacterCodingException e) {
      return Optional.empty();
    }
    if (text.startsWith("\uFEFF")) {
      return Optional.empty();
    }
    JsonNode value;
    try (JsonParser parser = STRICT.createParser(text)) {
      value = STRICT.readTree(parser);
      if (value == null || parser.nextToken() != null) {
        return Optional.empty();
      }
    } catch (IOException e) {
      return Optional.empty();
    }
    StringBuilder out = new StringBuilder(text.length());
    if (!write(value, out)) {
      return Optional.empty();
    }
    return Optional.of(out.toString().getBytes(StandardCharsets.UTF_8));
  }

  /**
   * Writes the canonical form of v; false when v holds a lone surrogate or a number beyond a
   * double.
   */
  private static boolean write(JsonNode v, StringBuilder out) {
    switch (v.getNodeType()) {
      case OBJECT -> {
        List<Map.Entry<String, JsonNode>> members = new ArrayList<>(v.properties());
        // UTF-16 code units, as RFC 8785 orders names: String.compareTo does exactly that.
        members.sort(Map.Entry.comparingByKey());
        out.append('{');
        for (int i = 0; i < members.size(); i++) {
          if (i > 0) {
            out.append(',');
          }
          if (!string(members.get(i).getKey(), out)) {
            return false;
          }
          out.append(':');
          if (!write(members.get(i).getValue(), out)) {
            return false;
          }
        }
        out.append('}');
        return true;
      }
      case ARRAY -> {
        out.append('[');
        for (int i = 0; i < v.size(); i++) {
          if (i > 0) {
            out.append(',');
          }
          if (!write(v.get(i), out)) {
            return false;
          }
        }
        out.append(']');
        return true;
      }
      case STRING -> {
        return string(v.textValue(), out);
      }
      case NUMBER -> {
        double d = v.isIntegralNumber() ? v.bigIntegerValue().doubleValue() : v.doubleValue();
        if (Double.isInfinite(d) || Double.isNaN(d)) {
          return false;
        }
        out.append(number(d));
        return true;
      }
      case BOOLEAN -> {
        out.append(v.booleanValue() ? "true" : "false");
        return true;
      }
      case NULL -> {
        out.append("null");
        return true;
      }
      default -> {
        return false;
      }
    }
  }

  private static boolean string(String s, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (Character.isHighSurrogate(c)) {
        if (i + 1 >= s.length() || !Character.isLowSurrogate(s.charAt(i + 1))) {
          return false;
        }
        out.append(c).append(s.charAt(++i));
        continue;
      }
      if (Character.isLowSurrogate(c)) {
        return false;
      }
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
    return true;
  }

  /**
   * A finite double as ECMAScript's Number.prototype.toString writes it (RFC 8785 section 3.2.2.3).
   */
  static String number(double d) {
    if (d == 0) {
      return "0";
    }
    if (d < 0) {
      return "-" + number(-d);
    }
    BigDecimal exact = new BigDecimal(d);
    BigDecimal shortest = null;
    // The fewest significant digits that read back as d; of the candidates with that many,
    // the one closest to d.
    for (int digits = 1; digits <= 17 && shortest == null; digits++) {
      for (RoundingMode mode :
          new RoundingMode[] {RoundingMode.HALF_EVEN, RoundingMode.FLOOR, RoundingMode.CEILING}) {
        BigDecimal candidate = exact.round(new MathContext(digits, mode));
        if (candidate.doubleValue() == d
            && (shortest == null
                || candidate.subtract(exact).abs().compareTo(shortest.subtract(exact).abs()) < 0)) {
          shortest = candidate;
        }
      }
    }
    BigDecimal v = shortest.stripTrailingZeros();
    String s = v.unscaledValue().toString();
    int k = s.length();
    int n = k - v.scale();
    StringBuilder out = new StringBuilder(24);
    if (k <= n && n <= 21) {
      out.append(s).append("0".repeat(n - k));
    } else if (0 < n && n <= 21) {
      out.append(s, 0, n).append('.').append(s, n, k);
    } else if (-6 < n && n <= 0) {
      out.append("0.").append("0".repeat(-n)).append(s);
    } else {
      int e = n - 1;
      out.append(s.charAt(0));
      if (k > 1) {
        out.append('.').append(s, 1, k);
      }
      out.append('e').append(e < 0 ? '-' : '+').append(Math.abs(e));
    }
    return out.toString();
  }
}
