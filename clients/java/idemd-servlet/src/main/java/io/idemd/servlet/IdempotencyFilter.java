package io.idemd.servlet;

import io.idemd.Claim;
import io.idemd.ClaimOptions;
import io.idemd.FingerprintMismatchException;
import io.idemd.IdemClient;
import io.idemd.IdemProblemException;
import io.idemd.Idempotency;
import io.idemd.InProgressException;
import io.idemd.Lease;
import io.idemd.LeaseExpiredException;
import io.idemd.LeaseLostException;
import io.idemd.QuotaExceededException;
import io.idemd.StoredResponse;
import io.idemd.UnavailableException;
import io.idemd.UnsealableException;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Set;
import java.util.function.BiConsumer;
import java.util.function.Function;
import java.util.function.IntPredicate;
import java.util.stream.Collectors;

/**
 * Makes handlers idempotent by the Idempotency-Key request header: docs/middleware.md, row by row
 * (the row names are in the comments). Register it after authentication (the scope comes from it):
 *
 * <pre>{@code
 * IdempotencyFilter filter = IdempotencyFilter.builder(client)
 *     .scope(req -> req.getUserPrincipal() == null ? null : req.getUserPrincipal().getName())
 *     .build();
 * }</pre>
 *
 * <p>A handler it runs under a lease finds the lease in the request attribute {@link
 * #LEASE_ATTRIBUTE} and in {@link Lease#current()} (L1). The handler is not interrupted when the
 * lease is lost, or runs out because no renewal was answered; it checks {@link Lease#isLost()} or
 * calls {@link Lease#checkLive()} before an effect, and may bound a call to another service by
 * {@link Lease#remaining()}.
 *
 * <p>Given a client with sealing ({@link IdemClient.Builder#sealing}), the filter stores every
 * answer sealed (R1, and the response_not_stored of R9, R10, R15) and opens each replay; one that
 * does not open is answered 502 stored_response_unsealable, with the incident replay_unsealable,
 * and the handler does not run (P5). So is a recovery point the lease would start from that does
 * not open; the key is then released for a retry, since its work is not finished.
 *
 * <p>Unlike Go, TypeScript and ASGI, a blocking servlet cannot hear its client leave while a claim
 * waits (C3a): a waiting claim waits its full wait, as under WSGI, and a lease it gets runs the
 * handler, whose answer then decides (R6).
 */
public final class IdempotencyFilter implements Filter {
  /** The request attribute holding the {@link Lease} a handler runs under. */
  public static final String LEASE_ATTRIBUTE = "idemd.lease";

  /** The methods the filter guards unless told otherwise. */
  public static final List<String> DEFAULT_METHODS = List.of("POST", "PATCH");

  /** The lease a claim takes unless told otherwise. */
  public static final Duration DEFAULT_LEASE = Duration.ofSeconds(30);

  /** The response headers stored and replayed unless told otherwise. */
  public static final List<String> DEFAULT_STORED_HEADERS = List.of("content-type", "location");

  /** The largest request body the filter reads unless told otherwise. */
  public static final int DEFAULT_MAX_BODY_BYTES = 10 << 20;

  /**
   * The largest response the filter records and stores unless told otherwise: idemd's default
   * --max-blob-bytes. Below it idemd's own limit decides: a daemon without a blob store refuses a
   * result over its --max-response-bytes (1 MiB by default) with 413, which is response_not_stored
   * as a result over this bound is.
   */
  public static final int DEFAULT_MAX_STORED_BYTES = 64 << 20;

  /**
   * The longest key prefix, in bytes of UTF-8: every derived key has the same length, and idemd's
   * keys are at most 255 bytes.
   */
  public static final int MAX_KEY_PREFIX_BYTES = 255 - Idempotency.idemdKey("", "").length();

  // P2: never stored, and refused at construction if listed.
  private static final Set<String> NEVER_STORED =
      Set.of(
          "set-cookie",
          "set-cookie2",
          "connection",
          "keep-alive",
          "proxy-connection",
          "proxy-authenticate",
          "proxy-authorization",
          "te",
          "trailer",
          "transfer-encoding",
          "upgrade",
          "content-length",
          "date",
          "idempotent-replayed");
  private static final Duration MAX_WAIT = Duration.ofSeconds(30);

