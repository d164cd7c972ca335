package io.idemd.servlet;

import static io.idemd.servlet.FilterTest.code;
import static io.idemd.servlet.FilterTest.key;
import static io.idemd.servlet.FilterTest.post;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.idemd.IdemClient;
import io.idemd.testing.Daemon;
import io.idemd.testing.Wait;
import jakarta.servlet.DispatcherType;
import java.net.http.HttpResponse;
import java.util.EnumSet;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.eclipse.jetty.ee11.servlet.FilterHolder;
import org.eclipse.jetty.ee11.servlet.ServletContextHandler;
import org.eclipse.jetty.ee11.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The filter in a real Jetty (12, EE 11): the rows whose behaviour hangs on how the container
 * buffers, commits and reads, over real HTTP against a real idemd.
 */
class JettyTest {
  private static Daemon daemon;
  private static IdemClient client;
  private static Server jetty;
  private static final FilterTest.App app = new FilterTest.App();
  private static final List<Incident> incidents = new CopyOnWriteArrayList<>();
  private static String url;

  @BeforeAll
  static void start() throws Exception {
    daemon = Daemon.start();
    client = IdemClient.builder(daemon.url).build();
    jetty = new Server();
    ServerConnector connector = new ServerConnector(jetty);
    connector.setHost("127.0.0.1");
    connector.setPort(0);
    jetty.addConnector(connector);
    ServletContextHandler ctx = new ServletContextHandler();
    ctx.setContextPath("/");
    ctx.addServlet(new ServletHolder(app), "/*");
    ctx.addFilter(
        new FilterHolder(new FilterTest.Authenticate()), "/*", EnumSet.of(DispatcherType.REQUEST));
    IdempotencyFilter filter =
        IdempotencyFilter.builder(client)
            .scope(req -> req.getUserPrincipal() == null ? null : req.getUserPrincipal().getName())
            .maxStoredBytes(1024)
            .onIncident((req, incident) -> incidents.add(incident))
            .build();
    ctx.addFilter(new FilterHolder(filter), "/*", EnumSet.of(DispatcherType.REQUEST));
    jetty.setHandler(ctx);
    jetty.start();
    url = "http://127.0.0.1:" + connector.getLocalPort();
  }

  @AfterAll
  static void stop() throws Exception {
    jetty.stop();
    client.close();
    daemon.close();
  }

  @Test
  void theFirstRequestRunsItsRetryIsReplayedAndScopesStayApart() throws Exception {
    int before = app.runs.get();
    String key = key();
    HttpResponse<String> first = post(url + "/orders", "alice", key, "{\"amount\":1}");
    assertEquals(201, first.statusCode());
    HttpResponse<String> again = post(url + "/orders", "alice", key, "{\"amount\":1}");
    assertEquals(201, again.statusCode());
    assertEquals(first.body(), again.body());
    assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(""));
    assertTrue(again.headers().firstValue("Set-Cookie").isEmpty(), "a cookie is never replayed");
    HttpResponse<String> bob = post(url + "/orders", "bob", key, "{\"amount\":1}");
    assertTrue(bob.headers().firstValue("Idempotent-Replayed").isEmpty());
    assertEquals(before + 2, app.runs.get());
  }

  @Test
  void aServerErrorIsReleasedForTheRetry() throws Exception {
    int before = app.runs.get();
    String key = key();
    assertEquals(500, post(url + "/crash", "alice", key, "{}").statusCode());
    assertEquals(500, post(url + "/crash", "alice", key, "{}").statusCode());
    assertEquals(before + 2, app.runs.get());
  }

  @Test
  void anAnswerTooLargeToStoreIsNeverRunAgain() throws Exception {
    int before = app.runs.get();
    String key = key();
    HttpResponse<String> first = post(url + "/big", "alice", key, "{}");
    assertEquals(4096, first.body().length());
    HttpResponse<String> again = post(url + "/big", "alice", key, "{}");
    assertEquals(409, again.statusCode());
    assertEquals("response_not_stored", code(again));
    assertEquals(before + 1, app.runs.get());
    Wait.until(
        "the incident is reported",
        () -> incidents.stream().anyMatch(i -> i.kind() == Incident.Kind.RESULT_NOT_STORED));
  }

  @Test
  void theHandlerReadsTheFormTheFilterRead() throws Exception {
    HttpResponse<String> res =
        FilterTest.http.send(
            java.net.http.HttpRequest.newBuilder(java.net.URI.create(url + "/form"))
                .POST(java.net.http.HttpRequest.BodyPublishers.ofString("a=b%20c"))
                .header("X-User", "alice")
                .header("Content-Type", "application/x-www-form-urlencoded")
                .header("Idempotency-Key", key())
                .build(),
            HttpResponse.BodyHandlers.ofString());
    assertEquals("a=b c", res.body());
  }
}
