package io.idemd.servlet;

import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.ByteBuffer;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Passes the handler's answer through to the client as it is written (flushes included, R11) and
 * records it at the same time: its status, and its body up to a limit, past which recording stops
 * and the answer is no longer one to store (R10).
 */
final class RecordingResponse extends HttpServletResponseWrapper {
  private final int maxBytes;
  private final Recorded recorded = new Recorded();
  private boolean overflowed;
  private boolean errorSent;
  private boolean finishing;
  private ServletOutputStream out;
  private PrintWriter writer;

  RecordingResponse(HttpServletResponse response, int maxBytes) {
    super(response);
    this.maxBytes = maxBytes;
  }

  @Override
  public ServletOutputStream getOutputStream() throws IOException {
    if (writer != null) {
      throw new IllegalStateException("getWriter() has already been called for this response");
    }
    if (out == null) {
      out = new Tee(getResponse().getOutputStream());
    }
    return out;
  }

  @Override
  public PrintWriter getWriter() throws IOException {
    if (writer == null) {
      if (out != null) {
        throw new IllegalStateException(
            "getOutputStream() has already been called for this response");
      }
      String encoding = getCharacterEncoding();
      Charset charset = encoding == null ? StandardCharsets.ISO_8859_1 : Charset.forName(encoding);
      // Written through the container's own stream, so that its charset and framing hold.
      writer =
          new PrintWriter(
              new OutputStreamWriter(new Tee(getResponse().getOutputStream()), charset), false);
    }
    return writer;
  }

  @Override
  public void sendError(int sc, String msg) throws IOException {
    errorSent = true;
    super.sendError(sc, msg);
  }

  @Override
  public void sendError(int sc) throws IOException {
    errorSent = true;
    super.sendError(sc);
  }

  @Override
  public void flushBuffer() throws IOException {
    if (writer != null) {
      writer.flush();
    }
    super.flushBuffer();
  }

  @Override
  public void resetBuffer() {
    super.resetBuffer();
    clearRecording();
  }

  @Override
  public void reset() {
    super.reset();
    clearRecording();
  }

  private void clearRecording() {
    recorded.reset();
    overflowed = false;
  }

  /**
   * Moves what the handler wrote through a writer, which buffers it, into the container's buffer,
   * without flushing that to the client: an answer not yet committed can still be replaced (R12).
   */
  void finish() {
    if (writer != null) {
      finishing = true;
      try {
        writer.flush();
      } finally {
        finishing = false;
      }
    }
  }

  /** Whether the handler wrote nothing: no status of its own, no body, no error. */
  boolean wroteNothing() {
    return getStatus() == 200 && recorded.size() == 0 && !overflowed && !errorSent;
  }

  /** The final status, as the container will send it (200 when the handler set none). */
  int status() {
    return getStatus();
  }

  /** Whether the answer's body is the container's (sendError), not recorded here. */
  boolean errorSent() {
    return errorSent;
  }

  /**
   * The body written, or null when it went over the limit: a view of the recording itself, not a
   * copy, so that a large answer is held once.
   */
  ByteBuffer body() {
    return overflowed ? null : recorded.view();
  }

  /** The values of the stored headers the handler set, by lowercase name. */
  Map<String, List<String>> storedHeaders(List<String> names) {
    Map<String, List<String>> out = new LinkedHashMap<>();
    for (String name : names) {
      List<String> values = new ArrayList<>();
      if (name.equals("content-type")) {
        if (getContentType() != null) {
          values.add(getContentType());
        }
      } else {
        values.addAll(getHeaders(name));
      }
      if (!values.isEmpty()) {
        out.put(name, values);
      }
    }
    return out;
  }

  private void record(byte[] b, int off, int len) {
    if (overflowed) {
      return;
    }
    if (recorded.size() + len > maxBytes) {
      overflowed = true;
      recorded.reset();
      return;
    }
    recorded.write(b, off, len);
  }

  /** The recording, which hands out what it holds without copying it. */
  private static final class Recorded extends ByteArrayOutputStream {
    synchronized ByteBuffer view() {
      return ByteBuffer.wrap(buf, 0, count).slice();
    }
  }

  /** Writes to the container's stream and records what went through. */
  private final class Tee extends ServletOutputStream {
    private final ServletOutputStream to;

    Tee(ServletOutputStream to) {
      this.to = to;
    }

    @Override
    public void write(int b) throws IOException {
      to.write(b);
      record(new byte[] {(byte) b}, 0, 1);
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
      to.write(b, off, len);
      record(b, off, len);
    }

    @Override
    public void flush() throws IOException {
      if (!finishing) {
        to.flush();
      }
    }

    @Override
    public void close() throws IOException {
      to.close();
    }

    @Override
    public boolean isReady() {
      return to.isReady();
    }

    @Override
    public void setWriteListener(WriteListener listener) {
      to.setWriteListener(listener);
    }
  }
}
