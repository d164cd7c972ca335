package io.idemd;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.function.Consumer;
import javax.crypto.AEADBadTagException;
import javax.crypto.Cipher;
import javax.crypto.Mac;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;

/**
 * The keys that seal a client's results and recovery points and open them again (docs/sealing.md):
 * the first key seals, every key opens what it sealed. Rotating is making a ring whose first key is
 * new and keeping the old ones in it for as long as results sealed with them are retained. Give it
 * to a client with {@link IdemClient.Builder#sealing}.
 *
 * <pre>{@code
 * KeyRing ring = KeyRing.parse(System.getenv("IDEMD_SEAL_KEYS"));
 * IdemClient client = IdemClient.builder(url).sealing("payments", ring).build();
 * }</pre>
 *
 * <p>An envelope is {@code 0xC1 | version 2 | len(key id) | key id | salt (16) | nonce (12) |
 * ciphertext | tag (16)}, sealed with AES-256-GCM under a key derived for the one message,
 * HKDF-SHA256(ring key, salt, "idemd seal v1"), so that random nonces never meet the 2^32-messages
 * limit of GCM under one key. The associated data binds the envelope's head, what it seals (a
 * completed result, a failed one, or a recovery point), the tenant, the idemd key and a result's
 * status or a recovery point's name: an envelope moved to another key, tenant, status, outcome or
 * point does not open. Version 1, which clients wrote before, still opens; it does not bind a
 * result's outcome, so a failed result's envelope opens as a completed one and back. A KeyRing is
 * immutable and thread-safe.
 */
public final class KeyRing {
  static final int MARKER = 0xC1;
  static final int VERSION = 2;
  static final int VERSION_1 = 1;

  /**
   * The status under which a failure without a response is stored sealed: a failed result whose
   * envelope holds nothing, not even the count of header names every response's plaintext starts
   * with.
   */
  static final int NO_RESPONSE_STATUS = 500;

  private static final int SALT_BYTES = 16;
  private static final int NONCE_BYTES = 12;
  private static final int TAG_BYTES = 16;
  private static final int KEY_BYTES = 32;
  private static final int MAX_KEY_ID = 32;
  static final int RANDOM_BYTES = SALT_BYTES + NONCE_BYTES;
  private static final byte[] INFO = "idemd seal v1".getBytes(StandardCharsets.US_ASCII);

  private final String sealingKeyId;
  // In the order given; the key bytes never leave the ring.
  private final Map<String, byte[]> keys;

  private KeyRing(List<SealKey> given) {
    if (given.isEmpty()) {
      throw new IllegalArgumentException("idem: a key ring needs at least one key");
    }
    Map<String, byte[]> byId = new LinkedHashMap<>();
    for (int i = 0; i < given.size(); i++) {
      SealKey k = Objects.requireNonNull(given.get(i), "key ring entry " + i);
      String invalid = invalidKeyId(k.id());
      if (invalid != null) {
        throw new IllegalArgumentException("idem: key ring entry " + i + ": " + invalid);
      }
      byte[] key = k.key();
      if (key.length != KEY_BYTES) {
        throw new IllegalArgumentException(
            "idem: key \""
                + k.id()
                + "\" is "
                + key.length
                + " bytes; a sealing key is "
                + KEY_BYTES
                + " random bytes");
      }
      if (byId.put(k.id(), key) != null) {
        throw new IllegalArgumentException("idem: key id \"" + k.id() + "\" is in the ring twice");
      }
    }
    this.sealingKeyId = given.get(0).id();
    this.keys = Collections.unmodifiableMap(byId);
  }

  /**
   * A ring of keys, the first of which seals; throws an IllegalArgumentException when there are
   * none, an id is not 1 to 32 letters, digits, '.', '_' or '-', a key is not 32 bytes, or an id
   * comes twice.
   */
  public static KeyRing of(SealKey... keys) {
    return new KeyRing(List.of(keys));
  }

  /** A ring of keys, the first of which seals; see {@link #of(SealKey...)}. */
  public static KeyRing of(List<SealKey> keys) {
    return new KeyRing(List.copyOf(keys));
  }

