package io.idemd;

import java.time.Duration;

/**
 * The options of run, once and consume, each null for the default: fingerprint (a digest of the
 * payload), lease (claimed and renewed every lease/3 while the work runs; default 30 s) and waitFor
 * (how long to wait for another holder to finish instead of an InProgressException).
 */
public record RunOptions(String fingerprint, Duration lease, Duration waitFor) {
  public static final RunOptions DEFAULT = new RunOptions(null, null, null);

  public RunOptions withFingerprint(String fingerprint) {
    return new RunOptions(fingerprint, lease, waitFor);
  }

  public RunOptions withLease(Duration lease) {
    return new RunOptions(fingerprint, lease, waitFor);
  }

  public RunOptions withWaitFor(Duration waitFor) {
    return new RunOptions(fingerprint, lease, waitFor);
  }
}
