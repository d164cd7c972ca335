package io.idemd.spring;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.idemd.Claim;
import io.idemd.ClaimOptions;
import io.idemd.IdemClient;
import io.idemd.Idempotency;
import io.idemd.KeyRing;
import io.idemd.RunResult;
import io.idemd.SealKey;
import io.idemd.StoredResponse;
import io.idemd.UnsealableException;
import io.idemd.servlet.Incident;
import io.idemd.testing.Daemon;
import io.idemd.testing.Raw;
import io.idemd.testing.Wait;
import jakarta.servlet.http.HttpServletRequest;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BiConsumer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.context.runner.WebApplicationContextRunner;
import org.springframework.context.annotation.Bean;
import org.springframework.core.env.StandardEnvironment;
import org.springframework.core.env.SystemEnvironmentPropertySource;
import org.springframework.http.ResponseEntity;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * The starter's sealing, from idemd.seal.* (IDEMD_SEAL_KEYS, IDEMD_SEAL_TENANT): an application on
 * a random port against a real idemd stores its answers sealed and replays them identically; an
 * answer sealed with a key its ring lacks is P5; a ring that is wrong stops the application.
 */
@SpringBootTest(
    classes = SealingStarterTest.App.class,
    webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT,
    properties = {"idemd.idempotency.scope=principal", "idemd.seal.tenant=payments"})
class SealingStarterTest {
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final SealKey KEY = sealKey("k-2026-11");
  private static final SealKey OTHER = sealKey("k-other");
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

  private static SealKey sealKey(String id) {
    byte[] key = new byte[32];
    RANDOM.nextBytes(key);
    return new SealKey(id, key);
  }

  private static String text(SealKey... keys) {
    StringBuilder b = new StringBuilder("# the ring\n");
    for (SealKey k : keys) {
      b.append(k.id()).append('=').append(Base64.getEncoder().encodeToString(k.key())).append(",");
    }
    return b.toString();
  }

  @DynamicPropertySource
  static void idemd(DynamicPropertyRegistry registry) {
    registry.add("idemd.url", () -> daemon.url);
    registry.add("idemd.seal.keys", () -> text(KEY));
  }

  @AfterAll
  static void stop() {
    daemon.close();
  }

  @SpringBootApplication
  static class App {
    final AtomicInteger runs = new AtomicInteger();
    final List<Incident> incidents = new CopyOnWriteArrayList<>();

    @Bean
    BiConsumer<HttpServletRequest, Incident> incidents() {
      return (req, incident) -> incidents.add(incident);
    }

