package io.idemd;

/**
 * idemd could not be reached, or could not reach or replicate to its store (codes store_unavailable
 * and not_replicated, a proxy's 502, 503 or 504, or no answer at all, with status 0). Nothing was
 * done: try again after retryAfter.
 */
public class UnavailableException extends IdemProblemException {
  private static final long serialVersionUID = 1L;

  public UnavailableException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
