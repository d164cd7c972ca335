package io.idemd;

/**
 * Another caller holds a live lease on the key (code in_progress); retryAfter says when it runs
 * out.
 */
public class InProgressException extends IdemProblemException {
  private static final long serialVersionUID = 1L;

  public InProgressException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