    @Bean
    org.springframework.boot.web.servlet.FilterRegistrationBean<jakarta.servlet.Filter>
        authenticate() {
      org.springframework.boot.web.servlet.FilterRegistrationBean<jakarta.servlet.Filter> r =
          new org.springframework.boot.web.servlet.FilterRegistrationBean<>(
              (request, response, chain) -> {
                HttpServletRequest req = (HttpServletRequest) request;
                String user = req.getHeader("X-User");
                chain.doFilter(
                    new jakarta.servlet.http.HttpServletRequestWrapper(req) {
                      @Override
                      public java.security.Principal getUserPrincipal() {
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
      ResponseEntity<Map<String, Object>> create(@RequestBody Map<String, Object> order) {
        int n = app.runs.incrementAndGet();
        return ResponseEntity.created(URI.create("/orders/" + n))
            .body(Map.of("order", n, "email", order.get("email")));
      }
    }
  }

  private HttpResponse<String> post(String key, String body) throws Exception {
    return http.send(
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/orders"))
            .header("Content-Type", "application/json")
            .header("X-User", "alice")
            .header("Idempotency-Key", key)
            .POST(HttpRequest.BodyPublishers.ofString(body))
            .build(),
        HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void answersAreStoredSealedAndReplayIdentically() throws Exception {
    String key = UUID.randomUUID().toString();
    String email = "ada-" + UUID.randomUUID() + "@example.com";
    String body = "{\"email\":\"" + email + "\"}";
    int before = app.runs.get();
    HttpResponse<String> first = post(key, body);
    assertEquals(201, first.statusCode(), first.body());
    assertThat(first.body()).contains(email);

    JsonNode record = Raw.record(daemon, Idempotency.idemdKey("alice", key));
    JsonNode response = record.path("response");
    assertEquals(201, response.path("status").asInt());
    assertFalse(response.has("body"), record.toString());
    assertFalse(response.has("headers"), record.toString());
    assertEquals(0xC1, Raw.bytes(response.path("sealed"))[0] & 0xFF);
    assertFalse(record.toString().contains(email));

    HttpResponse<String> replay = post(key, body);
    assertEquals(201, replay.statusCode());
    assertEquals(first.body(), replay.body());
    assertEquals("true", replay.headers().firstValue("Idempotent-Replayed").orElse(""));
    assertEquals(first.headers().firstValue("Location"), replay.headers().firstValue("Location"));
    assertEquals(before + 1, app.runs.get());
  }

  @Test
  void anAnswerSealedWithAKeyTheRingLacksIs502AndRunsNothing() throws Exception {
    String key = UUID.randomUUID().toString();
    String body = "{\"email\":\"bob@example.com\"}";
    // Another service of the tenant, whose ring this one does not share, answered first.
    String derived = Idempotency.idemdKey("alice", key);
    String fingerprint =
        Idempotency.fingerprint(
                new Idempotency.FingerprintInput(
                    "POST",
                    "/orders",
                    null,
                    "application/json",
                    null,
                    body.getBytes(StandardCharsets.UTF_8)))
            .fingerprint();
    try (IdemClient other =
        IdemClient.builder(daemon.url).sealing("payments", KeyRing.of(OTHER)).build()) {
      Claim.Acquired lease =
          (Claim.Acquired) other.claim(derived, ClaimOptions.DEFAULT.withFingerprint(fingerprint));
      other.complete(derived, lease.leaseToken(), StoredResponse.of(201, "application/json", "{}"));
    }
    int before = app.runs.get();
    HttpResponse<String> res = post(key, body);
    assertEquals(502, res.statusCode(), res.body());
    assertThat(res.body()).contains("\"code\":\"stored_response_unsealable\"");
    assertEquals(before, app.runs.get(), "the handler ran");
    Wait.until(
        "the incident is reported",
        () -> app.incidents.stream().anyMatch(i -> i.idemdKey().equals(derived)));
    Incident incident =
        app.incidents.stream().filter(i -> i.idemdKey().equals(derived)).findFirst().orElseThrow();
    assertEquals("replay_unsealable", incident.kind().label());
    UnsealableException e =
        assertInstanceOf(UnsealableException.class, incident.error().orElseThrow());
    assertEquals(UnsealableException.Reason.UNKNOWN_KEY, e.reason());
    assertEquals(OTHER.id(), e.keyId());
  }

  private static WebApplicationContextRunner runner() {
    return new WebApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(IdemdAutoConfiguration.class))
        .withPropertyValues("idemd.url=" + daemon.url, "idemd.idempotency.enabled=false");
  }

  @Test
  void theRingComesFromTheEnvironmentAsIdemdSealKeys() {
    runner()
        .withInitializer(
            context ->
                context
                    .getEnvironment()
                    .getPropertySources()
                    .addFirst(
                        new SystemEnvironmentPropertySource(
                            StandardEnvironment.SYSTEM_ENVIRONMENT_PROPERTY_SOURCE_NAME,
                            Map.of(
                                "IDEMD_SEAL_KEYS",
                                text(OTHER, KEY),
                                "IDEMD_SEAL_TENANT",
                                "payments",
                                "IDEMD_SEAL_REQUIRE_SEALED",
                                "true"))))
        .run(
            context -> {
              assertThat(context).hasNotFailed();
              IdemClient client = context.getBean(IdemClient.class);
              String key = "java-starter-seal-" + UUID.randomUUID();
              assertFalse(client.run(key, String.class, l -> "sealed").replayed());
              byte[] envelope = Raw.bytes(Raw.record(daemon, key).path("response").path("sealed"));
              // The first key of the ring seals.
              assertEquals(
                  OTHER.id(), new String(envelope, 3, envelope[2], StandardCharsets.UTF_8));
              RunResult<String> again = client.run(key, String.class, l -> "ran twice");
              assertTrue(again.replayed());
              assertEquals("sealed", again.value());
              // IDEMD_SEAL_REQUIRE_SEALED: a plain result is refused.
              String plainKey = "java-starter-plain-" + UUID.randomUUID();
              try (IdemClient plain = IdemClient.builder(daemon.url).build()) {
                plain.run(plainKey, String.class, l -> "plain");
              }
              UnsealableException e =
                  org.junit.jupiter.api.Assertions.assertThrows(
                      UnsealableException.class, () -> client.lookup(plainKey));
              assertEquals(UnsealableException.Reason.NOT_SEALED, e.reason());
            });
  }

  @Test
  void aRingThatCannotBeStopsTheApplication() {
    String secret = Base64.getEncoder().encodeToString(KEY.key());
    runner()
        .withPropertyValues("idemd.seal.keys=" + text(KEY))
        .run(
            context -> {
              assertThat(context).hasFailed();
              assertThat(context.getStartupFailure())
                  .rootCause()
                  .hasMessageContaining("idemd.seal.tenant");
            });
    runner()
        .withPropertyValues(
            "idemd.seal.keys=k1=" + secret + ",k1=" + secret, "idemd.seal.tenant=payments")
        .run(
            context -> {
              assertThat(context).hasFailed();
              assertThat(context.getStartupFailure())
                  .rootCause()
                  .hasMessageContaining("\"k1\" is in the ring twice")
                  .message()
                  .doesNotContain(secret);
            });
    runner()
        .withPropertyValues("idemd.seal.require-sealed=true")
        .run(
            context -> {
              assertThat(context).hasFailed();
              assertThat(context.getStartupFailure())
                  .rootCause()
                  .hasMessageContaining("idemd.seal.keys");
            });
  }
}
