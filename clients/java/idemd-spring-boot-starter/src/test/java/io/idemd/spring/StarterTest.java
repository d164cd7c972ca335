package io.idemd.spring;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.Lease;
import io.idemd.servlet.IdempotencyFilter;
import io.idemd.testing.Daemon;
import io.idemd.testing.Wait;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.security.Principal;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.context.runner.WebApplicationContextRunner;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.http.ResponseEntity;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * A Spring Boot application whose idemd part is configured only through properties, on a random
 * port, against a real idemd: the behaviour table's answers over real HTTP.
 */
@SpringBootTest(
    classes = StarterTest.App.class,
    webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT,
    properties = {"idemd.idempotency.scope=principal", "idemd.idempotency.key-prefix=orders/"})
class StarterTest {
  private static final Daemon daemon = start();
  private static final HttpClient http =
      HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

  @Value("${local.server.port}")
  int port;

  @Autowired App app;

  private static Daemon start() {
    try {
      return Daemon.start();
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }

  @DynamicPropertySource
  static void idemd(DynamicPropertyRegistry registry) {
    registry.add("idemd.url", () -> daemon.url);
  }

  @AfterAll
  static void stop() {
    daemon.close();
  }

  @SpringBootApplication
  static class App {
    final AtomicInteger runs = new AtomicInteger();
    final CountDownLatch entered = new CountDownLatch(1);
    final CountDownLatch release = new CountDownLatch(1);

    /** Authentication before the filter: the principal is the X-User header (a test's stand-in). */
    @Bean
    FilterRegistrationBean<Filter> authenticate() {
      FilterRegistrationBean<Filter> r =
          new FilterRegistrationBean<>(
              (request, response, chain) -> {
                HttpServletRequest req = (HttpServletRequest) request;
                String user = req.getHeader("X-User");
                chain.doFilter(
                    user == null
                        ? req
                        : new HttpServletRequestWrapper(req) {
                          @Override
                          public Principal getUserPrincipal() {
                            return () -> user;
                          }
                        },
                    response);
              });
      r.setOrder(-100);
      return r;
    }

    @RestController
    static class Orders {
      @Autowired App app;

      @PostMapping("/orders")
      ResponseEntity<Map<String, Object>> create(
          @RequestBody Map<String, Object> order, HttpServletRequest req) {
        int n = app.runs.incrementAndGet();
        Lease lease = IdempotencyFilter.lease(req).orElseThrow();
        return ResponseEntity.created(URI.create("/orders/" + n))
            .body(
                Map.of(
                    "order",
                    n,
                    "amount",
                    order.get("amount"),
                    "attempt",
                    lease.attempt(),
                    "user",
                    req.getUserPrincipal().getName(),
                    "key",
                    lease.key()));
      }

      @PostMapping("/slow")
      String slow() throws InterruptedException {
        app.entered.countDown();
        app.release.await(Wait.seconds(20), TimeUnit.SECONDS);
        return "slow " + app.runs.incrementAndGet();
      }
    }
  }

  private HttpResponse<String> post(String path, String user, String key, String body)
      throws Exception {
    return http.send(
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
            .header("Content-Type", "application/json")
            .header("X-User", user)
            .header("Idempotency-Key", key)
            .POST(HttpRequest.BodyPublishers.ofString(body))
            .build(),
        HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void theBehaviourTableThroughProperties() throws Exception {
    String key = UUID.randomUUID().toString();
    int before = app.runs.get();
    HttpResponse<String> first = post("/orders", "alice", key, "{\"amount\":100}");
    assertEquals(201, first.statusCode(), first.body());
    assertThat(first.body())
        .contains("\"attempt\":1")
        .contains("\"user\":\"alice\"")
        .contains("\"amount\":100");
    assertTrue(first.headers().firstValue("Idempotent-Replayed").isEmpty());
    // idemd.idempotency.key-prefix comes before the derived key, which lookup takes whole.
    String full = "orders/" + io.idemd.Idempotency.idemdKey("alice", key);
    assertThat(first.body()).contains("\"key\":\"" + full + "\"");
    try (io.idemd.IdemClient c = io.idemd.IdemClient.builder(daemon.url).build()) {
      assertEquals("completed", c.lookup(full).state());
    }

    // A replay: the same answer, marked, the handler not run again.
    HttpResponse<String> replay = post("/orders", "alice", key, "{\"amount\":100}");
    assertEquals(201, replay.statusCode());
    assertEquals(first.body(), replay.body());
    assertEquals("true", replay.headers().firstValue("Idempotent-Replayed").orElse(""));
    assertEquals(first.headers().firstValue("Location"), replay.headers().firstValue("Location"));

    // The key reused with another payload: 422.
    HttpResponse<String> other = post("/orders", "alice", key, "{\"amount\":999}");
    assertEquals(422, other.statusCode());
    assertThat(other.body()).contains("\"code\":\"fingerprint_mismatch\"");

    // Per-user scope: bob's request with the same key is his own.
    HttpResponse<String> bob = post("/orders", "bob", key, "{\"amount\":100}");
    assertEquals(201, bob.statusCode());
    assertThat(bob.body()).contains("\"user\":\"bob\"");
    assertTrue(bob.headers().firstValue("Idempotent-Replayed").isEmpty());
    assertEquals(before + 2, app.runs.get());
  }

  @Test
  void aConcurrentDuplicateIs409() throws Exception {
    String key = UUID.randomUUID().toString();
    CompletableFuture<HttpResponse<String>> first =
        CompletableFuture.supplyAsync(
            () -> {
              try {
                return post("/slow", "alice", key, "{}");
              } catch (Exception e) {
                throw new IllegalStateException(e);
              }
            });
    assertTrue(app.entered.await(Wait.seconds(20), TimeUnit.SECONDS));
    HttpResponse<String> dup = post("/slow", "alice", key, "{}");
    assertEquals(409, dup.statusCode());
    assertThat(dup.body()).contains("\"code\":\"in_progress\"");
    assertTrue(dup.headers().firstValue("Retry-After").isPresent());
    app.release.countDown();
    assertEquals(200, first.get(Wait.seconds(20), TimeUnit.SECONDS).statusCode());
  }

  @Test
  void aKeyPrefixTooLongForIdemdsKeysStopsTheApplication() {
    new WebApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(IdemdAutoConfiguration.class))
        .withPropertyValues(
            "idemd.url=http://127.0.0.1:9",
            "idemd.idempotency.scope=principal",
            "idemd.idempotency.key-prefix=" + "p".repeat(173))
        .run(
            context -> {
              assertThat(context).hasFailed();
              assertThat(context.getStartupFailure()).rootCause().hasMessageContaining("keyPrefix");
            });
  }

  @Test
  void withoutAScopeTheApplicationDoesNotStart() {
    new WebApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(IdemdAutoConfiguration.class))
        .withPropertyValues("idemd.url=http://127.0.0.1:9")
        .run(
            context -> {
              assertThat(context).hasFailed();
              assertThat(context.getStartupFailure())
                  .rootCause()
                  .hasMessageContaining("idemd.idempotency.scope=principal");
            });
    new WebApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(IdemdAutoConfiguration.class))
        .withPropertyValues("idemd.url=http://127.0.0.1:9", "idemd.idempotency.enabled=false")
        .run(
            context ->
                assertThat(context)
                    .hasNotFailed()
                    .doesNotHaveBean("idempotencyFilter")
                    .hasSingleBean(io.idemd.IdemClient.class));
  }
}
