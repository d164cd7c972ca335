package io.idemd;

/**
 * What one pass of a {@link Completer} did with the keys it listed: listed is finished + failed +
 * skipped + errors. finished counts the keys whose handler ran and whose result is stored; failed
 * those whose handler threw a PermanentException, stored as the key's failure; skipped those not
 * run because another caller or completer holds them or they were finished since the feed listed
 * them; errors those whose handler failed or that could not be claimed or finished, which stay
 * pending and are listed again once their lease runs out.
 */
public record CompleterStats(int listed, int finished, int failed, int skipped, int errors) {
  /** A pass that listed nothing. */
  public static final CompleterStats NONE = new CompleterStats(0, 0, 0, 0, 0);
}
