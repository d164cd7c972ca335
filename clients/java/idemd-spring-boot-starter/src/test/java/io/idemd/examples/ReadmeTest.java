package io.idemd.examples;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.IdemClient;
import io.idemd.RunResult;
import io.idemd.Verdict;
import io.idemd.servlet.IdempotencyFilter;
import io.idemd.spring.IdemdAutoConfiguration;
import io.idemd.testing.Daemon;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.test.context.runner.WebApplicationContextRunner;

/** The README's "From Java" section: its snippets run, and are cut from Readme.java. */
class ReadmeTest {
  private static Daemon daemon;
  private static IdemClient client;

  @BeforeAll
  static void start() throws Exception {
    daemon = Daemon.start();
    client = Readme.client(daemon.url);
  }

  @AfterAll
  static void stop() {
    client.close();
    daemon.close();
  }

  private static String section() throws IOException {
    String readme = Files.readString(Path.of("..", "..", "..", "README.md"));
    String from = readme.substring(readme.indexOf("## From Java"));
    return from.substring(0, from.indexOf("\n## ", 3));
  }

  private static List<String> blocks(String language) throws IOException {
    return blocks(language, section());
  }

  private static List<String> blocks(String language, String text) {
    List<String> out = new ArrayList<>();
    Matcher m = Pattern.compile("```" + language + "\n([\\s\\S]*?)```").matcher(text);
    while (m.find()) {
      out.add(m.group(1));
    }
    return out;
  }

  @Test
  void theRunExampleSendsOnceAndReplays() {
    List<String> sent = new ArrayList<>();
    Readme.Mailer mailer =
        to -> {
          sent.add(to);
          return new Readme.Receipt("m-" + sent.size());
        };
    RunResult<Readme.Receipt> first = Readme.runOnce(client, mailer);
    RunResult<Readme.Receipt> second = Readme.runOnce(client, mailer);
    assertFalse(first.replayed());
    assertTrue(second.replayed());
    assertEquals(new Readme.Receipt("m-1"), second.value());
    assertEquals(List.of("user-42@example.org"), sent);
  }

  @Test
  void theQueueExampleHandlesARedeliveredMessageOnce() {
    AtomicInteger handled = new AtomicInteger();
    List<String> actions = new ArrayList<>();
    Readme.Channel channel =
        new Readme.Channel() {
          @Override
          public void ack() {
            actions.add("ack");
          }

          @Override
          public void requeueAfter(Duration delay) {
            actions.add("requeue");
          }

          @Override
          public void deadLetter() {
            actions.add("dead-letter");
          }
        };
    String id = UUID.randomUUID().toString();
    Verdict first =
        Readme.consume(client, "orders", 0, id, channel, lease -> handled.incrementAndGet());
    Verdict again =
        Readme.consume(client, "orders", 0, id, channel, lease -> handled.incrementAndGet());
    assertTrue(first.ran());
    assertFalse(again.ran());
    assertEquals(List.of("ack", "ack"), actions);
    assertEquals(1, handled.get());
  }

  @Test
  void theFilterExampleBuilds() {
    IdempotencyFilter filter = Readme.filter(client);
    assertTrue(filter != null);
  }

  @Test
  void theReadmesPropertiesConfigureTheStarter() throws IOException {
    List<String> properties = new ArrayList<>();
    for (String block : blocks("properties")) {
      for (String line : block.split("\n")) {
        if (!line.isBlank() && !line.startsWith("#")) {
          properties.add(line.startsWith("idemd.url=") ? "idemd.url=" + daemon.url : line);
        }
      }
    }
    assertThat(properties).anyMatch(p -> p.startsWith("idemd.idempotency.scope="));
    new WebApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(IdemdAutoConfiguration.class))
        .withPropertyValues(properties.toArray(new String[0]))
        .run(
            context ->
                assertThat(context)
                    .hasNotFailed()
                    .hasBean("idempotencyFilter")
                    .hasSingleBean(IdemClient.class));
  }

  private static List<String> regions() throws IOException {
    String source = Files.readString(Path.of("src/test/java/io/idemd/examples/Readme.java"));
    List<String> regions = new ArrayList<>();
    Matcher m =
        Pattern.compile("// #region readme-[\\w-]+\n([\\s\\S]*?)\n\\s*// #endregion")
            .matcher(source);
    while (m.find()) {
      regions.add(m.group(1).replaceAll("(?m)^    ", ""));
    }
    return regions;
  }

  @Test
  void theSealingExampleSealsWhatItStoresAndOpensItsReplay() throws Exception {
    byte[] key = new byte[32];
    new java.security.SecureRandom().nextBytes(key);
    String keys = "k-2026-11=" + java.util.Base64.getEncoder().encodeToString(key);
    String k = "readme-sealing-" + UUID.randomUUID();
    try (IdemClient sealing = Readme.sealing(daemon.url, keys)) {
      assertFalse(sealing.run(k, String.class, lease -> "secret").replayed());
      assertEquals("secret", sealing.run(k, String.class, lease -> "ran twice").value());
    }
    com.fasterxml.jackson.databind.JsonNode response =
        io.idemd.testing.Raw.record(daemon, k).path("response");
    assertTrue(response.has("sealed"), response.toString());
    assertFalse(response.has("body"), response.toString());
  }

  @Test
  void theJavaClientsReadmeShowsTheExamplesCode() throws IOException {
    String readme = Files.readString(Path.of("..", "README.md"));
    List<String> blocks = blocks("java", readme);
    assertFalse(blocks.isEmpty(), "no java blocks in clients/java/README.md");
    List<String> regions = regions();
    for (String block : blocks) {
      for (String line : block.split("\n")) {
        if (line.isBlank() || line.startsWith("import ")) {
          continue;
        }
        assertTrue(
            regions.stream().anyMatch(r -> List.of(r.split("\n")).contains(line)),
            "clients/java/README.md line not cut from Readme.java: " + line);
      }
    }
  }

  @Test
  void theReadmeShowsTheExamplesCode() throws IOException {
    List<String> regions = regions();
    List<String> blocks = blocks("java");
    assertFalse(blocks.isEmpty(), "no java blocks in the README's From Java section");
    for (String block : blocks) {
      for (String line : block.split("\n")) {
        if (line.isBlank() || line.startsWith("import ")) {
          continue;
        }
        assertTrue(
            regions.stream().anyMatch(r -> List.of(r.split("\n")).contains(line)),
            "README line not cut from Readme.java: " + line);
      }
    }
  }
}
