package io.idemd;

/** The key was claimed before with another fingerprint (code fingerprint_mismatch). */
public class FingerprintMismatchException extends IdemProblemException {
  private static final long serialVersionUID = 1L;

  public FingerprintMismatchException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
