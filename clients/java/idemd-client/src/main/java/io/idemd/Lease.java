package io.idemd;

import java.time.Duration;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The lease an operation runs under, handed to the work given to run, once and consume, and to
 * handlers behind the Idempotency-Key filter. attempt and recovered let the work make its effect
 * happen once (docs/effects.md): attempt grows by one at every acquisition of the key, a fencing
 * token; recovered says that this lease took the key over from a holder whose lease ran out, which
 * may have done part of the work. {@link #recoveryPoint()} and {@link #checkpoint} let the work
 * resume where an earlier holder stopped instead of starting over.
 *
 * <p>The lease ends when idemd answers that it is gone, and also, without any answer, at its local
 * deadline: the send time of the claim or of the last renewal idemd answered, plus 95 % of the
 * lease. idemd starts the lease when it receives the call, after it was sent, so the network is
 * already on the holder's side; the 5 % leave room for the two clocks running at different rates. A
 * holder cut off from idemd thus stops believing it holds the key before idemd hands it to another
 * caller.
 */
public final class Lease {
  private static final ThreadLocal<Lease> CURRENT = new ThreadLocal<>();

  private final String key;
  private final long attempt;
  private final boolean recovered;
  private final long leaseNanos;
  private final Optional<RecoveryPoint> recoveryPoint;
  // The client that holds the lease and the lease's token, which a checkpoint is recorded
  // under; null for a lease no call handed out.
  private final IdemClient client;
  private final String leaseToken;
  private final AtomicReference<LeaseLostException> lost = new AtomicReference<>();

  // On the System.nanoTime() clock. It only moves while the lease is live, under this lock,
  // so that a renewal answered just as the deadline passes cannot revive an expired lease.
  private final Object lock = new Object();
  private volatile long deadline;
  // Set once the work is over: the key is finished or released, and the lease says what it
  // was when the work ended rather than running out afterwards.
  private volatile boolean ended;

  Lease(String key, long attempt, boolean recovered, Duration lease, long sentAtNanos) {
    this(key, attempt, recovered, lease, sentAtNanos, Optional.empty(), null, null);
  }

  Lease(
      String key,
      long attempt,
      boolean recovered,
      Duration lease,
      long sentAtNanos,
      Optional<RecoveryPoint> recoveryPoint,
      IdemClient client,
      String leaseToken) {
    this.key = key;
    this.attempt = attempt;
    this.recovered = recovered;
    this.leaseNanos = lease.toNanos();
    this.deadline = sentAtNanos + reckoned(leaseNanos);
    this.recoveryPoint = recoveryPoint;
    this.client = client;
    this.leaseToken = leaseToken;
  }

  /** The part of a lease the holder counts on: 95 %, the rest being the clocks' margin. */
  static long reckoned(long leaseNanos) {
    return leaseNanos - leaseNanos / 20;
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

  /**
   * The last point an earlier holder of the key recorded with {@link #checkpoint}, which this lease
   * starts from: a takeover (recovered) and a claim after a release for a retry hand it on. Empty
   * when no holder recorded one; completing or failing the key drops it.
   */
  public Optional<RecoveryPoint> recoveryPoint() {
    return recoveryPoint;
  }

  /**
   * Records a recovery point under this lease: name says how far the work got (1 to 128 bytes of
   * UTF-8, such as "charged") and data what the next holder needs to go on from there (at most the
   * daemon's --max-recovery-point-bytes, 4096 by default; null or empty records none). It replaces
   * the point recorded before. Should this holder not finish the key, the next one finds the point
   * in its {@link #recoveryPoint()}: record one right after each effect that must not be made
   * twice, with what identifies it.
   *
   * <p>When idemd answers that the lease is gone (the key was taken over, finished or purged),
   * checkpoint throws a LeaseLostException and loses the lease as a renewal answered so does:
   * {@link #isLost()} turns true, the renewals stop, and run, once, consume or the filter store
   * nothing. A lease that is lost already, or whose work is over, throws without asking idemd. Data
   * over the daemon's limit is a {@link PayloadTooLargeException}: nothing is recorded and the
   * lease goes on. Other failures (an UnavailableException) leave the lease as it is. The call goes
   * to idemd on its own, never in a batch.
   */
  public void checkpoint(String name, byte[] data) {
    Objects.requireNonNull(name, "name");
    checkLive();
    if (ended) {
      throw new LeaseLostException(
          new IdemProblemException.Problem(
              0,
              "lease_lost",
              "Lease ended",
              "",
              "the work under the lease on \"" + key + "\" is over, and the lease ended with it",
              null),
          null);
    }
    if (client == null) {
      throw new IllegalStateException(
          "idem: checkpoint needs a lease handed out by run, once, consume, the filter or a"
              + " Completer");
    }
    try {
      client.recordRecoveryPoint(key, leaseToken, name, data);
    } catch (LeaseLostException | NotFoundException e) {
      LeaseLostException gone =
          new LeaseLostException(
              new IdemProblemException.Problem(
                  e.status(),
                  "lease_lost",
                  "Lease lost",
                  "",
                  "\""
                      + key
                      + "\" was taken over, or is gone, before its recovery point \""
                      + name
                      + "\" was recorded",
                  null),
              e);
      synchronized (lock) {
        // Once the work is over the lease stays as the work last saw it (see end).
        if (!ended) {
          lost.compareAndSet(null, gone);
        }
      }
      throw gone;
    }
  }

  /** Records a recovery point with no data; see {@link #checkpoint(String, byte[])}. */
  public void checkpoint(String name) {
    checkpoint(name, null);
  }

  /**
   * Whether the lease was lost while the work ran: idemd answered that it is gone, or its local
   * deadline passed with no renewal answered. Another caller may hold the key now.
   */
  public boolean isLost() {
    return lostWith() != null;
  }

  /**
   * Throws the LeaseLostException when the lease was lost (a LeaseExpiredException when its
   * deadline passed unrenewed); work calls it before each effect.
   */
  public void checkLive() {
    LeaseLostException e = lostWith();
    if (e != null) {
      throw e;
    }
  }

  /**
   * The time the lease has left by the local deadline; zero once it is lost, and once the work it
   * was handed to is over. Work bounds a call to another service by it (a provider request's
   * timeout, say), so that the call does not outlive the lease.
   */
  public Duration remaining() {
    if (isLost() || ended) {
      return Duration.ZERO;
    }
    return Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
  }

  /**
   * The local deadline, on the {@link System#nanoTime()} clock: when the lease ends unless a
   * renewal is answered first. Each answered renewal moves it to that renewal's send time plus 95 %
   * of the lease.
   */
  public long deadlineNanos() {
    return deadline;
  }

  /** The lease of the work running on this thread (run, once, consume or the filter), if any. */
  public static Optional<Lease> current() {
    return Optional.ofNullable(CURRENT.get());
  }

  void lose(LeaseLostException e) {
    lost.compareAndSet(null, e);
  }

  /**
   * Moves the deadline for a renewal sent at sentAtNanos that idemd answered. Returns false, and
   * moves nothing, when the lease is already lost: an answer that comes after the deadline does not
   * save the lease, since another caller may have taken the key over meanwhile.
   */
  boolean renewed(long sentAtNanos) {
    synchronized (lock) {
      if (lostWith() != null || ended) {
        return false;
      }
      deadline = Math.max(deadline, sentAtNanos + reckoned(leaseNanos));
      return true;
    }
  }

  /**
   * Ends the lease with the work: from now on it stays as the work last saw it, lost or not, since
   * whether the work's result counts was decided then.
   */
  void end() {
    synchronized (lock) {
      ended = true;
    }
  }

  /** The exception the lease was lost with, or null while it is live. */
  LeaseLostException lostWith() {
    LeaseLostException e = lost.get();
    if (e != null || ended || System.nanoTime() - deadline < 0) {
      return e;
    }
    // Decided under the lock, so that no renewal moves the deadline between this check and
    // the lease's end.
    synchronized (lock) {
      if (lost.get() == null && !ended && System.nanoTime() - deadline >= 0) {
        lost.compareAndSet(
            null,
            new LeaseExpiredException(
                new IdemProblemException.Problem(
                    0,
                    "lease_lost",
                    "Lease expired",
                    "",
                    "no renewal of \""
                        + key
                        + "\" was answered before the lease's local deadline; another caller may"
                        + " hold it now",
                    null),
                null));
      }
      return lost.get();
    }
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
    return "Lease[key="
        + key
        + ", attempt="
        + attempt
        + ", recovered="
        + recovered
        + recoveryPoint.map(p -> ", recoveryPoint=" + p.name()).orElse("")
        + "]";
  }

  /** The extent of a current lease. */
  interface Scope extends AutoCloseable {
    @Override
    void close();
  }
}
