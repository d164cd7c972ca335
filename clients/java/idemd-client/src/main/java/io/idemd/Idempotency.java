package io.idemd;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.Optional;

/**
 * The algorithms docs/middleware.md fixes for every language, pinned by the vectors in
 * clients/testdata: the request fingerprint, the idemd key of a scope and a key, and the reading of
 * the Idempotency-Key header.
 */
public final class Idempotency {
  private Idempotency() {}

  /** What the fingerprint is computed from: the request as received. */
  public record FingerprintInput(
      String method,
      String path,
      String query,
      String contentType,
      String contentEncoding,
      byte[] body) {
    public FingerprintInput {
      query = query == null ? "" : query;
      body = body == null ? new byte[0] : body;
    }
  }

  /**
   * A fingerprint ("sha256:" and 64 lowercase hex digits), whether the body was canonicalised as
   * JSON (RFC 8785) rather than hashed as it is, and the bytes that entered the hash as the body
   * (for tests and for debugging a mismatch).
   */
  public record Fingerprint(String fingerprint, boolean canonicalJson, byte[] hashedBody) {}

  /** Computes the fingerprint the middleware claims with. */
  public static Fingerprint fingerprint(FingerprintInput in) {
    String media = mediaType(in.contentType());
    String encoding =
        in.contentEncoding() == null ? "" : in.contentEncoding().trim().toLowerCase(Locale.ROOT);
    boolean isJson =
        (media.equals("application/json") || media.endsWith("+json"))
            && (encoding.isEmpty() || encoding.equals("identity"))
            && in.body().length > 0;
    Optional<byte[]> canonical = isJson ? Jcs.canonicalIJson(in.body()) : Optional.empty();
    byte[] hashed = canonical.orElse(in.body());
    MessageDigest hash = Keys.sha256();
    for (String field : new String[] {in.method(), in.path(), in.query(), media}) {
      Keys.update(hash, field.getBytes(StandardCharsets.ISO_8859_1));
    }
    Keys.update(hash, hashed);
    return new Fingerprint(
        "sha256:" + HexFormat.of().formatHex(hash.digest()), canonical.isPresent(), hashed);
  }

  /**
   * The media type of a Content-Type: cut at ';', SP and HTAB trimmed, ASCII letters lowercased.
   */
  public static String mediaType(String contentType) {
    if (contentType == null) {
      return "";
    }
    int semi = contentType.indexOf(';');
    String head = trimSpHtab(semi < 0 ? contentType : contentType.substring(0, semi));
    StringBuilder out = new StringBuilder(head.length());
    for (int i = 0; i < head.length(); i++) {
      char c = head.charAt(i);
      out.append(c >= 'A' && c <= 'Z' ? (char) (c + 32) : c);
    }
    return out.toString();
  }

  /**
   * The key the middleware claims in idemd for a scope and an Idempotency-Key:
   * "idempotency-key:v1:" and the hex SHA-256 of both, each length-prefixed.
   */
  public static String idemdKey(String scope, String key) {
    MessageDigest hash = Keys.sha256();
    Keys.update(hash, scope.getBytes(StandardCharsets.UTF_8));
    Keys.update(hash, key.getBytes(StandardCharsets.ISO_8859_1));
    return "idempotency-key:v1:" + HexFormat.of().formatHex(hash.digest());
  }

  /** What the Idempotency-Key field lines of a request say: a key, none, or an error. */
  public sealed interface HeaderKey permits HeaderKey.Key, HeaderKey.Missing, HeaderKey.Invalid {
    record Key(String key) implements HeaderKey {}

    record Missing() implements HeaderKey {}

    record Invalid(String error) implements HeaderKey {}
  }

  /**
   * Reads the Idempotency-Key field lines (each character one byte) as docs/middleware.md says: one
   * line, an sf-string or a bare token, 1 to 255 bytes.
   */
  public static HeaderKey parseIdempotencyKey(List<String> fieldLines) {
    if (fieldLines.isEmpty()) {
      return new HeaderKey.Missing();
    }
    if (fieldLines.size() > 1) {
      return new HeaderKey.Invalid("more than one Idempotency-Key field line");
    }
    String value = trimSpHtab(fieldLines.get(0));
    if (value.isEmpty()) {
      return new HeaderKey.Invalid("the Idempotency-Key is empty");
    }
    String key;
    if (value.charAt(0) == '"') {
      StringBuilder out = new StringBuilder();
      int i = 1;
      for (; i < value.length(); i++) {
        char c = value.charAt(i);
        if (c == '"') {
          break;
        }
        if (c == '\\') {
          char next = i + 1 < value.length() ? value.charAt(i + 1) : 0;
          if (next != '"' && next != '\\') {
            return new HeaderKey.Invalid("a backslash in the key escapes only \" or \\");
          }
          out.append(next);
          i++;
          continue;
        }
        if (c < 0x20 || c > 0x7e) {
          return new HeaderKey.Invalid("the key holds a character outside 0x20-0x7E");
        }
        out.append(c);
      }
      if (i >= value.length()) {
        return new HeaderKey.Invalid("the key's closing quote is missing");
      }
      if (i != value.length() - 1) {
        return new HeaderKey.Invalid("nothing may follow the key's closing quote (no parameters)");
      }
      key = out.toString();
    } else {
      for (int i = 0; i < value.length(); i++) {
        if (!bareKeyChar(value.charAt(i))) {
          return new HeaderKey.Invalid("an unquoted key holds only token characters; quote it");
        }
      }
      key = value;
    }
    if (key.isEmpty() || key.length() > 255) {
      return new HeaderKey.Invalid("the key must be 1 to 255 bytes");
    }
    return new HeaderKey.Key(key);
  }

  /** s without its leading and trailing SP and HTAB (String.strip would cut more). */
  private static String trimSpHtab(String s) {
    int start = 0;
    int end = s.length();
    while (start < end && (s.charAt(start) == ' ' || s.charAt(start) == '\t')) {
      start++;
    }
    while (end > start && (s.charAt(end - 1) == ' ' || s.charAt(end - 1) == '\t')) {
      end--;
    }
    return s.substring(start, end);
  }

  // RFC 9110 tchar, plus ':' and '/' as RFC 8941 tokens allow.
  private static boolean bareKeyChar(char c) {
    return (c >= '0' && c <= '9')
        || (c >= 'A' && c <= 'Z')
        || (c >= 'a' && c <= 'z')
        || "!#$%&'*+-.^_`|~:/".indexOf(c) >= 0;
  }
}