  private final IdemClient client;
  private final Function<HttpServletRequest, String> scope;
  private final String keyPrefix;
  private final Set<String> methods;
  private final boolean requireKey;
  private final Duration waitFor;
  private final Duration lease;
  private final List<String> storedHeaders;
  private final int maxBodyBytes;
  private final int maxStoredBytes;
  private final IntPredicate storeStatus;
  private final boolean failOpen;
  private final BiConsumer<HttpServletRequest, Incident> onIncident;

  private IdempotencyFilter(Builder b) {
    this.client = b.client;
    this.scope = b.scope;
    this.keyPrefix = b.keyPrefix;
    this.methods = b.methods;
    this.requireKey = b.requireKey;
    this.waitFor = b.waitFor;
    this.lease = b.lease;
    this.storedHeaders = b.storedHeaders;
    this.maxBodyBytes = b.maxBodyBytes;
    this.maxStoredBytes = b.maxStoredBytes;
    this.storeStatus = b.storeStatus;
    this.failOpen = b.failOpen;
    this.onIncident = b.onIncident;
  }

  /** Starts a filter that asks client; the scope is required. */
  public static Builder builder(IdemClient client) {
    return new Builder(client);
  }

  /** The lease the request runs under, when the filter protects it (L1); empty otherwise (L2). */
  public static Optional<Lease> lease(ServletRequest request) {
    return request.getAttribute(LEASE_ATTRIBUTE) instanceof Lease l
        ? Optional.of(l)
        : Optional.empty();
  }

  @Override
  public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
      throws IOException, ServletException {
    if (!(request instanceof HttpServletRequest req)
        || !(response instanceof HttpServletResponse res)) {
      chain.doFilter(request, response);
      return;
    }
    // M1
    if (!methods.contains(req.getMethod().toUpperCase(Locale.ROOT))) {
      chain.doFilter(req, res);
      return;
    }
    // M2, M3
    Idempotency.HeaderKey read =
        Idempotency.parseIdempotencyKey(Collections.list(req.getHeaders("Idempotency-Key")));
    if (read instanceof Idempotency.HeaderKey.Missing) {
      if (!requireKey) {
        chain.doFilter(req, res);
        return;
      }
      Answer.problem(
              400,
              "missing_idempotency_key",
              "Idempotency-Key is required",
              "this endpoint needs an Idempotency-Key header",
              null)
          .write(res);
      return;
    }
    if (read instanceof Idempotency.HeaderKey.Invalid invalid) {
      Answer.problem(
              400, "invalid_idempotency_key", "Invalid Idempotency-Key", invalid.error(), null)
          .write(res);
      return;
    }
    String key = ((Idempotency.HeaderKey.Key) read).key();

    // M6, M7
    byte[] body;
    if (req.getContentLengthLong() > maxBodyBytes) {
      tooLarge(res);
      return;
    }
    try {
      body = readBody(req.getInputStream());
    } catch (IOException e) {
      Answer.problem(
              400,
              "unreadable_body",
              "Unreadable request body",
              String.valueOf(e.getMessage()),
              null)
          .write(res);
      return;
    }
    if (body == null) {
      tooLarge(res);
      return;
    }
    CachedBodyRequest cached = new CachedBodyRequest(req, body);

    // M4
    String who;
    try {
      who = scope.apply(req);
    } catch (RuntimeException e) {
      scopeMissing(req, res, e);
      return;
    }
    if (who == null || who.isEmpty() || !wellFormed(who)) {
      scopeMissing(req, res, null);
      return;
    }

    String derived = keyPrefix + Idempotency.idemdKey(who, key);
    String fingerprint =
        Idempotency.fingerprint(
                new Idempotency.FingerprintInput(
                    req.getMethod(),
                    req.getRequestURI(),
                    req.getQueryString(),
                    req.getHeader("Content-Type"),
                    req.getHeader("Content-Encoding"),
                    body))
            .fingerprint();
    Claim claim;
    try {
      claim = client.claim(derived, new ClaimOptions(fingerprint, lease, waitFor, null, null));
    } catch (InProgressException e) {
      // C3
      long ms = e.retryAfter().orElse(Duration.ZERO).toMillis();
      Answer.problem(
              409,
              "in_progress",
              "Request in progress",
              "a request with this Idempotency-Key is being processed",
              (int) Math.max(1, (ms + 999) / 1000))
          .write(res);
      return;
    } catch (FingerprintMismatchException e) {
      // C4
      Answer.problem(
              422,
              "fingerprint_mismatch",
              "Idempotency-Key reused",
              "this Idempotency-Key was used with a different request",
              null)
          .write(res);
      return;
    } catch (UnsealableException e) {
      // P5: the key is done, and its answer does not open here (sealed with a key this
      // client does not hold, changed in the store, or plain under require sealed). Running
      // the handler again would do the operation twice; the envelope is no answer either.
      // A lease whose recovery point does not open was released for a retry by the claim, as
      // nothing ran: a holder whose ring opens the point can resume the key.
      Answer.problem(
              502,
              "stored_response_unsealable",
              "Stored response unsealable",
              "the stored answer cannot be opened here",
              null)
          .write(res);
      report(req, new Incident(Incident.Kind.REPLAY_UNSEALABLE, derived, Optional.of(e)));
      return;
    } catch (UnavailableException e) {
      // C5: an outage.
      if (failOpen) {
        chain.doFilter(cached, res);
        report(req, new Incident(Incident.Kind.FAIL_OPEN, derived, Optional.of(e)));
        return;
      }
      unavailable(e).write(res);
      report(req, new Incident(Incident.Kind.UNAVAILABLE, derived, Optional.of(e)));
      return;
    } catch (QuotaExceededException e) {
      // C7: the tenant is at its quota of stored keys; an answer, never failed open.
      long ms = e.retryAfter().orElse(Duration.ofSeconds(1)).toMillis();
      Answer.problem(
              503,
              "idempotency_quota_exceeded",
              "Idempotency quota exceeded",
              "the request was not run: the service keeps as many Idempotency-Keys as idemd allows"
                  + " it until some expire",
              (int) Math.max(1, (ms + 999) / 1000))
          .write(res);
      report(req, new Incident(Incident.Kind.QUOTA_EXCEEDED, derived, Optional.of(e)));
      return;
    } catch (RuntimeException e) {
      // C6: an answer that holds for every retry, never failed open.
      unavailable(e).write(res);
      report(req, new Incident(Incident.Kind.IDEMD_REFUSED, derived, Optional.of(e)));
      return;
    }
    if (claim instanceof Claim.Finished finished) {
      replay(req, res, derived, finished.response());
      return;
    }
    run(cached, res, chain, derived, (Claim.Acquired) claim);
  }

