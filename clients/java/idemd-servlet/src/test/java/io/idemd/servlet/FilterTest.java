package io.idemd.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.Claim;
import io.idemd.IdemClient;
import io.idemd.IdemProblemException;
import io.idemd.KeyRecord;
import io.idemd.Lease;
import io.idemd.LeaseExpiredException;
import io.idemd.QuotaExceededException;
import io.idemd.StoredResponse;
import io.idemd.testing.Daemon;
import io.idemd.testing.Moving;
import io.idemd.testing.Relay;
import io.idemd.testing.Wait;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.Principal;
import java.time.Duration;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The filter in a real Tomcat, over real HTTP, against a real idemd: docs/middleware.md's rows. */
class FilterTest {
  private static Daemon daemon;
  private static IdemClient client;
  static final HttpClient http =
      HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

  @BeforeAll
  static void start() throws Exception {
    daemon = Daemon.start();
    client = IdemClient.builder(daemon.url).build();
  }

  @AfterAll
  static void stop() {
    client.close();
    daemon.close();
  }

  /** What /large answers: 20 MiB of random bytes, the same on every run. */
  static final byte[] LARGE = new byte[20 << 20];

  static {
    new java.security.SecureRandom().nextBytes(LARGE);
  }

  /** The app behind the filter: every route counts its runs and records the lease it saw. */
  static final class App extends HttpServlet {
    private static final long serialVersionUID = 1L;
    final AtomicInteger runs = new AtomicInteger();
    final Map<String, Lease> leases = new ConcurrentHashMap<>();
    final CountDownLatch entered = new CountDownLatch(1);
    final CountDownLatch release = new CountDownLatch(1);
    volatile Relay relay;

