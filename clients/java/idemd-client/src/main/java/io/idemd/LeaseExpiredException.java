package io.idemd;

/**
 * The lease ran out here before idemd could answer a renewal: no renewal was answered before the
 * lease's local deadline (its last answered claim or renewal's send time plus 95 % of the lease).
 * idemd has expired it by then, or is about to, and another caller may hold the key: the caller
 * acts as on an answered lease_lost, whose class this extends, so that code catching
 * LeaseLostException handles both. The status is 0, as no answer came.
 */
public class LeaseExpiredException extends LeaseLostException {
  private static final long serialVersionUID = 1L;

  public LeaseExpiredException(Problem problem, Throwable cause) {
    super(problem, cause);
  }
}
