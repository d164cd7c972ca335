package io.idemd;

/**
 * A sealed result or recovery point that cannot be opened here (docs/sealing.md): sealed with a key
 * the client's {@link KeyRing} does not hold (or the client has no ring), changed or moved in the
 * store, or plain while the client requires sealed results. The operation ran and its key is done:
 * run and once throw it without running the work, consume requeues the message with it in the
 * verdict, and the Idempotency-Key filter answers 502 stored_response_unsealable. A recovery point
 * a lease would start from that does not open is the same error, nothing run; the key is then
 * released for a retry by a holder whose ring opens it (a Completer reports it and leaves the key
 * pending).
 */
public class UnsealableException extends IdemException {
  private static final long serialVersionUID = 1L;

  /** Why an envelope did not open, as every idemd client spells it. */
  public enum Reason {
    /** The envelope names a key the ring does not hold, or the client has no ring. */
    UNKNOWN_KEY("unknown_key"),
    /**
     * Not an envelope, an unknown version, or it fails to open: changed in the store, moved to
     * another key, tenant, status or recovery point, or sealed with other bytes under the same id.
     */
    INVALID("invalid"),
    /** The client requires sealed results and this one is plain. */
    NOT_SEALED("not_sealed");

    private final String label;

    Reason(String label) {
      this.label = label;
    }

    /** The reason as every idemd client spells it, such as unknown_key. */
    public String label() {
      return label;
    }
  }

  private final Reason reason;
  private final String keyId;

  public UnsealableException(Reason reason, String keyId) {
    super(message(reason, keyId == null ? "" : keyId));
    this.reason = reason;
    this.keyId = keyId == null ? "" : keyId;
  }

  public Reason reason() {
    return reason;
  }

  /** The id of the key the envelope names; empty when it names none (or is not an envelope). */
  public String keyId() {
    return keyId;
  }

  private static String message(Reason reason, String keyId) {
    return switch (reason) {
      case UNKNOWN_KEY ->
          "idem: the result is sealed with key \"" + keyId + "\", which the key ring does not hold";
      case NOT_SEALED -> "idem: the result is not sealed, and the client requires sealed results";
      case INVALID ->
          "idem: the sealed result does not open: changed, moved, or sealed with other key bytes";
    };
  }
}
