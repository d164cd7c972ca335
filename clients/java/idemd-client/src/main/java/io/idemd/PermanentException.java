package io.idemd;

/**
 * An operation's failure that must not be retried (a declined card, say): thrown from the work
 * given to run, once or consume, it is stored as the key's terminal failure, and later runs of the
 * key throw a {@link FailedException} carrying its message and value.
 */
public class PermanentException extends IdemException {
  private static final long serialVersionUID = 1L;

  private final transient Object value;

  public PermanentException(String message) {
    this(message, null, null);
  }

  /** value is stored as JSON with the message, and handed to later runs. */
  public PermanentException(String message, Object value, Throwable cause) {
    super(message, cause);
    this.value = value;
  }

  public Object value() {
    return value;
  }
}
