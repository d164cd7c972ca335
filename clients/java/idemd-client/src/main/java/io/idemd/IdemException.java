package io.idemd;

/** The base of every exception the idemd client throws. */
public class IdemException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public IdemException(String message) {
    super(message);
  }

  public IdemException(String message, Throwable cause) {
    super(message, cause);
  }
}
