package io.idemd;

/**
 * idemd refused a new key because the tenant keeps its quota of idemd's store, or more than its
 * share of a store that is nearly full (code quota_exceeded, status 429). Keys already stored still
 * replay; {@link #retryAfter()} says when records expire, when idemd knows.
 */
public class QuotaExceededException extends IdemProblemException {
  private static final long serialVersionUID = 1L;

  public QuotaExceededException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
