package io.idemd;

import io.idemd.testing.Daemon;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Whether batching pays in the Java client: claim-and-complete cycles on fresh keys from many
 * threads of one client against one idemd (its embedded store), with batching on and off in
 * alternating rounds of the same run. It reports cycles per second and the CPU each process spent
 * per cycle: this JVM (the client, which is also the load) and idemd.
 *
 * <p>make bench-java [BENCH_ARGS="threads seconds rounds"]
 */
public final class BatchBench {
  private BatchBench() {}

  public static void main(String[] args) throws Exception {
    int threads = args.length > 0 ? Integer.parseInt(args[0]) : 32;
    int seconds = args.length > 1 ? Integer.parseInt(args[1]) : 5;
    int rounds = args.length > 2 ? Integer.parseInt(args[2]) : 3;
    System.out.printf(
        "%d threads, %d s a round, %d rounds; %d cores%n",
        threads, seconds, rounds, Runtime.getRuntime().availableProcessors());
    System.out.println("| batching | cycles/s | client CPU µs/cycle | idemd CPU µs/cycle |");
    System.out.println("|---|---|---|---|");
    try (Daemon daemon = Daemon.start()) {
      for (int round = 0; round < rounds; round++) {
        for (boolean batching : new boolean[] {true, false}) {
          try (IdemClient client = IdemClient.builder(daemon.url).batching(batching).build()) {
            measure(client, daemon, threads, 1, "warm-up", false);
            measure(client, daemon, threads, seconds, batching ? "on" : "off", true);
          }
        }
      }
    }
  }

  private static void measure(
      IdemClient client, Daemon daemon, int threads, int seconds, String label, boolean print)
      throws Exception {
    AtomicLong cycles = new AtomicLong();
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
    long clientCpu0 = processCpuNanos();
    long idemdCpu0 = cpuNanos(daemon.pid());
    long start = System.nanoTime();
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    List<Future<?>> workers = new ArrayList<>();
    String prefix = "bench-" + System.nanoTime() + "-";
    for (int t = 0; t < threads; t++) {
      int id = t;
      workers.add(
          pool.submit(
              () -> {
                StoredResponse done = StoredResponse.of(200, "application/json", "{}");
                for (long i = 0; System.nanoTime() < end; i++) {
                  String key = prefix + id + "-" + i;
                  Claim.Acquired c = (Claim.Acquired) client.claim(key);
                  client.complete(key, c.leaseToken(), done);
                  cycles.incrementAndGet();
                }
                return null;
              }));
    }
    for (Future<?> w : workers) {
      w.get();
    }
    pool.shutdown();
    double elapsed = (System.nanoTime() - start) / 1e9;
    long n = cycles.get();
    double clientUs = (processCpuNanos() - clientCpu0) / 1e3 / n;
    double idemdUs = (cpuNanos(daemon.pid()) - idemdCpu0) / 1e3 / n;
    if (print) {
      System.out.printf(
          Locale.ROOT, "| %s | %.0f | %.1f | %.1f |%n", label, n / elapsed, clientUs, idemdUs);
    }
  }

  private static long processCpuNanos() {
    return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
        .getProcessCpuTime();
  }

  /** utime + stime of a process, from /proc (clock ticks of 10 ms on Linux). */
  private static long cpuNanos(long pid) throws Exception {
    String stat = Files.readString(Path.of("/proc/" + pid + "/stat"));
    String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
    return (Long.parseLong(f[11]) + Long.parseLong(f[12])) * 10_000_000L;
  }
}