  /**
   * Reads a ring from its text form, as the IDEMD_SEAL_KEYS variable and key files hold it
   * (docs/sealing.md): entries {@code id=base64 of 32 bytes} separated by commas or line feeds, the
   * first of which seals. Spaces, tabs and carriage returns around lines, entries, ids and keys are
   * skipped, and so are blank lines and lines starting with '#'. A key is standard base64 with its
   * padding and zero pad bits. Throws an IllegalArgumentException naming the entry at fault.
   */
  public static KeyRing parse(String text) {
    Objects.requireNonNull(text, "text");
    List<SealKey> keys = new ArrayList<>();
    for (String rawLine : text.split("\n", -1)) {
      String line = trimRingSpace(rawLine);
      if (line.isEmpty() || line.startsWith("#")) {
        continue;
      }
      for (String rawEntry : line.split(",", -1)) {
        String entry = trimRingSpace(rawEntry);
        if (entry.isEmpty()) {
          continue;
        }
        int eq = entry.indexOf('=');
        if (eq < 0) {
          throw new IllegalArgumentException(
              "idem: key ring entry " + keys.size() + " is not id=base64");
        }
        String id = trimRingSpace(entry.substring(0, eq));
        String b64 = trimRingSpace(entry.substring(eq + 1));
        byte[] key;
        try {
          key = Base64.getDecoder().decode(b64);
        } catch (IllegalArgumentException e) {
          throw new IllegalArgumentException(
              "idem: key \"" + id + "\": not standard base64: " + e.getMessage(), e);
        }
        // The decoder takes base64 without its padding, or with pad bits set; no other client
        // does.
        if (!Base64.getEncoder().encodeToString(key).equals(b64)) {
          throw new IllegalArgumentException(
              "idem: key \"" + id + "\": not standard base64 with its padding and zero pad bits");
        }
        keys.add(new SealKey(id, key));
      }
    }
    return new KeyRing(keys);
  }

  /**
   * Trims what the ring's text form counts as space: ASCII spaces, tabs and carriage returns, so
   * that every client reads a ring alike.
   */
  private static String trimRingSpace(String s) {
    int start = 0;
    int end = s.length();
    while (start < end && isRingSpace(s.charAt(start))) {
      start++;
    }
    while (end > start && isRingSpace(s.charAt(end - 1))) {
      end--;
    }
    return s.substring(start, end);
  }

  private static boolean isRingSpace(char c) {
    return c == ' ' || c == '\t' || c == '\r';
  }

  /** The id of the key that seals: the first. */
  public String sealingKeyId() {
    return sealingKeyId;
  }

  /** The ids of the ring's keys, in order, the sealing key first. */
  public List<String> keyIds() {
    return List.copyOf(keys.keySet());
  }

  /** The ids only: the keys are secrets, and stay out of logs. */
  @Override
  public String toString() {
    return "KeyRing" + keys.keySet();
  }

  /** Why id cannot name a key, or null when it can. */
  private static String invalidKeyId(String id) {
    if (id.isEmpty() || id.length() > MAX_KEY_ID) {
      return "key id \"" + id + "\": 1 to " + MAX_KEY_ID + " characters";
    }
    for (int i = 0; i < id.length(); i++) {
      char c = id.charAt(i);
      if (!((c >= 'a' && c <= 'z')
          || (c >= 'A' && c <= 'Z')
          || (c >= '0' && c <= '9')
          || c == '.'
          || c == '_'
          || c == '-')) {
        return "key id \"" + id + "\": only letters, digits, '.', '_' and '-'";
      }
    }
    return null;
  }

  /**
   * What an envelope is bound to besides its head: what it seals ('C' a completed result, 'F' a
   * failed one, 'P' a recovery point), the tenant, the idemd key, and a result's status or a
   * recovery point's name (point null for a result).
   */
  record Context(char kind, String tenant, String key, int status, String point) {
    static Context result(String tenant, String key, boolean failed, int status) {
      return new Context(failed ? 'F' : 'C', tenant, key, status, null);
    }

    static Context point(String tenant, String key, String name) {
      return new Context('P', tenant, key, 0, name);
    }

    /**
     * The associated data of an envelope with this head; its version says how a result's outcome is
     * bound (version 1 does not bind it).
     */
    byte[] aad(byte[] head) {
      ByteArrayOutputStream b = new ByteArrayOutputStream();
      b.writeBytes(head);
      b.write(head[1] == VERSION_1 && point == null ? 'R' : kind);
      writeString16(b, tenant);
      writeString16(b, key);
      if (point == null) {
        writeU16(b, status);
      } else {
        writeString16(b, point);
      }
      return b.toByteArray();
    }
  }

  /**
   * Seals plaintext with the sealing key under ctx; random fills the 28 bytes of salt and nonce (a
   * SecureRandom's nextBytes outside the shared vectors' tests).
   */
  byte[] seal(Context ctx, byte[] plaintext, Consumer<byte[]> random) {
    return seal(VERSION, ctx, plaintext, random);
  }

