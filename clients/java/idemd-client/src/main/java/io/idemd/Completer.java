package io.idemd;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.Iterator;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BiConsumer;

/**
 * Finishes the work that holders left: reads the abandoned-keys feed ({@link IdemClient#abandoned})
 * under a prefix and runs its handler for each key by the run path of {@link IdemClient#run}, with
 * the fingerprint the feed shows, as a caller that retries would. The claim decides who finishes a
 * key, so any number of completers, in any number of processes, and the keys' own callers may run
 * at once: a key another one holds is skipped, a key already finished is replayed and skipped (its
 * handler is not run), and no handler runs for a key twice unless a lease is lost.
 *
 * <pre>{@code
 * Completer completer = Completer.builder(client)
 *     .prefix("orders/")
 *     .handler(lease -> refunds.finish(lease.key(), lease.recoveryPoint()))
 *     .build();
 * new Thread(completer::run).start();
 * ...
 * completer.close(); // run returns once the handlers in flight have returned
 * }</pre>
 *
 * <p>The handler gets the lease as work given to run does ({@link Lease#current()} too): the key,
 * recovered true when the key was taken over from a holder whose lease ran out (the usual case),
 * the attempt, and the {@link Lease#recoveryPoint()} that holder recorded, if any; it may record
 * its own with {@link Lease#checkpoint}. What it returns is stored as the key's result: a {@link
 * StoredResponse} as it is (what the Idempotency-Key filter replays to the key's callers), any
 * other value as JSON, as run stores it. A PermanentException is stored as the key's failure: its
 * value as it is when that is a StoredResponse, otherwise as run stores a failure.
 *
 * <p>A handler that throws anything else does not release the key, as run would: a released key is
 * no longer pending and would drop out of the feed the completer works from. The key stays pending
 * under the completer's lease, and the feed lists it again once that runs out.
 *
 * <p>A Completer is immutable and thread-safe: {@link #runOnce} may be called from several threads,
 * and alongside {@link #run}. {@link #stop} or {@link #close} ends it for good.
 */
public final class Completer implements AutoCloseable {
  /** The handlers that run at once unless told otherwise. */
  public static final int DEFAULT_CONCURRENCY = 4;

  /** The lease each handler runs under unless told otherwise. */
  public static final Duration DEFAULT_LEASE = Duration.ofSeconds(30);

  /** The wait between passes of run once a pass finished nothing, unless told otherwise. */
  public static final Duration DEFAULT_POLL_INTERVAL = Duration.ofSeconds(5);

  private static final Duration MIN_LEASE = Duration.ofMillis(100);
  private static final Duration MAX_LEASE = Duration.ofHours(1);
  private static final long FIRST_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(250);
  private static final long MAX_BACKOFF_NANOS = TimeUnit.SECONDS.toNanos(30);
  private static final int MAX_KEY_BYTES = 255;

  // The completer whose run, runOnce or handler this thread is in, so that close() called
  // from there does not wait for itself.
  private static final ThreadLocal<Completer> INSIDE = new ThreadLocal<>();

  private final IdemClient client;
  private final String prefix;
  private final Duration olderThan;
  private final int concurrency;
  private final Duration lease;
  private final Duration pollInterval;
  private final Work<?> handler;
  private final BiConsumer<String, Throwable> onError;

  // Guards stopped, active and every Workers' counts; stop() wakes each wait on it.
  private final Object lock = new Object();
  private boolean stopped;
  private int active;

  private Completer(Builder b) {
    this.client = b.client;
    this.prefix = b.prefix;
    this.olderThan = b.olderThan;
    this.concurrency = b.concurrency;
    this.lease = b.lease;
    this.pollInterval = b.pollInterval;
    this.handler = b.handler;
    this.onError = b.onError;
  }

  /** Starts a completer on client; a prefix (or allKeys) and a handler are required. */
  public static Builder builder(IdemClient client) {
    return new Builder(client);
  }

