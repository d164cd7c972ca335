package io.idemd;

import java.nio.ByteBuffer;
import java.security.SecureRandom;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.function.Consumer;

/**
 * How one client seals what it stores and opens what comes back (docs/sealing.md): the tenant its
 * envelopes are bound to and its ring, or no ring at all, when it stores plain results and a sealed
 * one that comes back is an UnsealableException (unknown_key), and hands recovery points on as they
 * are.
 */
final class Sealing {
  // Before NONE, which draws from it.
  private static final SecureRandom RANDOM = new SecureRandom();

  /** A client without a ring. */
  static final Sealing NONE = new Sealing(null, null, false);

  private final String tenant;
  private final KeyRing ring;
  private final boolean requireSealed;
  private final Consumer<byte[]> random;

  Sealing(String tenant, KeyRing ring, boolean requireSealed) {
    this(tenant, ring, requireSealed, RANDOM::nextBytes);
  }

  Sealing(String tenant, KeyRing ring, boolean requireSealed, Consumer<byte[]> random) {
    this.tenant = tenant;
    this.ring = ring;
    this.requireSealed = requireSealed;
    this.random = random;
  }

  boolean seals() {
    return ring != null;
  }

  /**
   * A result as it goes to idemd, of a record completed or failed: sealed into {status, sealed}
   * with a ring, plain without.
   */
  io.idemd.api.model.StoredResponse toWire(String key, boolean failed, StoredResponse r) {
    return stored(key, failed, r.status(), r.headers(), ByteBuffer.wrap(r.bodyUncopied())).toWire();
  }

  /**
   * A result as idemd stores it: with a ring, its status and the envelope of its headers and body;
   * without, the three as they are, body read where it is.
   */
  Stored stored(
      String key, boolean failed, int status, Map<String, List<String>> headers, ByteBuffer body) {
    if (ring == null) {
      return new Stored(status, headers, body.duplicate(), false);
    }
    byte[] sealed =
        ring.seal(
            KeyRing.Context.result(tenant, key, failed, status),
            KeyRing.responseHead(headers),
            body,
            random);
    return new Stored(status, Map.of(), ByteBuffer.wrap(sealed), true);
  }

  /**
   * A result as idemd stores it: its status, and its headers and body, or (sealed) an envelope in
   * bytes and no headers. bytes is a view that is read, never written.
   */
  record Stored(int status, Map<String, List<String>> headers, ByteBuffer bytes, boolean sealed) {
    /** The body's, or the envelope's, length: what decides how it goes to idemd. */
    int size() {
      return bytes.remaining();
    }

    /** The result as JSON carries it, base64 in the body or sealed field. */
    io.idemd.api.model.StoredResponse toWire() {
      io.idemd.api.model.StoredResponse wire =
          new io.idemd.api.model.StoredResponse().status(status);
      byte[] b = new byte[bytes.remaining()];
      bytes.duplicate().get(b);
      if (sealed) {
        // The generated model starts with empty headers, which would go out beside the envelope.
        return wire.headers(null).sealed(b);
      }
      if (!headers.isEmpty()) {
        wire.headers(headers);
      }
      if (b.length > 0) {
        wire.body(b);
      }
      return wire;
    }
  }

  /**
   * What a failure without a response stores: with a ring, an envelope that holds nothing under
   * {@link KeyRing#NO_RESPONSE_STATUS}, so that a ring requiring sealing can tell it from a failure
   * slipped into the store; null without.
   */
  io.idemd.api.model.StoredResponse noResponse(String key) {
    if (ring == null) {
      return null;
    }
    int status = KeyRing.NO_RESPONSE_STATUS;
    return new io.idemd.api.model.StoredResponse()
        .status(status)
        .headers(null)
        .sealed(ring.seal(KeyRing.Context.result(tenant, key, true, status), new byte[0], random));
  }

