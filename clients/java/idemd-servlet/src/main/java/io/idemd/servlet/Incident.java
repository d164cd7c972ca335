package io.idemd.servlet;

import java.util.Optional;

/**
 * A case where the filter could not keep a promise or could not protect a request
 * (docs/middleware.md, Incidents): its kind, stable and meant for a metric label; the idemd key
 * (empty when none was derived); and the cause, when there is one.
 */
public record Incident(Kind kind, String idemdKey, Optional<Throwable> error) {
  public enum Kind {
    UNAVAILABLE("unavailable"),
    FAIL_OPEN("fail_open"),
    IDEMD_REFUSED("idemd_refused"),
    QUOTA_EXCEEDED("quota_exceeded"),
    SCOPE_MISSING("scope_missing"),
    RESULT_NOT_STORED("result_not_stored"),
    COMPLETE_FAILED("complete_failed"),
    RELEASE_FAILED("release_failed"),
    LEASE_LOST("lease_lost"),
    LEASE_EXPIRED("lease_expired"),
    REPLAY_INVALID("replay_invalid"),
    REPLAY_UNSEALABLE("replay_unsealable");

    private final String label;

    Kind(String label) {
      this.label = label;
    }

    /** The kind as every idemd client spells it, such as result_not_stored. */
    public String label() {
      return label;
    }
  }
}
