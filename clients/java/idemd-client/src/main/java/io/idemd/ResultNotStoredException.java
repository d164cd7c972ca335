package io.idemd;

/**
 * The operation ran, but idemd did not store its result (see the cause). After the lease runs out,
 * a later run of the key runs the operation again.
 */
public class ResultNotStoredException extends IdemException {
  private static final long serialVersionUID = 1L;

  private final transient Object value;

  public ResultNotStoredException(String key, Object value, Throwable cause) {
    super("idem: \"" + key + "\" ran but its result was not stored", cause);
    this.value = value;
  }

  /** What the operation returned. */
  public Object value() {
    return value;
  }
}