  /** R1 to R15: runs the handler under the lease and finishes the key by how it ended. */
  private void run(
      CachedBodyRequest req,
      HttpServletResponse res,
      FilterChain chain,
      String key,
      Claim.Acquired acquired)
      throws IOException, ServletException {
    RecordingResponse recorder = new RecordingResponse(res, maxStoredBytes);
    Throwable thrown = null;
    try {
      client.underLease(
          key,
          acquired,
          lease,
          held -> {
            req.setAttribute(LEASE_ATTRIBUTE, held);
            chain.doFilter(req, recorder);
            recorder.finish();
            return null;
          });
    } catch (LeaseLostException e) {
      // R12: the key belongs to another request now; nothing is stored. An answer the
      // handler wrote goes on to the client. A lease that ran out here, unrenewed, is the
      // same case, told apart in the incident: idemd could not be reached rather than
      // answered.
      if (!res.isCommitted() && recorder.wroteNothing()) {
        res.reset();
        Answer.problem(409, "lease_lost", "Request taken over", e.detail(), 1).write(res);
      }
      Incident.Kind kind =
          e instanceof LeaseExpiredException
              ? Incident.Kind.LEASE_EXPIRED
              : Incident.Kind.LEASE_LOST;
      report(req, new Incident(kind, key, Optional.of(e)));
      return;
    } catch (Exception | Error e) {
      thrown = e;
    }
    int status = recorder.status();
    boolean store = status < 500 && storeStatus.test(status);
    if (thrown != null) {
      if (res.isCommitted() && store) {
        notStored(req, key, acquired, thrown); // R15
      } else {
        release(req, key, acquired); // R4, R15 for a status not stored
      }
      rethrow(thrown);
      return;
    }
    if (status == 101) {
      notStored(req, key, acquired, null); // R9
      return;
    }
    if (!store) {
      release(req, key, acquired); // R2, R3
      return;
    }
    // The recording itself, which the client streams to idemd when it is large (R10a).
    ByteBuffer body = recorder.body();
    Map<String, List<String>> headers = recorder.storedHeaders(storedHeaders);
    if (recorder.errorSent() || body == null || storedBytes(body, headers) > maxStoredBytes) {
      notStored(req, key, acquired, null); // R10
      return;
    }
    try {
      client.complete(key, acquired.leaseToken(), status, headers, body, null); // R1
    } catch (UnavailableException e) {
      if (body.remaining() > IdemClient.RAW_RESULT_BYTES) {
        // R10a: a daemon without a blob store may answer 413 to a large body before reading it
        // and close the connection, which reaches the client as no answer at all. Left claimed
        // (R13), the key would run the handler again once its lease ran out.
        notStored(req, key, acquired, e);
        return;
      }
      report(req, new Incident(Incident.Kind.COMPLETE_FAILED, key, Optional.of(e))); // R13
    } catch (IdemProblemException e) {
      if (e.status() == 413 || e.status() == 400) {
        notStored(req, key, acquired, e); // R10: idemd refused to store it.
        return;
      }
      report(req, new Incident(Incident.Kind.COMPLETE_FAILED, key, Optional.of(e))); // R13
    } catch (RuntimeException e) {
      report(req, new Incident(Incident.Kind.COMPLETE_FAILED, key, Optional.of(e))); // R13
    }
  }

