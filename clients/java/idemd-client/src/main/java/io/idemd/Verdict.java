package io.idemd;

import java.time.Duration;
import java.util.Optional;

/**
 * What consume decided for one delivery, by the same table in every idemd client (docs/queues.md):
 * ACK removes the message (handled now or before); REQUEUE leaves it to be delivered again after
 * delay (not handled, never dropped); DEAD_LETTER removes it to the broker's dead-letter queue
 * (failed for good, the failure stored). ran says that the work ran for this delivery; error is why
 * the message was not acknowledged.
 */
public record Verdict(Action action, Duration delay, boolean ran, Optional<Throwable> error) {
  public enum Action {
    ACK,
    REQUEUE,
    DEAD_LETTER
  }
}
