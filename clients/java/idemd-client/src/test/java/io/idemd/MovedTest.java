package io.idemd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.testing.Moving;
import java.time.Duration;
import java.util.UUID;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * A key whose record is being moved to another store answers 503 store_moved. The key is not free:
 * the client throws an IdemProblemException with the daemon's wait, not an UnavailableException, so
 * that nothing treats it as an outage to run the operation through.
 */
class MovedTest {
  private static void moved(String what, Executable call) {
    IdemProblemException e = assertThrows(IdemProblemException.class, call, what);
    assertEquals(503, e.status(), what + ": " + e);
    assertEquals("store_moved", e.code(), what + ": " + e);
    assertTrue(
        e.retryAfter().orElse(Duration.ZERO).compareTo(Duration.ZERO) > 0,
        what + ": no wait in " + e);
    for (Class<?> not :
        new Class<?>[] {
          UnavailableException.class, LeaseLostException.class, NotFoundException.class
        }) {
      assertFalse(not.isInstance(e), what + ": " + e + " is a " + not.getSimpleName());
    }
  }

  @Test
  void aMovingKeyIsAProblemWithAWaitNotUnavailable() throws Exception {
    try (Moving moving = Moving.start();
        IdemClient c = IdemClient.builder(moving.daemon.url).retries(0).build()) {
      String key = "java-moved-" + UUID.randomUUID();
      Claim.Acquired held =
          assertInstanceOf(
              Claim.Acquired.class,
              c.claim(key, ClaimOptions.DEFAULT.withLease(Duration.ofMinutes(1))));
      moving.mark(key);
      moved("claim", () -> c.claim(key));
      moved("extend", () -> c.extend(key, held.leaseToken(), Duration.ofMinutes(1)));
      moved(
          "complete",
          () -> c.complete(key, held.leaseToken(), StoredResponse.of(200, "text/plain", "done")));
      moved("lookup", () -> c.lookup(key));
    }
  }
}