  private void replay(
      HttpServletRequest req, HttpServletResponse res, String key, Optional<StoredResponse> stored)
      throws IOException {
    int status = stored.map(StoredResponse::status).orElse(200);
    if (status < 200 || status > 599) {
      // P3
      Answer.problem(
              502,
              "stored_response_invalid",
              "Stored response invalid",
              "the stored answer cannot be replayed",
              null)
          .write(res);
      report(req, new Incident(Incident.Kind.REPLAY_INVALID, key, Optional.empty()));
      return;
    }
    // P1, P2, P4
    Map<String, List<String>> headers = new LinkedHashMap<>();
    stored
        .map(StoredResponse::headers)
        .orElse(Map.of())
        .forEach(
            (name, values) -> {
              String lower = name.toLowerCase(Locale.ROOT);
              if (!NEVER_STORED.contains(lower)) {
                headers.put(lower, values);
              }
            });
    headers.put("idempotent-replayed", List.of("true"));
    new Answer(status, headers, stored.map(StoredResponse::body).orElse(new byte[0])).write(res);
  }

  private void release(HttpServletRequest req, String key, Claim.Acquired acquired) {
    try {
      client.releaseForRetry(key, acquired.leaseToken());
    } catch (RuntimeException e) {
      report(req, new Incident(Incident.Kind.RELEASE_FAILED, key, Optional.of(e))); // R14
    }
  }

  private void notStored(
      HttpServletRequest req, String key, Claim.Acquired acquired, Throwable cause) {
    Answer a =
        Answer.problem(
            409,
            "response_not_stored",
            "Response not stored",
            "the request with this Idempotency-Key ran, but its answer could not be stored: do not resend it, look the result up",
            null);
    try {
      client.releaseAsFailed(
          key, acquired.leaseToken(), new StoredResponse(a.status(), a.headers(), a.body()), null);
      report(req, new Incident(Incident.Kind.RESULT_NOT_STORED, key, Optional.ofNullable(cause)));
    } catch (RuntimeException e) {
      report(req, new Incident(Incident.Kind.RELEASE_FAILED, key, Optional.of(e)));
    }
  }

  private void scopeMissing(HttpServletRequest req, HttpServletResponse res, Throwable cause)
      throws IOException {
    Answer.problem(
            500,
            "idempotency_scope_missing",
            "Idempotency scope missing",
            "the service could not tell whose request this is",
            null)
        .write(res);
    report(req, new Incident(Incident.Kind.SCOPE_MISSING, "", Optional.ofNullable(cause)));
  }