  /** {@link #seal} in the given version; only the shared vectors' tests write version 1. */
  byte[] seal(int version, Context ctx, byte[] plaintext, Consumer<byte[]> random) {
    return seal(version, ctx, plaintext, ByteBuffer.allocate(0), random);
  }

  /**
   * Seals head followed by body's remaining bytes, as {@link #seal} seals the two together, but
   * encrypts both straight into the envelope: a large result's body is read where it is, never
   * copied into a plaintext first. body's position is left as it was.
   */
  byte[] seal(Context ctx, byte[] head, ByteBuffer body, Consumer<byte[]> random) {
    return seal(VERSION, ctx, head, body, random);
  }

  private byte[] seal(
      int version, Context ctx, byte[] plainHead, ByteBuffer body, Consumer<byte[]> random) {
    byte[] id = sealingKeyId.getBytes(StandardCharsets.US_ASCII);
    int head = 3 + id.length;
    byte[] drawn = new byte[RANDOM_BYTES];
    random.accept(drawn);
    byte[] salt = Arrays.copyOfRange(drawn, 0, SALT_BYTES);
    byte[] nonce = Arrays.copyOfRange(drawn, SALT_BYTES, RANDOM_BYTES);
    int sealedBytes = Math.addExact(Math.addExact(plainHead.length, body.remaining()), TAG_BYTES);
    byte[] env = new byte[Math.addExact(head + RANDOM_BYTES, sealedBytes)];
    ByteBuffer.wrap(env)
        .put((byte) MARKER)
        .put((byte) version)
        .put((byte) id.length)
        .put(id)
        .put(drawn);
    try {
      Cipher gcm = cipher(Cipher.ENCRYPT_MODE, keys.get(sealingKeyId), salt, nonce);
      gcm.updateAAD(ctx.aad(Arrays.copyOf(env, head)));
      ByteBuffer out = ByteBuffer.wrap(env, head + RANDOM_BYTES, sealedBytes);
      gcm.update(ByteBuffer.wrap(plainHead), out);
      gcm.doFinal(body.duplicate(), out);
      if (out.hasRemaining()) {
        throw new IllegalStateException("idem: AES-256-GCM sealed fewer bytes than it takes");
      }
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("idem: AES-256-GCM is not available to seal with", e);
    }
    return env;
  }

  /**
   * Opens an envelope sealed under ctx with any key of the ring; an UnsealableException when it is
   * not an envelope, names a key the ring does not hold, or does not open.
   */
  byte[] open(Context ctx, byte[] env) {
    String id = keyIdOf(env);
    byte[] key = keys.get(id);
    if (key == null) {
      throw new UnsealableException(UnsealableException.Reason.UNKNOWN_KEY, id);
    }
    int head = 3 + id.length();
    byte[] salt = Arrays.copyOfRange(env, head, head + SALT_BYTES);
    byte[] nonce = Arrays.copyOfRange(env, head + SALT_BYTES, head + RANDOM_BYTES);
    try {
      Cipher gcm = cipher(Cipher.DECRYPT_MODE, key, salt, nonce);
      gcm.updateAAD(ctx.aad(Arrays.copyOf(env, head)));
      return gcm.doFinal(env, head + RANDOM_BYTES, env.length - head - RANDOM_BYTES);
    } catch (AEADBadTagException e) {
      throw new UnsealableException(UnsealableException.Reason.INVALID, id);
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("idem: AES-256-GCM is not available to open with", e);
    }
  }

  /**
   * The key id an envelope names, once its head and length are those of an envelope; an
   * UnsealableException (invalid) otherwise. A client without a ring reads it to say which key a
   * result it cannot open was sealed with.
   */
  static String keyIdOf(byte[] env) {
    if (env.length < 3 || (env[0] & 0xFF) != MARKER || (env[1] != VERSION && env[1] != VERSION_1)) {
      throw new UnsealableException(UnsealableException.Reason.INVALID, "");
    }
    int n = env[2] & 0xFF;
    if (n == 0 || env.length < 3 + n + RANDOM_BYTES + TAG_BYTES) {
      throw new UnsealableException(UnsealableException.Reason.INVALID, "");
    }
    return new String(env, 3, n, StandardCharsets.ISO_8859_1);
  }

  /** AES-256-GCM under the key HKDF-SHA256 derives from key and salt for one message. */
  private static Cipher cipher(int mode, byte[] key, byte[] salt, byte[] nonce)
      throws GeneralSecurityException {
    Cipher gcm = Cipher.getInstance("AES/GCM/NoPadding");
    gcm.init(
        mode,
        new SecretKeySpec(hkdf(key, salt), "AES"),
        new GCMParameterSpec(8 * TAG_BYTES, nonce));
    return gcm;
  }

