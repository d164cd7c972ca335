package io.idemd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.testing.Daemon;
import io.idemd.testing.Wait;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** Concurrent calls of one client share requests, each answered as it would be alone. */
class BatchTest {
  /** The POST /v1/batch requests idemd has answered. */
  static long batches(Daemon daemon) throws Exception {
    String metrics =
        HttpClient.newHttpClient()
            .send(
                HttpRequest.newBuilder(URI.create(daemon.url + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString())
            .body();
    long n = 0;
    for (String line : metrics.split("\n")) {
      if (line.startsWith("idemd_requests_total{endpoint=\"POST /v1/batch\"")) {
        n += (long) Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
      }
    }
    return n;
  }

  static List<RunResult<String>> storm(IdemClient client, List<String> keys) throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(32);
    try {
      List<Future<RunResult<String>>> futures = new ArrayList<>();
      for (String key : keys) {
        futures.add(
            pool.submit(() -> client.run(key, String.class, lease -> "value of " + lease.key())));
      }
      List<RunResult<String>> out = new ArrayList<>();
      for (Future<RunResult<String>> f : futures) {
        out.add(f.get(Wait.seconds(60), TimeUnit.SECONDS));
      }
      return out;
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void concurrentCallsShareBatchesAndEachGetsItsOwnAnswer() throws Exception {
    try (Daemon daemon = Daemon.start();
        IdemClient client = IdemClient.builder(daemon.url).build()) {
      List<String> keys = new ArrayList<>();
      for (int i = 0; i < 640; i++) {
        keys.add("batch-" + UUID.randomUUID());
      }
      List<RunResult<String>> first = storm(client, keys);
      for (int i = 0; i < keys.size(); i++) {
        assertFalse(first.get(i).replayed());
        assertEquals("value of " + keys.get(i), first.get(i).value());
      }
      List<RunResult<String>> again = storm(client, keys);
      for (int i = 0; i < keys.size(); i++) {
        assertTrue(again.get(i).replayed());
        assertEquals("value of " + keys.get(i), again.get(i).value());
      }
      assertTrue(batches(daemon) > 0, "no call shared a batch");
    }
  }

  @Test
  void withoutBatchingEveryCallIsItsOwnRequest() throws Exception {
    try (Daemon daemon = Daemon.start();
        IdemClient client = IdemClient.builder(daemon.url).batching(false).build()) {
      List<String> keys = new ArrayList<>();
      for (int i = 0; i < 64; i++) {
        keys.add("single-" + UUID.randomUUID());
      }
      storm(client, keys).forEach(r -> assertFalse(r.replayed()));
      assertEquals(0, batches(daemon));
    }
  }
}
