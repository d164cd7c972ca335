package io.idemd;

import com.fasterxml.jackson.databind.JsonNode;

/** A finished key whose operation failed for good: run replays the stored failure. */
public class FailedException extends IdemException {
  private static final long serialVersionUID = 1L;

  private final transient JsonNode value;

  public FailedException(String message, JsonNode value) {
    super(message);
    this.value = value;
  }

  /** The value given to the PermanentException that stored the failure, as JSON; null when none. */
  public JsonNode value() {
    return value;
  }
}