  /**
   * The result of key, a record whose state is state (completed, failed, or one not finished), as
   * idemd answered it (wire null for none), opened when it is sealed; empty for none, and for a
   * failure sealed without a response. Throws an UnsealableException when it does not open, when it
   * is sealed and this client has no ring (unknown_key, naming the envelope's key), and when the
   * client requires sealed results and it is plain, or a finished record has none (not_sealed).
   */
  Optional<StoredResponse> fromWire(
      String key, String state, io.idemd.api.model.StoredResponse wire) {
    boolean failed = "failed".equals(state);
    if (wire == null) {
      if (requireSealed && ring != null && (failed || "completed".equals(state))) {
        throw new UnsealableException(UnsealableException.Reason.NOT_SEALED, "");
      }
      return Optional.empty();
    }
    int status = wire.getStatus() == null ? 0 : wire.getStatus();
    byte[] sealed = wire.getSealed();
    if (sealed == null) {
      if (requireSealed) {
        throw new UnsealableException(UnsealableException.Reason.NOT_SEALED, "");
      }
      Map<String, List<String>> headers = wire.getHeaders() == null ? Map.of() : wire.getHeaders();
      return Optional.of(new StoredResponse(status, headers, wire.getBody()));
    }
    if (ring == null) {
      throw new UnsealableException(
          UnsealableException.Reason.UNKNOWN_KEY, KeyRing.keyIdOf(sealed));
    }
    byte[] plain = ring.open(KeyRing.Context.result(tenant, key, failed, status), sealed);
    if (plain.length == 0 && failed && sealed[1] != KeyRing.VERSION_1) {
      return Optional.empty();
    }
    KeyRing.Opened opened = KeyRing.parseResponsePlaintext(plain);
    if (opened == null) {
      throw new UnsealableException(UnsealableException.Reason.INVALID, KeyRing.keyIdOf(sealed));
    }
    return Optional.of(new StoredResponse(status, opened.headers(), opened.body()));
  }

  /**
   * A recovery point's data as it goes to idemd: sealed with a ring (empty data too, so that it
   * opens under require sealed), as given without; null records none.
   */
  byte[] sealPoint(String key, String name, byte[] data) {
    byte[] given = data == null ? new byte[0] : data;
    if (ring == null) {
      return given.length == 0 ? null : given.clone();
    }
    return ring.seal(KeyRing.Context.point(tenant, key, name), given, random);
  }

  /**
   * A recovery point of key as idemd answered it, its data opened. A client without a ring passes
   * every point's data through as it is, whatever its first byte: a recovery point has no mark of
   * its own, and plain data may start with the envelope's marker. With a ring, data that does not
   * start with the marker is plain, recorded before sealing was turned on or by a client without a
   * ring: passed through, unless the client requires sealed recovery points.
   */
  RecoveryPoint openPoint(String key, io.idemd.api.model.RecoveryPoint wire) {
    byte[] data = wire.getData() == null ? new byte[0] : wire.getData();
    long attempt = wire.getAttempt() == null ? 0 : wire.getAttempt();
    if (ring == null) {
      return new RecoveryPoint(wire.getName(), data, attempt, wire.getRecordedAt());
    }
    if (data.length == 0 || (data[0] & 0xFF) != KeyRing.MARKER) {
      if (requireSealed) {
        throw new UnsealableException(UnsealableException.Reason.NOT_SEALED, "");
      }
      return new RecoveryPoint(wire.getName(), data, attempt, wire.getRecordedAt());
    }
    byte[] opened = ring.open(KeyRing.Context.point(tenant, key, wire.getName()), data);
    return new RecoveryPoint(wire.getName(), opened, attempt, wire.getRecordedAt());
  }

  /** The optional form of {@link #openPoint}, for the answers that may carry none. */
  Optional<RecoveryPoint> openPoint(String key, Optional<io.idemd.api.model.RecoveryPoint> wire) {
    return wire.map(w -> openPoint(key, w));
  }
}