  /**
   * Makes one pass over the feed, every page of it, and returns once the handlers it started have
   * returned. A key that could not be finished is counted in errors, and reported to onError. When
   * the feed cannot be read to its end, the keys listed until then are run, and runOnce then throws
   * what reading the feed threw (an UnavailableException when idemd could not be reached). Once the
   * completer is stopped, no more keys are taken, and runOnce returns the pass so far; on a
   * completer stopped already it returns {@link CompleterStats#NONE}. An interrupt of the calling
   * thread ends the pass as a stop does, and is kept.
   */
  public CompleterStats runOnce() {
    if (!enter()) {
      return CompleterStats.NONE;
    }
    Completer outer = INSIDE.get();
    INSIDE.set(this);
    Workers workers = new Workers();
    int listed;
    try {
      listed = pass(workers);
    } finally {
      workers.drain();
      INSIDE.set(outer);
      exit();
    }
    return workers.stats(listed);
  }

  /**
   * Keeps finishing abandoned keys until the completer is stopped ({@link #stop}, {@link #close}),
   * or the calling thread is interrupted, and then returns. Its workers outlive the passes over the
   * feed: a pass hands them the keys that are not running already, so a handler that takes long
   * holds up no other key. After a pass during which a key was finished or failed, the next starts
   * at once, for more may be waiting; otherwise it starts pollInterval later. While idemd cannot be
   * reached (an UnavailableException, 429, 5xx) the passes come further and further apart, from 250
   * ms doubling up to 30 s with jitter (or idemd's Retry-After when longer); each failed pass goes
   * to onError with the key "", and run never returns for one. A feed that idemd refuses otherwise
   * (401, 403, 400) is a mistake that no retry mends: run throws that, once its handlers returned.
   *
   * <p>Stopping does not interrupt the handlers in flight: run takes no more keys and returns once
   * they have returned and their results are stored (a handler that takes long can bound itself by
   * its lease's {@link Lease#remaining()}). On a completer stopped already, run returns at once.
   */
  public void run() {
    if (!enter()) {
      return;
    }
    Completer outer = INSIDE.get();
    INSIDE.set(this);
    Workers workers = new Workers();
    try {
      long backoff = 0;
      while (!workers.ending()) {
        long before = workers.progress.get();
        long wait = pollInterval.toNanos();
        try {
          pass(workers);
          backoff = 0;
          if (workers.progress.get() > before) {
            continue;
          }
        } catch (RuntimeException e) {
          if (interrupted(e) || Thread.currentThread().isInterrupted()) {
            workers.interrupted = true;
            break;
          }
          if (workers.ending()) {
            break;
          }
          if (!passAgain(e)) {
            throw e;
          }
          backoff = Math.min(Math.max(2 * backoff, FIRST_BACKOFF_NANOS), MAX_BACKOFF_NANOS);
          wait = backoff / 2 + ThreadLocalRandom.current().nextLong(backoff - backoff / 2 + 1);
          if (e instanceof IdemProblemException p
              && p.retryAfter().isPresent()
              && p.retryAfter().get().toNanos() > wait) {
            wait = p.retryAfter().get().toNanos();
          }
          report("", e);
        }
        workers.pause(wait);
      }
    } finally {
      workers.drain();
      INSIDE.set(outer);
      exit();
    }
  }

  /**
   * Stops the completer for good, without waiting: run and the passes of runOnce take no more keys
   * and return once their handlers in flight have returned. Later calls of run and runOnce return
   * at once.
   */
  public void stop() {
    synchronized (lock) {
      stopped = true;
      lock.notifyAll();
    }
  }

  /** Whether {@link #stop} or {@link #close} was called. */
  public boolean isStopped() {
    synchronized (lock) {
      return stopped;
    }
  }