  /**
   * HKDF-SHA256 (RFC 5869) of ikm and salt with the envelope's info, 32 bytes: the extract, then
   * the first block of the expand, which is all 32 bytes need.
   */
  static byte[] hkdf(byte[] ikm, byte[] salt) throws GeneralSecurityException {
    Mac hmac = Mac.getInstance("HmacSHA256");
    hmac.init(new SecretKeySpec(salt, "HmacSHA256"));
    byte[] prk = hmac.doFinal(ikm);
    hmac.init(new SecretKeySpec(prk, "HmacSHA256"));
    hmac.update(INFO);
    hmac.update((byte) 1);
    return hmac.doFinal();
  }

  /**
   * What a result's envelope holds: its headers, names in byte order and each name's values in
   * order, then its body: {@code u16 names | per name: u16 len, name, u16 values, per value: u32
   * len, value | body}.
   */
  static byte[] responsePlaintext(Map<String, List<String>> headers, byte[] body) {
    byte[] head = responseHead(headers);
    byte[] plain = Arrays.copyOf(head, head.length + body.length);
    System.arraycopy(body, 0, plain, head.length, body.length);
    return plain;
  }

  /** The part of a result's plaintext ({@link #responsePlaintext}) before its body. */
  static byte[] responseHead(Map<String, List<String>> headers) {
    // Byte order of the names' UTF-8, as every client sorts them.
    TreeMap<byte[], List<String>> names = new TreeMap<>(Arrays::compareUnsigned);
    headers.forEach((name, values) -> names.put(name.getBytes(StandardCharsets.UTF_8), values));
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    writeU16(b, checkU16(names.size(), "header names"));
    names.forEach(
        (name, values) -> {
          writeU16(b, checkU16(name.length, "bytes of a header name"));
          b.writeBytes(name);
          writeU16(b, checkU16(values.size(), "values of a header"));
          for (String v : values) {
            byte[] value = v.getBytes(StandardCharsets.UTF_8);
            b.writeBytes(ByteBuffer.allocate(4).putInt(value.length).array());
            b.writeBytes(value);
          }
        });
    return b.toByteArray();
  }

  /** A result's headers and body, read back from its plaintext. */
  record Opened(Map<String, List<String>> headers, byte[] body) {}

  /** Reads a result's plaintext; null when it is not laid out as {@link #responsePlaintext}. */
  static Opened parseResponsePlaintext(byte[] plain) {
    ByteBuffer r = ByteBuffer.wrap(plain);
    if (r.remaining() < 2) {
      return null;
    }
    int names = Short.toUnsignedInt(r.getShort());
    Map<String, List<String>> headers = new LinkedHashMap<>();
    for (int i = 0; i < names; i++) {
      String name = readString(r, 2);
      if (name == null || r.remaining() < 2) {
        return null;
      }
      int count = Short.toUnsignedInt(r.getShort());
      List<String> values = new ArrayList<>(Math.min(count, r.remaining() / 4 + 1));
      for (int j = 0; j < count; j++) {
        String v = readString(r, 4);
        if (v == null) {
          return null;
        }
        values.add(v);
      }
      headers.put(name, List.copyOf(values));
    }
    byte[] body = new byte[r.remaining()];
    r.get(body);
    return new Opened(headers, body);
  }

  /** A length-prefixed UTF-8 string (prefix of 2 or 4 bytes), or null when it runs past the end. */
  private static String readString(ByteBuffer r, int prefix) {
    if (r.remaining() < prefix) {
      return null;
    }
    long n = prefix == 2 ? Short.toUnsignedInt(r.getShort()) : Integer.toUnsignedLong(r.getInt());
    if (n > r.remaining()) {
      return null;
    }
    byte[] s = new byte[(int) n];
    r.get(s);
    return new String(s, StandardCharsets.UTF_8);
  }

  private static int checkU16(int n, String what) {
    if (n > 0xFFFF) {
      throw new IllegalArgumentException(
          "idem: a sealed result holds at most 65535 " + what + "; this one has " + n);
    }
    return n;
  }

  private static void writeU16(ByteArrayOutputStream b, int n) {
    b.write(n >>> 8);
    b.write(n);
  }

  private static void writeString16(ByteArrayOutputStream b, String s) {
    byte[] bytes = s.getBytes(StandardCharsets.UTF_8);
    writeU16(b, checkU16(bytes.length, "bytes of a tenant, key or point name"));
    b.writeBytes(bytes);
  }
}
