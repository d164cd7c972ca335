package io.idemd.testing;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;

/**
 * A real redis-server for the tests, on a free loopback port, without persistence, stopped by its
 * PID. Without redis-server on the PATH the test is skipped, unless IDEMD_REQUIRE_REDIS is set (as
 * make test does), which makes it fail.
 */
public final class Redis implements AutoCloseable {
  private final Process process;
  private final Path log;
  public final int port;

  private Redis(Process process, Path log, int port) {
    this.process = process;
    this.log = log;
    this.port = port;
  }

  /** Starts redis-server and waits until it answers PING. */
  public static Redis start() throws IOException, InterruptedException {
    Path bin = onPath("redis-server");
    if (bin == null) {
      String missing = "redis-server not found; install it (apt-get install -y redis-server)";
      String required = System.getenv("IDEMD_REQUIRE_REDIS");
      if (required != null && !required.isEmpty()) {
        throw new AssertionError(missing + " (IDEMD_REQUIRE_REDIS is set)");
      }
      Assumptions.abort(missing);
    }
    int port = Daemon.freePort();
    Path log = Files.createTempFile("idemd-java-redis-", ".log");
    Process process =
        new ProcessBuilder(
                bin.toString(),
                "--port",
                String.valueOf(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no")
            .redirectErrorStream(true)
            .redirectOutput(log.toFile())
            .start();
    Redis redis = new Redis(process, log, port);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Wait.seconds(20));
    while (System.nanoTime() < deadline) {
      if (!process.isAlive()) {
        String logs = Files.readString(log);
        redis.close();
        throw new IllegalStateException(
            "redis-server exited with " + process.exitValue() + ":\n" + logs);
      }
      try {
        if (redis.command("PING").equals("+PONG")) {
          return redis;
        }
      } catch (IOException e) {
        // Not listening yet.
      }
      Thread.sleep(20);
    }
    String logs = Files.readString(log);
    redis.close();
    throw new IllegalStateException("redis-server did not answer within 20 s:\n" + logs);
  }

  /** The URL of its database 0, as idemd's --store takes it. */
  public String url() {
    return "redis://127.0.0.1:" + port + "/0";
  }

  /** Sends one command and returns the first line of its answer, such as +PONG or :1. */
  public String command(String... args) throws IOException {
    ByteArrayOutputStream request = new ByteArrayOutputStream();
    request.writeBytes(("*" + args.length + "\r\n").getBytes(StandardCharsets.UTF_8));
    for (String arg : args) {
      byte[] b = arg.getBytes(StandardCharsets.UTF_8);
      request.writeBytes(("$" + b.length + "\r\n").getBytes(StandardCharsets.UTF_8));
      request.writeBytes(b);
      request.writeBytes("\r\n".getBytes(StandardCharsets.UTF_8));
    }
    try (Socket s = new Socket(InetAddress.getLoopbackAddress(), port)) {
      s.setSoTimeout((int) TimeUnit.SECONDS.toMillis(Wait.seconds(10)));
      OutputStream out = s.getOutputStream();
      out.write(request.toByteArray());
      out.flush();
      InputStream in = s.getInputStream();
      ByteArrayOutputStream line = new ByteArrayOutputStream();
      for (int c = in.read(); c != -1 && c != '\n'; c = in.read()) {
        if (c != '\r') {
          line.write(c);
        }
      }
      return line.toString(StandardCharsets.UTF_8);
    }
  }

  @Override
  public void close() {
    process.destroyForcibly();
    try {
      process.waitFor(10, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    log.toFile().delete();
  }

  private static Path onPath(String name) {
    for (String dir : System.getenv().getOrDefault("PATH", "").split(File.pathSeparator)) {
      if (!dir.isEmpty() && Files.isExecutable(Path.of(dir, name))) {
        return Path.of(dir, name);
      }
    }
    return null;
  }
}