  /**
   * Stops the completer and waits until every run and runOnce under way has returned, hence until
   * their handlers in flight have returned and their results are stored. Called from a handler or
   * from onError, where waiting would wait for itself, it only stops. An interrupt does not cut the
   * wait short, and is kept.
   */
  @Override
  public void close() {
    stop();
    if (INSIDE.get() == this) {
      return;
    }
    boolean interrupted = false;
    synchronized (lock) {
      while (active > 0) {
        try {
          lock.wait();
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
    }
    if (interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  private boolean enter() {
    synchronized (lock) {
      if (stopped) {
        return false;
      }
      active++;
      return true;
    }
  }

  private void exit() {
    synchronized (lock) {
      active--;
      lock.notifyAll();
    }
  }

  /**
   * Reads every page of the feed and hands each key that is not running already to the workers,
   * once in the pass. Returns how many it handed out; stops early when the workers end.
   */
  private int pass(Workers workers) {
    Set<String> seen = new HashSet<>();
    int handed = 0;
    Iterator<AbandonedKey> keys =
        client.abandonedKeys(AbandonedQuery.of(prefix).withOlderThan(olderThan)).iterator();
    while (!workers.ending() && keys.hasNext()) {
      AbandonedKey k = keys.next();
      // A page read later may list again a key that was given up meanwhile; one run a pass
      // is enough.
      if (!seen.add(k.key())) {
        continue;
      }
      Handed h = workers.hand(k);
      if (h == Handed.ENDED) {
        break;
      }
      if (h == Handed.TAKEN) {
        handed++;
      }
    }
    return handed;
  }

  /** What the workers did with a key handed to them. */
  private enum Handed {
    TAKEN,
    // Running already, from an earlier pass of run: left alone.
    RUNNING,
    // The workers ended first: nothing more is taken.
    ENDED
  }

  /** What became of one key a completer took. */
  private enum Outcome {
    FINISHED,
    FAILED,
    SKIPPED,
    ERROR
  }

  /**
   * Runs the handler for k by run's path, claiming with the listed fingerprint, and says how it
   * went. A key that could not be finished goes to onError.
   */
  private Outcome finish(AbandonedKey k) {
    boolean[] ran = {false};
    Throwable[] thrown = {null};
    Work<Object> work =
        held -> {
          ran[0] = true;
          try {
            return handler.run(held);
          } catch (Exception | Error e) {
            thrown[0] = e;
            throw e;
          }
        };
    RunOptions options =
        new RunOptions(k.fingerprint().isEmpty() ? null : k.fingerprint(), lease, null);
    try {
      IdemClient.Ran<Object> r =
          client.claimAndRun(k.key(), options, work, this::stored, this::storedFailure, false);
      // A claim that found the key finished, completed or failed, ran nothing.
      return r.finished() != null ? Outcome.SKIPPED : Outcome.FINISHED;
    } catch (InProgressException e) {
      if (!ran[0]) {
        // Another caller or completer holds the key.
        return Outcome.SKIPPED;
      }
      report(k.key(), e);
      return Outcome.ERROR;
    } catch (PermanentException e) {
      if (ran[0] && e == thrown[0]) {
        // The failure is stored: claimAndRun threw the handler's own exception after it.
        return Outcome.FAILED;
      }
      report(k.key(), e);
      return Outcome.ERROR;
    } catch (RuntimeException | Error e) {
      report(k.key(), e);
      if (e instanceof VirtualMachineError fatal) {
        throw fatal;
      }
      return Outcome.ERROR;
    }
  }

  /** A handler's value as the key's result: a StoredResponse as it is, any other as run stores. */
  private StoredResponse stored(Object value) throws Exception {
    return value instanceof StoredResponse r ? r : client.valueAsJson(value);
  }

  /** A handler's PermanentException as the key's failure: its value as it is, or as run stores. */
  private StoredResponse storedFailure(PermanentException e) {
    return e.value() instanceof StoredResponse r ? r : client.failureAsJson(e);
  }

  /** Reports an error to onError; a hook that throws changes nothing. */
  private void report(String key, Throwable e) {
    if (onError == null) {
      return;
    }
    try {
      onError.accept(key, e);
    } catch (RuntimeException hook) {
      // The error is counted; a hook's failure is the hook's.
    }
  }

  /**
   * Whether a pass failed because idemd could not answer, or not now, rather than because it
   * refused.
   */
  private static boolean passAgain(RuntimeException e) {
    return e instanceof UnavailableException
        || (e instanceof IdemProblemException p && (p.status() == 429 || p.status() >= 500));
  }

  private static boolean interrupted(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof InterruptedException) {
        return true;
      }
    }
    return false;
  }

  /**
   * The handlers of one run or runOnce: at most concurrency at once, on threads of their own, and a
   * key at most once at a time.
   */
  private final class Workers {
    private final ExecutorService pool;
    // Guarded by lock.
    private final Set<String> running = new HashSet<>();
    private int busy;
    private boolean ended;
    // Set when the thread of run or runOnce was interrupted, to interrupt it again at the end.
    boolean interrupted;

    final AtomicInteger finished = new AtomicInteger();
    final AtomicInteger failed = new AtomicInteger();
    final AtomicInteger skipped = new AtomicInteger();
    final AtomicInteger errors = new AtomicInteger();
    // The keys finished or failed, which tells run that another pass may find more at once.
    final AtomicLong progress = new AtomicLong();

    Workers() {
      AtomicInteger n = new AtomicInteger();
      this.pool =
          Executors.newFixedThreadPool(
              concurrency,
              r -> {
                Thread t = new Thread(r, "idemd-completer-" + n.incrementAndGet());
                t.setDaemon(true);
                return t;
              });
    }

    /** Whether the completer was stopped or this run's thread interrupted. */
    boolean ending() {
      synchronized (lock) {
        return stopped || ended;
      }
    }

    /** Hands k to a worker once one is free, unless it is running already or the workers end. */
    Handed hand(AbandonedKey k) {
      synchronized (lock) {
        while (busy >= concurrency && !stopped && !ended) {
          try {
            lock.wait();
          } catch (InterruptedException e) {
            interrupted = true;
            ended = true;
          }
        }
        if (stopped || ended) {
          return Handed.ENDED;
        }
        if (!running.add(k.key())) {
          return Handed.RUNNING;
        }
        busy++;
      }
      pool.execute(() -> work(k));
      return Handed.TAKEN;
    }

    private void work(AbandonedKey k) {
      INSIDE.set(Completer.this);
      try {
        switch (finish(k)) {
          case FINISHED -> {
            finished.incrementAndGet();
            progress.incrementAndGet();
          }
          case FAILED -> {
            failed.incrementAndGet();
            progress.incrementAndGet();
          }
          case SKIPPED -> skipped.incrementAndGet();
          case ERROR -> errors.incrementAndGet();
        }
      } finally {
        INSIDE.remove();
        synchronized (lock) {
          busy--;
          running.remove(k.key());
          lock.notifyAll();
        }
      }
    }

    /** Waits up to nanos, or until the workers end. */
    void pause(long nanos) {
      long until = System.nanoTime() + nanos;
      synchronized (lock) {
        for (long left = nanos; left > 0 && !stopped && !ended; left = until - System.nanoTime()) {
          try {
            TimeUnit.NANOSECONDS.timedWait(lock, left);
          } catch (InterruptedException e) {
            interrupted = true;
            ended = true;
          }
        }
      }
    }

    /**
     * Takes no more keys, waits for the handlers in flight to return (an interrupt does not cut the
     * wait short: their results must be stored), and stops the threads.
     */
    void drain() {
      synchronized (lock) {
        ended = true;
        while (busy > 0) {
          try {
            lock.wait();
          } catch (InterruptedException e) {
            interrupted = true;
          }
        }
      }
      pool.shutdown();
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }

    CompleterStats stats(int listed) {
      return new CompleterStats(listed, finished.get(), failed.get(), skipped.get(), errors.get());
    }
  }

  /** Sets up a Completer. */
  public static final class Builder {
    private final IdemClient client;
    private String prefix = "";
    private boolean allKeys;
    private Duration olderThan = Duration.ZERO;
    private int concurrency = DEFAULT_CONCURRENCY;
    private Duration lease = DEFAULT_LEASE;
    private Duration pollInterval = DEFAULT_POLL_INTERVAL;
    private Work<?> handler;
    private BiConsumer<String, Throwable> onError;

    private Builder(IdemClient client) {
      this.client = Objects.requireNonNull(client, "client");
    }

    /**
     * Selects the keys to finish: those that begin with prefix, such as a filter's keyPrefix or the
     * keys a service gives run for one kind of work. One handler finishes them all, so they must be
     * work of one kind. Required, non-empty, unless {@link #allKeys()}.
     */
    public Builder prefix(String prefix) {
      this.prefix = prefix == null ? "" : prefix;
      return this;
    }

    /**
     * Lets the prefix be empty, and the completer take every abandoned key of the tenant. It is a
     * choice of its own so that a prefix left empty by mistake is an error rather than a completer
     * that runs its handler on every other kind of work.
     */
    public Builder allKeys() {
      this.allKeys = true;
      return this;
    }

    /**
     * Leaves alone the keys whose lease ran out less than this long ago, to give their own callers
     * time to retry first, say; default 0.
     */
    public Builder olderThan(Duration olderThan) {
      this.olderThan = Objects.requireNonNull(olderThan, "olderThan");
      return this;
    }

    /** How many handlers run at once; default 4. */
    public Builder concurrency(int concurrency) {
      this.concurrency = concurrency;
      return this;
    }

    /**
     * The lease each handler runs under, renewed every lease/3 while it runs (100 ms to 1 h);
     * default 30 s. It is also how long a key whose handler failed waits before the feed lists it
     * again.
     */
    public Builder lease(Duration lease) {
      this.lease = Objects.requireNonNull(lease, "lease");
      return this;
    }

    /** How long run waits before the next pass once a pass finished nothing; default 5 s. */
    public Builder pollInterval(Duration pollInterval) {
      this.pollInterval = Objects.requireNonNull(pollInterval, "pollInterval");
      return this;
    }

    /**
     * Finishes, or compensates, the work of one abandoned key; required. It gets the lease and
     * returns the key's result, as the work given to run does (see {@link Completer}).
     */
    public Builder handler(Work<?> handler) {
      this.handler = handler;
      return this;
    }

    /**
     * Called with every error the completer meets and does not throw: a key whose handler failed or
     * whose result could not be stored (with its key), and in run a pass that could not read the
     * feed (with the key ""). It runs on the completer's threads.
     */
    public Builder onError(BiConsumer<String, Throwable> onError) {
      this.onError = onError;
      return this;
    }

    /**
     * Builds the completer; throws when the handler is missing, the prefix is missing without
     * allKeys (or given with it), over 255 bytes or not valid UTF-8, or an option is out of range.
     */
    public Completer build() {
      if (handler == null) {
        throw new IllegalStateException("idem: a Completer needs a handler");
      }
      if (prefix.isEmpty() && !allKeys) {
        throw new IllegalStateException(
            "idem: a Completer needs a prefix; call allKeys() to finish every abandoned key with"
                + " one handler");
      }
      if (!prefix.isEmpty() && allKeys) {
        throw new IllegalStateException("idem: a Completer takes a prefix or allKeys(), not both");
      }
      if (!StandardCharsets.UTF_8.newEncoder().canEncode(prefix)
          || prefix.getBytes(StandardCharsets.UTF_8).length > MAX_KEY_BYTES) {
        throw new IllegalArgumentException(
            "idem: the prefix must be valid UTF-8 of at most " + MAX_KEY_BYTES + " bytes");
      }
      if (olderThan.isNegative()) {
        throw new IllegalArgumentException("idem: olderThan must not be negative");
      }
      if (concurrency < 1) {
        throw new IllegalArgumentException("idem: concurrency must be at least 1");
      }
      if (lease.compareTo(MIN_LEASE) < 0 || lease.compareTo(MAX_LEASE) > 0) {
        throw new IllegalArgumentException(
            "idem: lease is " + lease + "; idemd's leases last 100 ms to 1 h");
      }
      if (pollInterval.isNegative() || pollInterval.isZero()) {
        throw new IllegalArgumentException("idem: pollInterval must be positive");
      }
      return new Completer(this);
    }
  }
}