    @Override
    protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
      int n = runs.incrementAndGet();
      String id = req.getHeader("X-Request-Id");
      IdempotencyFilter.lease(req).ifPresent(l -> leases.put(id == null ? "" : id, l));
      if (Lease.current().isPresent() != IdempotencyFilter.lease(req).isPresent()) {
        throw new IllegalStateException("Lease.current() and the request attribute disagree");
      }
      String body = new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      switch (req.getRequestURI()) {
        case "/orders" -> {
          res.setStatus(201);
          res.setContentType("application/json");
          res.setHeader("Location", "/orders/" + n);
          res.setHeader("X-Not-Stored", "yes");
          res.addHeader("Set-Cookie", "session=first-caller");
          res.getWriter()
              .write("{\"order\":" + n + ",\"body\":" + (body.isEmpty() ? "null" : body) + "}");
        }
        case "/invalid" -> res.sendError(422, "no");
        case "/crash" -> {
          res.setStatus(500);
          res.getWriter().write("down");
        }
        case "/throw" -> throw new IllegalStateException("the handler failed");
        case "/big" -> {
          res.setContentType("text/plain");
          res.getOutputStream().write(new byte[4096]);
        }
        case "/large" -> {
          res.setStatus(201);
          res.setContentType("application/octet-stream");
          res.getOutputStream().write(LARGE);
        }
        case "/form" -> res.getWriter().write("a=" + req.getParameter("a"));
        case "/block" -> {
          entered.countDown();
          try {
            release.await(Wait.seconds(20), TimeUnit.SECONDS);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
          }
          res.getWriter().write("blocked " + n);
        }
        case "/stream" -> {
          entered.countDown();
          try {
            release.await(Wait.seconds(20), TimeUnit.SECONDS);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
          }
          // The client has gone: a write soon fails, and the exception ends the handler.
          byte[] chunk = new byte[64 << 10];
          for (int i = 0; i < 1024; i++) {
            res.getOutputStream().write(chunk);
            res.flushBuffer();
          }
        }
        case "/lost" -> {
          Lease lease = Lease.current().orElseThrow();
          client.purge(lease.key());
          long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Wait.seconds(10));
          while (!lease.isLost() && System.nanoTime() < deadline) {
            try {
              Thread.sleep(5);
            } catch (InterruptedException e) {
              Thread.currentThread().interrupt();
              return;
            }
          }
          // A handler that sees its lease lost writes nothing.
        }
        case "/checkpoint" -> {
          Lease lease = Lease.current().orElseThrow();
          lease.checkpoint("reserved", ("room " + n).getBytes(StandardCharsets.UTF_8));
          // Not stored: the key is released for the retry, which starts from the point.
          res.setStatus(503);
          res.getWriter().write("try again");
        }
        case "/expire" -> {
          Lease lease = Lease.current().orElseThrow();
          if (lease.attempt() > 1) {
            res.getWriter().write("ran " + n);
            return;
          }
          // The link to idemd breaks while the first attempt runs: its lease runs out.
          relay.cut();
          long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Wait.seconds(10));
          while (!lease.isLost() && System.nanoTime() < deadline) {
            try {
              Thread.sleep(5);
            } catch (InterruptedException e) {
              Thread.currentThread().interrupt();
              return;
            }
          }
        }
        default -> res.getWriter().write("ran " + n);
      }
    }
  }

  /** Authentication before the filter: the principal is the X-User header (a test's stand-in). */
  static final class Authenticate implements Filter {
    @Override
    public void doFilter(
        jakarta.servlet.ServletRequest request,
        jakarta.servlet.ServletResponse response,
        jakarta.servlet.FilterChain chain)
        throws IOException, jakarta.servlet.ServletException {
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
    }
  }

  /** A Tomcat on a free loopback port running the app behind Authenticate and the filter. */
  static final class Server implements AutoCloseable {
    final Tomcat tomcat = new Tomcat();
    final App app = new App();
    final List<Incident> incidents = new CopyOnWriteArrayList<>();
    final String url;

    Server(Consumer<IdempotencyFilter.Builder> configure, IdemClient with) throws Exception {
      Path base = Files.createTempDirectory("idemd-tomcat-");
      tomcat.setBaseDir(base.toString());
      Connector connector = new Connector();
      connector.setPort(0);
      connector.setProperty("address", "127.0.0.1");
      tomcat.setConnector(connector);
      Context ctx = tomcat.addContext("", base.toString());
      Tomcat.addServlet(ctx, "app", app).addMapping("/*");
      IdempotencyFilter.Builder b =
          IdempotencyFilter.builder(with)
              .scope(
                  req -> req.getUserPrincipal() == null ? null : req.getUserPrincipal().getName())
              .onIncident((req, incident) -> incidents.add(incident));
      configure.accept(b);
      addFilter(ctx, "authenticate", new Authenticate());
      addFilter(ctx, "idempotency", b.build());
      tomcat.start();
      url = "http://127.0.0.1:" + connector.getLocalPort();
    }

    private static void addFilter(Context ctx, String name, Filter filter) {
      FilterDef def = new FilterDef();
      def.setFilterName(name);
      def.setFilter(filter);
      ctx.addFilterDef(def);
      FilterMap map = new FilterMap();
      map.setFilterName(name);
      map.addURLPattern("/*");
      ctx.addFilterMap(map);
    }

    @Override
    public void close() throws org.apache.catalina.LifecycleException {
      tomcat.stop();
      tomcat.destroy();
    }
  }

  static Server serve(Consumer<IdempotencyFilter.Builder> configure) throws Exception {
    return new Server(configure, client);
  }

  static HttpResponse<String> post(
      String url, String user, String key, String body, String... headers)
      throws IOException, InterruptedException {
    HttpRequest.Builder b =
        HttpRequest.newBuilder(URI.create(url))
            .POST(HttpRequest.BodyPublishers.ofString(body))
            .header("Content-Type", "application/json");
    if (user != null) {
      b.header("X-User", user);
    }
    if (key != null) {
      b.header("Idempotency-Key", key);
    }
    for (int i = 0; i < headers.length; i += 2) {
      b.setHeader(headers[i], headers[i + 1]);
    }
    return http.send(b.build(), HttpResponse.BodyHandlers.ofString());
  }

  /** The first incident the filter reported; it reports after the answer is written. */
  private static Incident firstIncident(Server s) throws InterruptedException {
    Wait.until("an incident is reported", () -> !s.incidents.isEmpty());
    return s.incidents.get(0);
  }

  static CompletableFuture<HttpResponse<String>> postAsync(
      String url, String user, String key, String body) {
    return http.sendAsync(
        HttpRequest.newBuilder(URI.create(url))
            .POST(HttpRequest.BodyPublishers.ofString(body))
            .header("X-User", user)
            .header("Content-Type", "application/json")
            .header("Idempotency-Key", key)
            .build(),
        HttpResponse.BodyHandlers.ofString());
  }

  static String key() {
    return UUID.randomUUID().toString();
  }

  static String code(HttpResponse<String> res) {
    java.util.regex.Matcher m =
        java.util.regex.Pattern.compile("\"code\":\"([a-z_]+)\"").matcher(res.body());
    return m.find() ? m.group(1) : "";
  }

  @Test
  void theFirstRequestRunsAndItsRetryIsReplayed() throws Exception {
    try (Server s = serve(b -> {})) {
      String key = key();
      HttpResponse<String> first =
          post(s.url + "/orders", "alice", key, "{\"amount\":100}", "X-Request-Id", "1");
      assertEquals(201, first.statusCode());
      assertEquals("{\"order\":1,\"body\":{\"amount\":100}}", first.body());
      assertTrue(first.headers().firstValue("Idempotent-Replayed").isEmpty());
      // L1: the handler ran under the lease, attempt 1, not recovered.
      Lease lease = s.app.leases.get("1");
      assertEquals(1, lease.attempt());
      assertFalse(lease.recovered());
      assertEquals(io.idemd.Idempotency.idemdKey("alice", key), lease.key());

      // C2, P1, P2: the same answer, marked, without what is never stored; JSON spacing
      // and member order do not change the fingerprint.
      HttpResponse<String> again = post(s.url + "/orders", "alice", key, "{ \"amount\" : 100 }");
      assertEquals(201, again.statusCode());
      assertEquals(first.body(), again.body());
      assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(""));
      assertEquals("/orders/1", again.headers().firstValue("Location").orElse(""));
      assertTrue(
          again.headers().firstValue("Content-Type").orElse("").startsWith("application/json"));
      assertTrue(again.headers().firstValue("Set-Cookie").isEmpty(), "a cookie is never replayed");
      assertTrue(again.headers().firstValue("X-Not-Stored").isEmpty());
      assertEquals(1, s.app.runs.get());
    }
  }

  @Test
  void scopesNeverShareAnAnswer() throws Exception {
    try (Server s = serve(b -> {})) {
      String key = key();
      assertEquals("{\"order\":1,\"body\":{}}", post(s.url + "/orders", "alice", key, "{}").body());
      HttpResponse<String> bob = post(s.url + "/orders", "bob", key, "{}");
      assertEquals("{\"order\":2,\"body\":{}}", bob.body());
      assertTrue(bob.headers().firstValue("Idempotent-Replayed").isEmpty());
      assertEquals(2, s.app.runs.get());
    }
  }

  @Test
  void requestsItDoesNotProtectPassThroughWithoutALease() throws Exception {
    try (Server s = serve(b -> {})) {
      // M1: a GET runs every time, even with a key.
      for (int i = 0; i < 2; i++) {
        HttpResponse<String> get =
            http.send(
                HttpRequest.newBuilder(URI.create(s.url + "/orders"))
                    .header("Idempotency-Key", "k")
                    .header("X-User", "alice")
                    .build(),
                HttpResponse.BodyHandlers.ofString());
        assertEquals(201, get.statusCode());
      }
      // M2: no key.
      assertEquals(
          201, post(s.url + "/orders", "alice", null, "{}", "X-Request-Id", "nokey").statusCode());
      assertEquals(3, s.app.runs.get());
      assertTrue(s.app.leases.isEmpty(), "L2: no lease without a claim");
    }
    try (Server s = serve(b -> b.requireKey(true))) {
      HttpResponse<String> res = post(s.url + "/orders", "alice", null, "{}");
      assertEquals(400, res.statusCode());
      assertEquals("missing_idempotency_key", code(res));
      assertEquals(0, s.app.runs.get());
    }
  }

  @Test
  void anInvalidKeyOrBodyIsAProblemAndNothingRuns() throws Exception {
    try (Server s = serve(b -> b.maxBodyBytes(64))) {
      HttpResponse<String> invalid = post(s.url + "/orders", "alice", "\"unterminated", "{}");
      assertEquals(400, invalid.statusCode()); // M3
      assertEquals("invalid_idempotency_key", code(invalid));
      assertEquals(
          "application/problem+json", invalid.headers().firstValue("Content-Type").orElse(""));
      HttpResponse<String> large =
          post(s.url + "/orders", "alice", key(), "{\"pad\":\"" + "x".repeat(100) + "\"}");
      assertEquals(413, large.statusCode()); // M6
      assertEquals("payload_too_large", code(large));
      HttpResponse<String> noScope = post(s.url + "/orders", null, key(), "{}");
      assertEquals(500, noScope.statusCode()); // M4
      assertEquals("idempotency_scope_missing", code(noScope));
      assertEquals(Incident.Kind.SCOPE_MISSING, firstIncident(s).kind());
      assertEquals(0, s.app.runs.get());
    }
  }

  @Test
  void aFilterWithoutAScopeOrOutsideIdemdsLimitsIsNotBuilt() {
    assertThrows(
        IllegalStateException.class, () -> IdempotencyFilter.builder(client).build()); // M5
    assertThrows(
        IllegalArgumentException.class,
        () ->
            IdempotencyFilter.builder(client)
                .scope(r -> "s")
                .waitFor(Duration.ofSeconds(31))
                .build()); // M5a
    assertThrows(
        IllegalArgumentException.class,
        () ->
            IdempotencyFilter.builder(client).scope(r -> "s").lease(Duration.ofMillis(50)).build());
    assertThrows(
        IllegalArgumentException.class,
        () ->
            IdempotencyFilter.builder(client)
                .scope(r -> "s")
                .storedHeaders("content-type", "Set-Cookie")
                .build()); // P2
    // The key prefix: at most as long as keeps every key within idemd's 255 bytes, valid UTF-8.
    assertEquals(172, IdempotencyFilter.MAX_KEY_PREFIX_BYTES);
    IdempotencyFilter.builder(client).scope(r -> "s").keyPrefix("é".repeat(86)).build();
    assertThrows(
        IllegalArgumentException.class,
        () ->
            IdempotencyFilter.builder(client)
                .scope(r -> "s")
                .keyPrefix("é".repeat(86) + "x")
                .build());
    assertThrows(
        IllegalArgumentException.class,
        () -> IdempotencyFilter.builder(client).scope(r -> "s").keyPrefix("orders\ud800").build());
  }

  @Test
  void aKeyPrefixComesBeforeTheDerivedKey() throws Exception {
    try (Server s = serve(b -> b.keyPrefix("orders/"))) {
      String key = key();
      HttpResponse<String> first =
          post(s.url + "/orders", "alice", key, "{}", "X-Request-Id", "prefixed");
      assertEquals(201, first.statusCode());
      String full = "orders/" + io.idemd.Idempotency.idemdKey("alice", key);
      assertEquals(full, s.app.leases.get("prefixed").key());
      assertEquals("completed", client.lookup(full).state());
      assertThrows(
          io.idemd.NotFoundException.class,
          () -> client.lookup(io.idemd.Idempotency.idemdKey("alice", key)));
      HttpResponse<String> again = post(s.url + "/orders", "alice", key, "{}");
      assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(""));
      assertEquals(first.body(), again.body());

      // The handler's lease checkpoints under the full key, and the retry starts from the point.
      String retried = key();
      String retriedFull = "orders/" + io.idemd.Idempotency.idemdKey("alice", retried);
      assertEquals(
          503,
          post(s.url + "/checkpoint", "alice", retried, "{}", "X-Request-Id", "cp1").statusCode());
      KeyRecord released = client.lookup(retriedFull);
      assertEquals("released", released.state());
      assertEquals("reserved", released.recoveryPoint().orElseThrow().name());
      assertTrue(s.app.leases.get("cp1").recoveryPoint().isEmpty());
      post(s.url + "/checkpoint", "alice", retried, "{}", "X-Request-Id", "cp2");
      io.idemd.RecoveryPoint p = s.app.leases.get("cp2").recoveryPoint().orElseThrow();
      assertEquals("reserved", p.name());
      assertEquals("room 2", new String(p.data(), StandardCharsets.UTF_8));
      assertEquals(1, p.attempt());
      assertEquals(2, s.app.leases.get("cp2").attempt());
      assertTrue(s.incidents.isEmpty(), s.incidents.toString());
    }
  }

  @Test
  void aDuplicateOfARunningRequestIs409AndAnotherPayload422() throws Exception {
    try (Server s = serve(b -> {})) {
      String key = key();
      var first = postAsync(s.url + "/block", "alice", key, "{}");
      assertTrue(s.app.entered.await(Wait.seconds(20), TimeUnit.SECONDS));
      HttpResponse<String> dup = post(s.url + "/block", "alice", key, "{}");
      assertEquals(409, dup.statusCode()); // C3
      assertEquals("in_progress", code(dup));
      assertTrue(Integer.parseInt(dup.headers().firstValue("Retry-After").orElse("0")) >= 1);
      HttpResponse<String> other = post(s.url + "/block", "alice", key, "{\"other\":1}");
      assertEquals(422, other.statusCode()); // C4
      assertEquals("fingerprint_mismatch", code(other));
      s.app.release.countDown();
      assertEquals("blocked 1", first.get(Wait.seconds(20), TimeUnit.SECONDS).body());
      assertEquals(1, s.app.runs.get());
    }
  }

  @Test
  void aDuplicateWaitsForTheFirstAnswerWithWait() throws Exception {
    try (Server s = serve(b -> b.waitFor(Duration.ofSeconds(20)))) {
      String key = key();
      var first = postAsync(s.url + "/block", "alice", key, "{}");
      assertTrue(s.app.entered.await(Wait.seconds(20), TimeUnit.SECONDS));
      var dup = postAsync(s.url + "/block", "alice", key, "{}");
      s.app.release.countDown();
      assertEquals("blocked 1", first.get(Wait.seconds(20), TimeUnit.SECONDS).body());
      HttpResponse<String> replayed = dup.get(Wait.seconds(30), TimeUnit.SECONDS);
      assertEquals("blocked 1", replayed.body());
      assertEquals("true", replayed.headers().firstValue("Idempotent-Replayed").orElse(""));
      assertEquals(1, s.app.runs.get());
    }
  }

  @Test
  void failuresAreReleasedForTheRetry() throws Exception {
    try (Server s = serve(b -> {})) {
      String k4 = key();
      assertEquals(422, post(s.url + "/invalid", "alice", k4, "{}").statusCode()); // R2
      assertEquals(422, post(s.url + "/invalid", "alice", k4, "{}").statusCode());
      String k5 = key();
      assertEquals(500, post(s.url + "/crash", "alice", k5, "{}").statusCode()); // R3
      assertEquals(500, post(s.url + "/crash", "alice", k5, "{}").statusCode());
      String kt = key();
      assertEquals(500, post(s.url + "/throw", "alice", kt, "{}").statusCode()); // R4
      assertEquals(500, post(s.url + "/throw", "alice", kt, "{}").statusCode());
      assertEquals(6, s.app.runs.get(), "every retry of a failure runs the handler again");
      assertTrue(s.incidents.isEmpty(), s.incidents.toString());
    }
  }

  @Test
  void anAnswerTooLargeToStoreIsNeverRunAgain() throws Exception {
    try (Server s = serve(b -> b.maxStoredBytes(1024))) {
      String key = key();
      HttpResponse<String> first = post(s.url + "/big", "alice", key, "{}");
      assertEquals(200, first.statusCode()); // R10: the client still gets all of it.
      assertEquals(4096, first.body().length());
      HttpResponse<String> again = post(s.url + "/big", "alice", key, "{}");
      assertEquals(409, again.statusCode()); // P4
      assertEquals("response_not_stored", code(again));
      assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(""));
      assertEquals(1, s.app.runs.get());
      assertEquals(Incident.Kind.RESULT_NOT_STORED, firstIncident(s).kind());
    }
  }

  @Test
  void aClientThatLeavesMidAnswerGetsResponseNotStoredOnItsRetry() throws Exception {
    try (Server s = serve(b -> {})) {
      String key = key();
      URI uri = URI.create(s.url);
      try (java.net.Socket socket = new java.net.Socket(uri.getHost(), uri.getPort())) {
        String request =
            "POST /stream HTTP/1.1\r\nHost: localhost\r\nX-User: alice\r\nIdempotency-Key: "
                + key
                + "\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        socket.getOutputStream().write(request.getBytes(StandardCharsets.US_ASCII));
        socket.getOutputStream().flush();
        assertTrue(s.app.entered.await(Wait.seconds(20), TimeUnit.SECONDS));
        socket.setSoLinger(true, 0); // a reset, as a client that dies sends
      }
      s.app.release.countDown();
      Wait.until(
          "the handler's answer is cut short",
          () -> s.incidents.stream().anyMatch(i -> i.kind() == Incident.Kind.RESULT_NOT_STORED));
      // R15: the answer began (its status went out) and was cut short; the retry learns
      // that the operation ran instead of running it again.
      HttpResponse<String> retry = post(s.url + "/stream", "alice", key, "{}");
      assertEquals(409, retry.statusCode());
      assertEquals("response_not_stored", code(retry));
      assertEquals(1, s.app.runs.get());
    }
  }

  @Test
  void aLostLeaseStoresNothingAndAnswers409() throws Exception {
    // A lease a busy machine's renewal is answered within, so that the filter learns the
    // lease was lost (the purge) rather than that it ran out unanswered.
    Duration lease = Duration.ofMillis(Math.round(1000 * Wait.SLOWDOWN));
    try (Server s = serve(b -> b.lease(lease))) {
      HttpResponse<String> res = post(s.url + "/lost", "alice", key(), "{}");
      assertEquals(409, res.statusCode()); // R12
      assertEquals("lease_lost", code(res));
      assertEquals("1", res.headers().firstValue("Retry-After").orElse(""));
      assertEquals(Incident.Kind.LEASE_LOST, firstIncident(s).kind());
    }
  }

  @Test
  void aLeaseThatRunsOutUnrenewedStoresNothingAndAnswers409() throws Exception {
    try (Relay relay = Relay.to(daemon.url);
        IdemClient cutOff = IdemClient.builder(relay.url).retries(0).build();
        Server s =
            new Server(
                b -> b.lease(Duration.ofMillis(500)).waitFor(Duration.ofSeconds(20)), cutOff)) {
      s.app.relay = relay;
      String key = key();
      HttpResponse<String> res = post(s.url + "/expire", "alice", key, "{}");
      assertEquals(409, res.statusCode()); // R12, for a lease that ran out unrenewed
      assertEquals("lease_lost", code(res));
      assertEquals("1", res.headers().firstValue("Retry-After").orElse(""));
      Incident incident = firstIncident(s);
      assertEquals(Incident.Kind.LEASE_EXPIRED, incident.kind());
      assertEquals("lease_expired", incident.kind().label());
      assertInstanceOf(LeaseExpiredException.class, incident.error().orElseThrow());

      // Nothing was stored: once idemd lets the lease go, the retry runs the handler.
      relay.restore();
      HttpResponse<String> retry =
          post(s.url + "/expire", "alice", key, "{}", "X-Request-Id", "retry");
      assertEquals(200, retry.statusCode());
      assertEquals("ran 2", retry.body());
      Lease taken = s.app.leases.get("retry");
      assertEquals(2, taken.attempt());
      assertTrue(taken.recovered());
      assertEquals(1, s.incidents.size(), s.incidents.toString());
    }
  }

  @Test
  void theHandlerReadsTheBodyTheFilterRead() throws Exception {
    try (Server s = serve(b -> {})) {
      HttpResponse<String> res =
          http.send(
              HttpRequest.newBuilder(URI.create(s.url + "/form"))
                  .POST(HttpRequest.BodyPublishers.ofString("a=b%20c"))
                  .header("X-User", "alice")
                  .header("Content-Type", "application/x-www-form-urlencoded")
                  .header("Idempotency-Key", key())
                  .build(),
              HttpResponse.BodyHandlers.ofString());
      assertEquals("a=b c", res.body(), "the form's parameters survive the filter's read");
    }
  }

  @Test
  void anUnreachableIdemdFailsClosedUnlessToldOtherwise() throws Exception {
    IdemClient nowhere =
        IdemClient.builder("http://127.0.0.1:" + Daemon.freePort()).retries(0).build();
    try (Server s = new Server(b -> {}, nowhere)) {
      HttpResponse<String> res = post(s.url + "/orders", "alice", key(), "{}");
      assertEquals(503, res.statusCode()); // C5
      assertEquals("idempotency_unavailable", code(res));
      assertTrue(res.headers().firstValue("Retry-After").isPresent());
      assertEquals(0, s.app.runs.get());
      assertEquals(Incident.Kind.UNAVAILABLE, firstIncident(s).kind());
    }
    try (Server s = new Server(b -> b.failOpen(true), nowhere)) {
      HttpResponse<String> res =
          post(s.url + "/orders", "alice", key(), "{}", "X-Request-Id", "open");
      assertEquals(201, res.statusCode());
      assertEquals(1, s.app.runs.get());
      assertFalse(s.app.leases.containsKey("open"), "L2: a fail-open run has no lease");
      assertEquals(Incident.Kind.FAIL_OPEN, firstIncident(s).kind());
    } finally {
      nowhere.close();
    }
  }

  @Test
  void anIdemdThatRefusesIsNeverFailedOpen() throws Exception {
    Path auth = Files.createTempFile("idemd-auth-", ".yaml");
    String hash =
        HexFormat.of()
            .formatHex(
                MessageDigest.getInstance("SHA-256")
                    .digest("the-right-token-0123456789".getBytes(StandardCharsets.UTF_8)));
    Files.writeString(
        auth,
        "tenants:\n  t: {}\ntokens:\n  - tenant: t\n    scopes: [use]\n    sha256: " + hash + "\n");
    try (Daemon guarded = Daemon.start("--auth-file", auth.toString());
        IdemClient wrongToken = IdemClient.builder(guarded.url).token("a-wrong-token").build();
        Server s = new Server(b -> b.failOpen(true), wrongToken)) {
      HttpResponse<String> res = post(s.url + "/orders", "alice", key(), "{}");
      assertEquals(503, res.statusCode()); // C6
      assertEquals(0, s.app.runs.get());
      assertEquals(Incident.Kind.IDEMD_REFUSED, firstIncident(s).kind());
    } finally {
      Files.deleteIfExists(auth);
    }
  }

  @Test
  void aMovingKeyIsRefusedEvenFailingOpen() throws Exception {
    // C6: a key whose record is being moved to another store (503 store_moved) is not free;
    // failing open on it would run a finished operation again.
    try (Moving moving = Moving.start();
        IdemClient c = IdemClient.builder(moving.daemon.url).retries(0).build();
        Server s = new Server(b -> b.failOpen(true), c)) {
      String key = key();
      HttpResponse<String> first = post(s.url + "/orders", "alice", key, "{\"amount\":1}");
      assertEquals(201, first.statusCode());
      assertEquals(1, s.app.runs.get());
      String derived = io.idemd.Idempotency.idemdKey("alice", key);
      moving.mark(derived);
      for (int i = 0; i < 3; i++) {
        HttpResponse<String> retry = post(s.url + "/orders", "alice", key, "{\"amount\":1}");
        assertEquals(503, retry.statusCode(), retry.body());
        assertEquals("idempotency_unavailable", code(retry));
        assertTrue(Integer.parseInt(retry.headers().firstValue("Retry-After").orElse("0")) >= 1);
        assertTrue(retry.headers().firstValue("Idempotent-Replayed").isEmpty());
      }
      assertEquals(1, s.app.runs.get(), "the handler ran again");
      Wait.until("three incidents are reported", () -> s.incidents.size() >= 3);
      assertEquals(3, s.incidents.size(), s.incidents.toString());
      for (Incident incident : s.incidents) {
        assertEquals(Incident.Kind.IDEMD_REFUSED, incident.kind(), incident.toString());
        assertEquals(derived, incident.idemdKey());
        IdemProblemException e =
            assertInstanceOf(IdemProblemException.class, incident.error().orElseThrow());
        assertEquals("store_moved", e.code());
      }
    }
  }

  @Test
  void aTenantAtItsQuotaIsRefusedNewKeysEvenFailingOpen() throws Exception {
    Path auth = Files.createTempFile("idemd-auth-", ".yaml");
    String token = "the-capped-token-0123456789";
    String hash =
        HexFormat.of()
            .formatHex(
                MessageDigest.getInstance("SHA-256")
                    .digest(token.getBytes(StandardCharsets.UTF_8)));
    Files.writeString(
        auth,
        "tenants:\n  t: {max_records: 1}\ntokens:\n  - tenant: t\n    scopes: [use]\n    sha256: "
            + hash
            + "\n");
    try (Daemon guarded = Daemon.start("--auth-file", auth.toString());
        IdemClient capped = IdemClient.builder(guarded.url).token(token).build();
        Server s = new Server(b -> b.failOpen(true), capped)) {
      String kept = key();
      Claim.Acquired first = assertInstanceOf(Claim.Acquired.class, capped.claim(kept));
      capped.complete(kept, first.leaseToken(), StoredResponse.of(200, "text/plain", "done"));
      QuotaExceededException refused =
          assertThrows(QuotaExceededException.class, () -> capped.claim(key()));
      assertEquals(429, refused.status());
      HttpResponse<String> res = post(s.url + "/orders", "alice", key(), "{}");
      assertEquals(503, res.statusCode()); // C7
      assertTrue(res.body().contains("idempotency_quota_exceeded"), res.body());
      assertTrue(Integer.parseInt(res.headers().firstValue("Retry-After").orElse("0")) >= 1);
      assertEquals(0, s.app.runs.get());
      assertEquals(Incident.Kind.QUOTA_EXCEEDED, firstIncident(s).kind());
    } finally {
      Files.deleteIfExists(auth);
    }
  }
}
