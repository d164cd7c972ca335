package io.idemd.testing;

import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * A real idemd for the tests: the binary IDEMD_BIN names (make test-java builds it from this
 * repository), or else one built here with go build, started on a free loopback port with its
 * embedded store in a temporary directory, and stopped by its PID.
 */
public final class Daemon implements AutoCloseable {
  private static Path built;

  private final Process process;
  private final Path dataDir;
  private final Path log;
  public final String url;

  private Daemon(Process process, Path dataDir, Path log, String url) {
    this.process = process;
    this.dataDir = dataDir;
    this.log = log;
    this.url = url;
  }

  /** Starts idemd with args after --listen and --data-dir, and waits until it is ready. */
  public static Daemon start(String... args) throws IOException, InterruptedException {
    int port = freePort();
    Path dataDir = Files.createTempDirectory("idemd-java-data-");
    Path log = Files.createTempFile("idemd-java-", ".log");
    List<String> command =
        new ArrayList<>(
            List.of(
                binary().toString(),
                "--listen",
                "127.0.0.1:" + port,
                "--data-dir",
                dataDir.toString(),
                "--log-level",
                "warn",
                // Without a blob store unless args name one (a later --blob-store wins), so
                // that a result over --max-response-bytes is refused as the tests of that
                // expect.
                "--blob-store",
                "none"));
    command.addAll(List.of(args));
    Process process =
        new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log.toFile()).start();
    Daemon daemon = new Daemon(process, dataDir, log, "http://127.0.0.1:" + port);
    HttpClient http = HttpClient.newHttpClient();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Wait.seconds(20));
    while (System.nanoTime() < deadline) {
      if (!process.isAlive()) {
        daemon.close();
        throw new IllegalStateException(
            "idemd exited with " + process.exitValue() + ":\n" + Files.readString(log));
      }
      try {
        HttpResponse<Void> res =
            http.send(
                HttpRequest.newBuilder(URI.create(daemon.url + "/readyz"))
                    .timeout(Duration.ofSeconds(1))
                    .build(),
                HttpResponse.BodyHandlers.discarding());
        if (res.statusCode() == 200) {
          return daemon;
        }
      } catch (IOException e) {
        // Not listening yet.
      }
      Thread.sleep(20);
    }
    String logs = Files.readString(log);
    daemon.close();
    throw new IllegalStateException("idemd was not ready within 20 s:\n" + logs);
  }

  /**
   * The requests idemd has answered to endpoint, such as "PUT /v1/keys/:key/result", whatever their
   * outcome and tenant, as its /metrics counts them (an item of a batch counts as a request to its
   * operation's endpoint too).
   */
  public long requests(String endpoint) throws IOException, InterruptedException {
    String metrics =
        HttpClient.newHttpClient()
            .send(
                HttpRequest.newBuilder(URI.create(url + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString())
            .body();
    String series = "idemd_requests_total{endpoint=\"" + endpoint + "\"";
    long n = 0;
    for (String line : metrics.split("\n")) {
      if (line.startsWith(series)) {
        n += (long) Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
      }
    }
    return n;
  }

  /** The directory of the daemon's embedded store: what its operator, or a backup, can read. */
  public Path dataDir() {
    return dataDir;
  }

  /** The daemon's process ID. */
  public long pid() {
    return process.pid();
  }

  /** Stops idemd at once (SIGKILL), as a crash would. */
  public void kill() {
    process.destroyForcibly();
    try {
      process.waitFor(10, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void close() {
    process.destroy();
    try {
      if (!process.waitFor(10, TimeUnit.SECONDS)) {
        kill();
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      kill();
    }
    try (Stream<Path> files = Files.walk(dataDir)) {
      files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException e) {
      // The temporary directory is left behind.
    }
    log.toFile().delete();
  }

  /** A loopback port that nothing listens on (for a client that gets no answer). */
  public static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      return s.getLocalPort();
    }
  }

  private static synchronized Path binary() throws IOException, InterruptedException {
    String bin = System.getenv("IDEMD_BIN");
    if (bin != null && !bin.isEmpty()) {
      return Path.of(bin);
    }
    if (built == null) {
      Path root = repositoryRoot();
      Path out = Files.createTempDirectory("idemd-java-bin-").resolve("idemd");
      Process go =
          new ProcessBuilder("go", "build", "-o", out.toString(), "./cmd/idemd")
              .directory(root.toFile())
              .inheritIO()
              .start();
      if (go.waitFor() != 0) {
        throw new IllegalStateException(
            "go build ./cmd/idemd failed; set IDEMD_BIN to an idemd binary");
      }
      built = out;
    }
    return built;
  }

  private static Path repositoryRoot() {
    for (Path p = Path.of("").toAbsolutePath(); p != null; p = p.getParent()) {
      if (Files.isDirectory(p.resolve("cmd/idemd")) && Files.exists(p.resolve("go.mod"))) {
        return p;
      }
    }
    throw new IllegalStateException(
        "the repository's root (with cmd/idemd) is not above " + Path.of("").toAbsolutePath());
  }
}
