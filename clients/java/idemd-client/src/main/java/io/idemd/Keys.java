package io.idemd;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;

/** Keys derived from stable fields, the same in every idemd client. */
public final class Keys {
  /**
   * The message header that carries an idemd key from the request that published a message to its
   * consumers: the lease's key. The name and the value are the same in every idemd client.
   */
  public static final String MESSAGE_HEADER = "idemd-key";

  private Keys() {}

  /**
   * Derives a key from a message's stable fields (for example the topic, the partition and the
   * producer's message ID; never the delivery count or the receive time). Each part is
   * length-prefixed before hashing, so ("ab", "c") and ("a", "bc") give different keys.
   */
  public static String messageKey(String... parts) {
    MessageDigest hash = sha256();
    for (String part : parts) {
      update(hash, part.getBytes(StandardCharsets.UTF_8));
    }
    return "msg-" + HexFormat.of().formatHex(hash.digest());
  }

  /**
   * Derives the key of one step of the work that key started: a consumer of a message whose
   * MESSAGE_HEADER is key runs step "charge" under stepKey(key, "charge").
   */
  public static String stepKey(String key, String step) {
    return messageKey("step", key, step);
  }

  /** Feeds u64be(len(bytes)) || bytes to hash. */
  static void update(MessageDigest hash, byte[] bytes) {
    hash.update(ByteBuffer.allocate(8).putLong(bytes.length).array());
    hash.update(bytes);
  }

  static MessageDigest sha256() {
    try {
      return MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("every Java platform has SHA-256", e);
    }
  }
}
