package io.idemd.examples;

import io.idemd.IdemClient;
import io.idemd.KeyRing;
import io.idemd.Keys;
import io.idemd.RunResult;
import io.idemd.Task;
import io.idemd.Verdict;
import io.idemd.servlet.IdempotencyFilter;
import jakarta.servlet.http.HttpServletRequest;

/**
 * The README's "From Java" snippets, and those of clients/java/README.md, are cut from the regions
 * below (between "#region readme-NAME" and "#endregion"); ReadmeTest runs these methods against a
 * real idemd and checks that every line of the READMEs' Java blocks is in a region.
 */
public final class Readme {
  private Readme() {}

  /** What the example's email service answers. */
  public record Receipt(String messageId) {}

  /** The email service the run example calls. */
  public interface Mailer {
    Receipt sendEmail(String to) throws Exception;
  }

  public static IdemClient client(String baseUrl) {
    // #region readme-client
    IdemClient client = IdemClient.builder(baseUrl).token(System.getenv("IDEMD_TOKEN")).build();
    // #endregion
    return client;
  }

  public static IdemClient sealing(String baseUrl, String sealKeys) {
    // #region readme-sealing
    KeyRing ring = KeyRing.parse(sealKeys); // the text of IDEMD_SEAL_KEYS
    IdemClient client = IdemClient.builder(baseUrl).sealing("payments", ring).build();
    // #endregion
    return client;
  }

  public static RunResult<Receipt> runOnce(IdemClient client, Mailer mailer) {
    String key = "welcome-email:user-42";
    String to = "user-42@example.org";
    // #region readme-run
    RunResult<Receipt> result = client.run(key, Receipt.class, lease -> mailer.sendEmail(to));
    // result.replayed() is true when an earlier call already sent it; value() is what it returned.
    // #endregion
    return result;
  }

  /** What the queue example does with a delivery. */
  public interface Channel {
    void ack();

    void requeueAfter(java.time.Duration delay);

    void deadLetter();
  }

  public static Verdict consume(
      IdemClient client, String topic, int partition, String id, Channel channel, Task handle) {
    // #region readme-consume
    Verdict verdict = client.consume(Keys.messageKey(topic, String.valueOf(partition), id), handle);
    switch (verdict.action()) {
      case ACK -> channel.ack();
      case REQUEUE -> channel.requeueAfter(verdict.delay());
      case DEAD_LETTER -> channel.deadLetter();
    }
    // #endregion
    return verdict;
  }

  public static IdempotencyFilter filter(IdemClient client) {
    // #region readme-filter
    IdempotencyFilter filter =
        IdempotencyFilter.builder(client).scope(HttpServletRequest::getRemoteUser).build();
    // #endregion
    return filter;
  }
}
