package io.idemd;

import java.util.Optional;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The lease an operation runs under, handed to the work given to run, once and consume, and to
 * handlers behind the Idempotency-Key filter. attempt and recovered let the work make its effect
 * happen once (docs/effects.md): attempt grows by one at every acquisition of the key, a fencing
 * token; recovered says that this lease took the key over from a holder whose lease ran out, which
 * may have done part of the work.
 */
public final class Lease {
  private static final ThreadLocal<Lease> CURRENT = new ThreadLocal<>();

  private final String key;
  private final long attempt;
  private final boolean recovered;
  private final AtomicReference<LeaseLostException> lost = new AtomicReference<>();

  Lease(String key, long attempt, boolean recovered) {
    this.key = key;
    this.attempt = attempt;
    this.recovered = recovered;
  }

  /** The idemd key the lease is on; behind the filter, the key it derived. */
  public String key() {
    return key;
  }

  public long attempt() {
    return attempt;
  }

  public boolean recovered() {
    return recovered;
  }

  /** Whether the lease was lost while the work ran: another caller may hold the key now. */
  public boolean isLost() {
    return lost.get() != null;
  }

  /** Throws the LeaseLostException when the lease was lost; work calls it before each effect. */
  public void checkLive() {
    LeaseLostException e = lost.get();
    if (e != null) {
      throw e;
    }
  }

  /** The lease of the work running on this thread (run, once, consume or the filter), if any. */
  public static Optional<Lease> current() {
    return Optional.ofNullable(CURRENT.get());
  }

  void lose(LeaseLostException e) {
    lost.compareAndSet(null, e);
  }

  LeaseLostException lostWith() {
    return lost.get();
  }

  /** Makes this the current lease until the returned scope is closed. */
  Scope enter() {
    Lease previous = CURRENT.get();
    CURRENT.set(this);
    return () -> {
      if (previous == null) {
        CURRENT.remove();
      } else {
        CURRENT.set(previous);
      }
    };
  }

  @Override
  public String toString() {
    return "Lease[key=" + key + ", attempt=" + attempt + ", recovered=" + recovered + "]";
  }

  /** The extent of a current lease. */
  interface Scope extends AutoCloseable {
    @Override
    void close();
  }
}
