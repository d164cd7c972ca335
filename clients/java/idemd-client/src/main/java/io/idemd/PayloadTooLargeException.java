package io.idemd;

/**
 * idemd refused a call because something in it is over the daemon's limits (code payload_too_large,
 * status 413): a recovery point's data over --max-recovery-point-bytes, say, or a result over the
 * largest one it stores. Nothing was recorded; the same call is refused again.
 */
public class PayloadTooLargeException extends IdemProblemException {
  private static final long serialVersionUID = 1L;

  public PayloadTooLargeException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
