package io.idemd;

/**
 * The lease is no longer this caller's (code lease_lost): it ran out and another caller took the
 * key over, or the key was finished.
 */
public class LeaseLostException extends IdemProblemException {
  private static final long serialVersionUID = 1L;

  public LeaseLostException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
