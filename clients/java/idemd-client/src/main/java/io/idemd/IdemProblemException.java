package io.idemd;

import java.time.Duration;
import java.util.Optional;

/**
 * An error answer: idemd's RFC 9457 problem, or an answer that is not idemd's (a proxy's 502, say),
 * whose code is then empty. The subclasses name the codes a caller acts on; any other code (the set
 * is open) arrives as this class.
 */
public class IdemProblemException extends IdemException {
  private static final long serialVersionUID = 1L;

  private final int status;
  private final String code;
  private final String title;
  private final String type;
  private final String detail;
  private final Duration retryAfter;

  public IdemProblemException(Problem problem, Throwable cause) {
    super(message(problem), cause);
    this.status = problem.status();
    this.code = problem.code();
    this.title = problem.title();
    this.type = problem.type();
    this.detail = problem.detail();
    this.retryAfter = problem.retryAfter();
  }

  /** The HTTP status; 0 when no answer came at all. */
  public int status() {
    return status;
  }

  /** The machine-readable code, such as in_progress; empty when the answer is not idemd's. */
  public String code() {
    return code;
  }

  public String title() {
    return title;
  }

  public String type() {
    return type;
  }

  /** What went wrong, naming the member of the request at fault. */
  public String detail() {
    return detail;
  }

  /** How long to wait before trying again, when the answer says. */
  public Optional<Duration> retryAfter() {
    return Optional.ofNullable(retryAfter);
  }

  private static String message(Problem p) {
    String what = p.code().isEmpty() ? p.title() : p.code();
    return "idem: " + p.status() + " " + what + (p.detail().isEmpty() ? "" : ": " + p.detail());
  }

  /** The members of a problem, as read from an answer. */
  public record Problem(
      int status, String code, String title, String type, String detail, Duration retryAfter) {}
}
