package io.idemd;

/** The key has no record (code not_found). */
public class NotFoundException extends IdemProblemException {
  private static final long serialVersionUID = 1L;

  public NotFoundException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
