package io.idemd;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;

/**
 * An operation's result as idemd stores and replays it: a final status (200 to 599), headers with
 * lowercase names, and the body.
 */
public record StoredResponse(int status, Map<String, List<String>> headers, byte[] body) {
  public StoredResponse {
    headers = headers == null ? Map.of() : Map.copyOf(headers);
    body = body == null ? new byte[0] : body.clone();
  }

  /** A response with a UTF-8 body and a Content-Type. */
  public static StoredResponse of(int status, String contentType, String body) {
    return new StoredResponse(
        status,
        Map.of("content-type", List.of(contentType)),
        body.getBytes(StandardCharsets.UTF_8));
  }

  @Override
  public byte[] body() {
    return body.clone();
  }

  /** The body itself, not a copy, for the client to read and never change. */
  byte[] bodyUncopied() {
    return body;
  }

  /** The body as UTF-8 text. */
  public String bodyText() {
    return new String(body, StandardCharsets.UTF_8);
  }
}
