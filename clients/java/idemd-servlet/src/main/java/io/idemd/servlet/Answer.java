package io.idemd.servlet;

import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** An answer the filter writes in the handler's place: one of its problems, or a replay. */
record Answer(int status, Map<String, List<String>> headers, byte[] body) {
  /** A problem+json answer (never stored, except response_not_stored). */
  static Answer problem(
      int status, String code, String title, String detail, Integer retryAfterSeconds) {
    Map<String, List<String>> headers = new LinkedHashMap<>();
    headers.put("content-type", List.of("application/problem+json"));
    if (retryAfterSeconds != null) {
      headers.put("retry-after", List.of(Integer.toString(retryAfterSeconds)));
    }
    String body =
        "{\"type\":\"about:blank\",\"title\":"
            + json(title)
            + ",\"status\":"
            + status
            + ",\"detail\":"
            + json(detail)
            + ",\"code\":"
            + json(code)
            + "}";
    return new Answer(status, headers, body.getBytes(StandardCharsets.UTF_8));
  }

  void write(HttpServletResponse res) throws IOException {
    res.setStatus(status);
    headers.forEach(
        (name, values) -> {
          for (String v : values) {
            res.addHeader(name, v);
          }
        });
    res.setContentLength(body.length);
    res.getOutputStream().write(body);
    res.flushBuffer();
  }

  private static String json(String s) {
    StringBuilder out = new StringBuilder(s.length() + 2).append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.append('"').toString();
  }
}
