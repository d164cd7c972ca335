package io.idemd;

import java.util.Arrays;
import java.util.Objects;

/**
 * One key of a {@link KeyRing}: an id of 1 to 32 letters, digits, '.', '_' or '-', named in every
 * envelope it seals, and 32 random bytes. The ring checks both when it is made.
 */
public record SealKey(String id, byte[] key) {
  public SealKey {
    Objects.requireNonNull(id, "id");
    key = Objects.requireNonNull(key, "key").clone();
  }

  /** A copy of the key's bytes, so that the key stays as it was made. */
  @Override
  public byte[] key() {
    return key.clone();
  }

  // A record compares arrays by identity; two keys with the same id and bytes are the same key.
  @Override
  public boolean equals(Object o) {
    return o instanceof SealKey k && id.equals(k.id) && Arrays.equals(key, k.key);
  }

  @Override
  public int hashCode() {
    return Objects.hash(id, Arrays.hashCode(key));
  }

  /** The id only: the key's bytes are a secret, and stay out of logs. */
  @Override
  public String toString() {
    return "SealKey[id=" + id + "]";
  }
}
