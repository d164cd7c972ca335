package io.idemd.servlet;

import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.InputStreamReader;
import java.net.URLDecoder;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The request with its body already read by the filter (to fingerprint it): the handler reads the
 * same bytes again, as a stream, a reader or, for a form, its parameters.
 */
final class CachedBodyRequest extends HttpServletRequestWrapper {
  private final byte[] body;
  private final ByteArrayInputStream in;
  private Map<String, String[]> parameters;

  CachedBodyRequest(HttpServletRequest request, byte[] body) {
    super(request);
    this.body = body;
    this.in = new ByteArrayInputStream(body);
  }

  @Override
  public ServletInputStream getInputStream() {
    return new ServletInputStream() {
      @Override
      public int read() {
        return in.read();
      }

      @Override
      public int read(byte[] b, int off, int len) {
        return in.read(b, off, len);
      }

      @Override
      public boolean isFinished() {
        return in.available() == 0;
      }

      @Override
      public boolean isReady() {
        return true;
      }

      @Override
      public void setReadListener(ReadListener listener) {
        throw new IllegalStateException(
            "the body was read by the idempotency filter; read it blocking");
      }
    };
  }

  @Override
  public BufferedReader getReader() {
    return new BufferedReader(new InputStreamReader(in, charset()));
  }

  @Override
  public String getParameter(String name) {
    String[] values = parameters().get(name);
    return values == null ? null : values[0];
  }

  @Override
  public Map<String, String[]> getParameterMap() {
    return Collections.unmodifiableMap(parameters());
  }

  @Override
  public Enumeration<String> getParameterNames() {
    return Collections.enumeration(parameters().keySet());
  }

  @Override
  public String[] getParameterValues(String name) {
    String[] values = parameters().get(name);
    return values == null ? null : values.clone();
  }

  /** The query's parameters, and a form body's, which the container can no longer read. */
  private synchronized Map<String, String[]> parameters() {
    if (parameters == null) {
      Map<String, List<String>> all = new LinkedHashMap<>();
      Charset charset = charset();
      parse(getQueryString(), charset, all);
      String type = getContentType() == null ? "" : getContentType().toLowerCase(Locale.ROOT);
      if (type.startsWith("application/x-www-form-urlencoded")) {
        parse(new String(body, charset), charset, all);
      }
      Map<String, String[]> out = new LinkedHashMap<>();
      all.forEach((k, v) -> out.put(k, v.toArray(new String[0])));
      parameters = out;
    }
    return parameters;
  }

  private static void parse(String encoded, Charset charset, Map<String, List<String>> into) {
    if (encoded == null || encoded.isEmpty()) {
      return;
    }
    for (String pair : encoded.split("&")) {
      if (pair.isEmpty()) {
        continue;
      }
      int eq = pair.indexOf('=');
      try {
        String name = URLDecoder.decode(eq < 0 ? pair : pair.substring(0, eq), charset);
        String value = eq < 0 ? "" : URLDecoder.decode(pair.substring(eq + 1), charset);
        into.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
      } catch (IllegalArgumentException e) {
        // A malformed escape: the pair is skipped, as containers do.
      }
    }
  }

  private Charset charset() {
    String name = getCharacterEncoding();
    try {
      return name == null ? StandardCharsets.UTF_8 : Charset.forName(name);
    } catch (IllegalArgumentException e) {
      return StandardCharsets.UTF_8;
    }
  }
}