  private void tooLarge(HttpServletResponse res) throws IOException {
    Answer.problem(
            413,
            "payload_too_large",
            "Request body too large",
            "the body is over " + maxBodyBytes + " bytes",
            null)
        .write(res);
  }

  private static Answer unavailable(RuntimeException e) {
    long ms =
        e instanceof IdemProblemException p
            ? p.retryAfter().orElse(Duration.ofSeconds(1)).toMillis()
            : 1000;
    return Answer.problem(
        503,
        "idempotency_unavailable",
        "Idempotency service unavailable",
        "the request was not run: its Idempotency-Key could not be checked",
        (int) Math.max(1, (ms + 999) / 1000));
  }

  /** Reports an incident; a hook that throws changes nothing. */
  private void report(HttpServletRequest req, Incident incident) {
    if (onIncident == null) {
      return;
    }
    try {
      onIncident.accept(req, incident);
    } catch (RuntimeException e) {
      // The answer is written; a hook's failure is the hook's.
    }
  }

  /** The body whole, or null when it is over the limit. */
  private byte[] readBody(InputStream in) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    byte[] buf = new byte[8192];
    for (int n; (n = in.read(buf)) >= 0; ) {
      if (out.size() + n > maxBodyBytes) {
        return null;
      }
      out.write(buf, 0, n);
    }
    return out.toByteArray();
  }

  private static long storedBytes(ByteBuffer body, Map<String, List<String>> headers) {
    long n = body.remaining();
    for (Map.Entry<String, List<String>> h : headers.entrySet()) {
      for (String v : h.getValue()) {
        n += h.getKey().length() + v.getBytes(StandardCharsets.UTF_8).length;
      }
    }
    return n;
  }

  private static boolean wellFormed(String s) {
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (Character.isHighSurrogate(c)
          && i + 1 < s.length()
          && Character.isLowSurrogate(s.charAt(i + 1))) {
        i++;
      } else if (Character.isSurrogate(c)) {
        return false;
      }
    }
    return true;
  }

  private static void rethrow(Throwable t) throws IOException, ServletException {
    if (t instanceof IOException e) {
      throw e;
    }
    if (t instanceof ServletException e) {
      throw e;
    }
    if (t instanceof RuntimeException e) {
      throw e;
    }
    if (t instanceof Error e) {
      throw e;
    }
    throw new ServletException(t);
  }

  /** Sets up an IdempotencyFilter; see docs/middleware.md, Options. */
  public static final class Builder {
    private final IdemClient client;
    private Function<HttpServletRequest, String> scope;
    private String keyPrefix = "";
    private Set<String> methods = Set.copyOf(DEFAULT_METHODS);
    private boolean requireKey;
    private Duration waitFor = Duration.ZERO;
    private Duration lease = DEFAULT_LEASE;
    private List<String> storedHeaders = DEFAULT_STORED_HEADERS;
    private int maxBodyBytes = DEFAULT_MAX_BODY_BYTES;
    private int maxStoredBytes = DEFAULT_MAX_STORED_BYTES;
    private IntPredicate storeStatus = s -> (s >= 200 && s < 400) || s == 402;
    private boolean failOpen;
    private BiConsumer<HttpServletRequest, Incident> onIncident;

    private Builder(IdemClient client) {
      this.client = Objects.requireNonNull(client, "client");
    }

    /**
     * Whose request it is: the authenticated user, account or tenant, a non-empty string. A replay
     * never crosses scopes. Required: a service whose answers are not private says so with a
     * constant.
     */
    public Builder scope(Function<HttpServletRequest, String> scope) {
      this.scope = scope;
      return this;
    }

    /**
     * Puts prefix before every idemd key the filter derives, so that the keys of one route or
     * service share it and the abandoned-keys feed (and a {@link io.idemd.Completer}) selects them
     * by it, such as "orders/"; default none. The idemd key of a request becomes prefix followed by
     * {@link Idempotency#idemdKey}; the lease the handler gets and the incidents carry that full
     * key, and lookup takes it. The derivation itself does not change. At most {@link
     * #MAX_KEY_PREFIX_BYTES} bytes of valid UTF-8.
     */
    public Builder keyPrefix(String keyPrefix) {
      this.keyPrefix = keyPrefix == null ? "" : keyPrefix;
      return this;
    }

    /** The methods the filter applies to; default POST and PATCH. */
    public Builder methods(String... methods) {
      this.methods =
          java.util.Arrays.stream(methods)
              .map(m -> m.toUpperCase(Locale.ROOT))
              .collect(Collectors.toSet());
      return this;
    }

    /** Answer 400 to a request of those methods without a key; default off. */
    public Builder requireKey(boolean requireKey) {
      this.requireKey = requireKey;
      return this;
    }

    /**
     * How long a duplicate waits for the first request to finish instead of a 409 (0 to 30 s);
     * default 0.
     */
    public Builder waitFor(Duration waitFor) {
      this.waitFor = Objects.requireNonNull(waitFor, "waitFor");
      return this;
    }

    /**
     * The lease held while the handler runs, renewed every lease/3 (100 ms to 1 h); default 30 s.
     */
    public Builder lease(Duration lease) {
      this.lease = Objects.requireNonNull(lease, "lease");
      return this;
    }

    /** The response headers stored and replayed; default content-type and location. */
    public Builder storedHeaders(String... names) {
      this.storedHeaders =
          java.util.Arrays.stream(names).map(n -> n.toLowerCase(Locale.ROOT)).toList();
      return this;
    }

    /** The largest request body read to fingerprint it; default 10 MiB. */
    public Builder maxBodyBytes(int maxBodyBytes) {
      this.maxBodyBytes = maxBodyBytes;
      return this;
    }

    /**
     * The largest result stored, body plus stored header names and values; default 64 MiB
     * (DEFAULT_MAX_STORED_BYTES).
     */
    public Builder maxStoredBytes(int maxStoredBytes) {
      this.maxStoredBytes = maxStoredBytes;
      return this;
    }

    /** Whether an answer of this status is a result to store; default 2xx, 3xx and 402. */
    public Builder storeStatus(IntPredicate storeStatus) {
      this.storeStatus = Objects.requireNonNull(storeStatus, "storeStatus");
      return this;
    }

    /** Let requests through, unprotected, while idemd cannot be reached; default off. */
    public Builder failOpen(boolean failOpen) {
      this.failOpen = failOpen;
      return this;
    }

    /** Called, after the answer is written, for every case where a promise could not be kept. */
    public Builder onIncident(BiConsumer<HttpServletRequest, Incident> onIncident) {
      this.onIncident = onIncident;
      return this;
    }

    /**
     * Builds the filter; throws when the scope is missing or an option is out of idemd's limits
     * (M5, M5a).
     */
    public IdempotencyFilter build() {
      if (scope == null) {
        // M5: no safe default exists.
        throw new IllegalStateException(
            "idempotency filter: the scope is required: a function of the request naming whose request it is"
                + " (a user or account ID)");
      }
      List<String> refused = storedHeaders.stream().filter(NEVER_STORED::contains).toList();
      if (!refused.isEmpty()) {
        throw new IllegalArgumentException(
            "idempotency filter: storedHeaders may not list " + String.join(", ", refused));
      }
      // M5a: idemd refuses every claim outside the contract's limits, so such a filter
      // would answer 503 to every request.
      if (waitFor.isNegative() || waitFor.compareTo(MAX_WAIT) > 0) {
        throw new IllegalArgumentException(
            "idempotency filter: waitFor is " + waitFor + "; idemd waits 0 to 30 s");
      }
      if (lease.toMillis() < 100 || lease.compareTo(Duration.ofHours(1)) > 0) {
        throw new IllegalArgumentException(
            "idempotency filter: lease is " + lease + "; idemd's leases last 100 ms to 1 h");
      }
      // Every derived key has the same length, so a prefix that fits once fits always.
      if (!wellFormed(keyPrefix)
          || keyPrefix.getBytes(StandardCharsets.UTF_8).length > MAX_KEY_PREFIX_BYTES) {
        throw new IllegalArgumentException(
            "idempotency filter: keyPrefix must be valid UTF-8 of at most "
                + MAX_KEY_PREFIX_BYTES
                + " bytes, so that keys stay within idemd's 255");
      }
      if (maxBodyBytes < 0 || maxStoredBytes < 0) {
        throw new IllegalArgumentException(
            "idempotency filter: the byte limits must not be negative");
      }
      return new IdempotencyFilter(this);
    }
  }
}
