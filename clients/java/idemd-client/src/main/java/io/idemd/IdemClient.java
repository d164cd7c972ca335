package io.idemd;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.json.JsonWriteFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.NullNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.idemd.api.ApiClient;
import io.idemd.api.ApiException;
import io.idemd.api.ClaimsApi;
import io.idemd.api.RecordsApi;
import io.idemd.api.model.BatchItem;
import io.idemd.api.model.BatchRequest;
import io.idemd.api.model.BatchResults;
import io.idemd.api.model.ClaimAcquired;
import io.idemd.api.model.ClaimAnswer;
import io.idemd.api.model.ClaimFinished;
import io.idemd.api.model.ClaimRequest;
import io.idemd.api.model.CompleteRequest;
import io.idemd.api.model.ExtendRequest;
import io.idemd.api.model.RecoveryPointRequest;
import io.idemd.api.model.ReleaseRequest;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpHeaders;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.ByteBuffer;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.Optional;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * A client of idemd: claim a key, then complete, release or extend the lease the claim gave, or
 * record a recovery point under it; look a key up or purge it; read the abandoned-keys feed. {@link
 * #run}, {@link #once} and {@link #consume} do the whole dance around a piece of work and hand it
 * the lease it runs under; a {@link Completer} finishes the keys the feed lists.
 *
 * <p>Every call is bounded by the client's timeout (a claim that waits gets its wait on top),
 * resent after a transport failure (every idemd call is safe to resend), and takes one of a bounded
 * number of slots, so that the connections it opens are bounded too. An IdemClient is thread-safe;
 * make one per idemd and share it. Close it to stop its lease renewals' threads.
 */
public final class IdemClient implements AutoCloseable {
  static final Duration DEFAULT_LEASE = Duration.ofSeconds(30);
  private static final Duration MAX_WAIT = Duration.ofSeconds(30);

  /** The longest JSON string read: a result of 64 MiB, idemd's default --max-blob-bytes, base64. */
  private static final int MAX_ANSWER_STRING = (64 << 20) / 3 * 4 + 4;

  /**
   * The largest body (or sealed envelope) a completion sends base64 in JSON; a larger one goes as
   * the raw body of PUT /v1/keys/{key}/result, streamed, a third fewer bytes and no base64, as
   * every idemd client sends it. A daemon with a blob store takes such a result up to its
   * --max-blob-bytes; one without refuses one over its --max-response-bytes with 413, either way.
   */
  public static final int RAW_RESULT_BYTES = 1 << 20;

  private static final Duration REQUEUE_DELAY = Duration.ofSeconds(1);
  private static final long MIN_RENEWAL_NANOS = TimeUnit.MILLISECONDS.toNanos(10);
  private static final SecureRandom RANDOM = new SecureRandom();

  private final ClaimsApi claims;
  private final ClaimsApi waitingClaims;
  private final RecordsApi records;
  private final ObjectMapper mapper;
  private final String owner;
  private final Duration timeout;
  private final Duration retention;
  private final int retries;
  private final Duration backoff;
  private final Semaphore slots;
  private final ScheduledExecutorService renewals;
  private final ExecutorService renewalCalls;
  private final Batcher batcher;
  private final Sealing sealing;
  private final String baseUrl;
  private final String authorization;
  private final HttpClient rawResults;

  private IdemClient(Builder b) {
    HttpClient.Builder http =
        HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(b.connectTimeout);
    ObjectMapper json = ApiClient.createDefaultObjectMapper();
    // A claim or lookup carries a stored result base64 in one JSON string: up to idemd's
    // --max-blob-bytes (64 MiB by default) with a blob store, over Jackson's default bound.
    json.getFactory()
        .setStreamReadConstraints(
            StreamReadConstraints.builder().maxStringLength(MAX_ANSWER_STRING).build());
    ApiClient api = new ApiClient(http, json, b.baseUrl);
    api.setReadTimeout(b.timeout);
    this.baseUrl = b.baseUrl;
    this.authorization = b.token == null ? null : "Bearer " + b.token;
    if (authorization != null) {
      api.setRequestInterceptor(request -> request.header("Authorization", authorization));
    }
    // The raw results go by hand: the generated call sends its body as JSON.
    this.rawResults = http.build();
    this.claims = new ClaimsApi(api);
    this.records = new RecordsApi(api);
    // A waiting claim gets the longest wait on top of the timeout (on its own connections).
    api.setReadTimeout(b.timeout.plus(MAX_WAIT));
    this.waitingClaims = new ClaimsApi(api);
    this.mapper = api.getObjectMapper();
    this.owner = b.owner != null ? b.owner : "java-" + hex(8);
    this.timeout = b.timeout;
    this.retention = b.retention;
    this.retries = b.retries;
    this.backoff = b.backoff;
    this.slots = new Semaphore(b.maxConcurrentCalls, true);
    this.batcher = b.batching ? new Batcher(new Transport(), b.timeout) : null;
    this.sealing = b.ring == null ? Sealing.NONE : new Sealing(b.tenant, b.ring, b.requireSealed);
    this.renewals =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "idemd-lease-renewals");
              t.setDaemon(true);
              return t;
            });
    // The renewals' calls block until idemd answers; on threads of their own, one lease's
    // slow renewal delays no other lease's.
    this.renewalCalls =
        Executors.newCachedThreadPool(
            r -> {
              Thread t = new Thread(r, "idemd-lease-renewal-call");
              t.setDaemon(true);
              return t;
            });
  }

  /** Starts a client of the idemd at baseUrl, such as http://idemd.internal:8080. */
  public static Builder builder(String baseUrl) {
    return new Builder(baseUrl);
  }

  /** Returns a fresh claim secret: 128 random bits, hex-encoded. */
  public static String newClaimSecret() {
    return hex(16);
  }

  /**
   * Asks for the lease on key. Throws an InProgressException (with retryAfter) when another caller
   * holds a live lease, and a FingerprintMismatchException when the key was used with another
   * fingerprint. With sealing ({@link Builder#sealing}), the stored result, or the recovery point
   * the lease starts from, is opened; one that does not open is an {@link UnsealableException}. A
   * lease acquired with a recovery point that does not open is released for a retry first (the
   * point stays), nothing having run under it, so that a holder whose ring opens the point can take
   * the key.
   */
  public Claim claim(String key, ClaimOptions options) {
    return claim(key, options, true);
  }

  /**
   * {@link #claim(String, ClaimOptions)}; a lease acquired with a recovery point that does not open
   * is released for a retry when release is set, and otherwise left pending under its lease, to run
   * out (a {@link Completer}'s way, which a release would take the key out of the feed it works
   * from).
   */
  Claim claim(String key, ClaimOptions options, boolean release) {
    Objects.requireNonNull(key, "key");
    // The lease is reckoned from here: idemd starts it later, when the claim reaches it.
    long sentAt = System.nanoTime();
    ClaimOptions o = options == null ? ClaimOptions.DEFAULT : options;
    // The secret is made once per call, so every resend of this claim carries it.
    ClaimRequest body =
        new ClaimRequest()
            .key(key)
            .owner(o.owner() != null ? o.owner() : owner)
            .claimSecret(o.claimSecret() != null ? o.claimSecret() : newClaimSecret());
    if (o.fingerprint() != null && !o.fingerprint().isEmpty()) {
      body.fingerprint(o.fingerprint());
    }
    if (o.lease() != null) {
      body.leaseMs(o.lease().toMillis());
    }
    boolean waits = o.waitFor() != null && !o.waitFor().isZero();
    if (waits) {
      body.waitMs(o.waitFor().toMillis());
    }
    // A claim that waits would hold a batch back; it goes on its own.
    ClaimAnswer answer =
        (ClaimAnswer)
            (waits ? call(() -> waitingClaims.claim(body)) : exec(new BatchItem().claim(body)));
    Object value = answer == null ? null : answer.getActualInstance();
    if (value instanceof ClaimAcquired a
        && a.getLeaseToken() != null
        && !a.getLeaseToken().isEmpty()) {
      Optional<RecoveryPoint> point;
      try {
        point = sealing.openPoint(key, Optional.ofNullable(a.getRecoveryPoint()));
      } catch (UnsealableException e) {
        // Nothing runs from a point it cannot read. If this release fails too, the lease
        // runs out.
        if (release) {
          try {
            releaseForRetry(key, a.getLeaseToken());
          } catch (RuntimeException r) {
            e.addSuppressed(r);
          }
        }
        throw e;
      }
      return new Claim.Acquired(
          a.getLeaseToken(),
          a.getLeaseExpiresAt(),
          a.getAttempt(),
          Boolean.TRUE.equals(a.getRecovered()),
          a.getExpiresAt(),
          sentAt,
          point);
    }
    if (value instanceof ClaimFinished f && f.getOutcome() != null) {
      return new Claim.Finished(
          f.getOutcome() == ClaimFinished.OutcomeEnum.FAILED,
          f.getAttempt(),
          sealing.fromWire(key, f.getOutcome().getValue(), f.getResponse()),
          f.getExpiresAt());
    }
    // Not idemd's answer (a base URL that points at something else): nothing may run or
    // be replayed on it.
    throw new IdemException(
        "idem: the claim's answer is neither a lease nor a stored result; is the base URL idemd's?");
  }

  /** Claims key with the default options. */
  public Claim claim(String key) {
    return claim(key, ClaimOptions.DEFAULT);
  }

  /**
   * Stores response as the key's result; retention null keeps it for the client's retention
   * (default the daemon's 24 h). A LeaseLostException says that the lease is no longer this
   * caller's. With sealing ({@link Builder#sealing}) its headers and body go sealed, bound to the
   * key and the status, which stays readable. A body (or envelope) over {@link #RAW_RESULT_BYTES}
   * goes as the raw body of PUT /v1/keys/{key}/result rather than base64 in JSON: idemd without a
   * blob store refuses one over its --max-response-bytes with a {@link PayloadTooLargeException},
   * or, when it closes the connection before reading it, the completion gets no answer (an {@link
   * UnavailableException}).
   */
  public void complete(String key, String leaseToken, StoredResponse response, Duration retention) {
    complete(
        key,
        leaseToken,
        response.status(),
        response.headers(),
        ByteBuffer.wrap(response.bodyUncopied()),
        retention);
  }

  public void complete(String key, String leaseToken, StoredResponse response) {
    complete(key, leaseToken, response, null);
  }

  /**
   * {@link #complete(String, String, StoredResponse, Duration)} of a result whose body is body's
   * remaining bytes, read where they are: neither copied (a large body is streamed to idemd from
   * them) nor changed, nor is body's position. Nothing may change them until it returns. headers
   * have lowercase names.
   */
  public void complete(
      String key,
      String leaseToken,
      int status,
      Map<String, List<String>> headers,
      ByteBuffer body,
      Duration retention) {
    Objects.requireNonNull(key, "key");
    Objects.requireNonNull(leaseToken, "leaseToken");
    Sealing.Stored stored =
        sealing.stored(
            key,
            false,
            status,
            headers == null ? Map.of() : Map.copyOf(headers),
            body == null ? ByteBuffer.allocate(0) : body);
    Duration keep = retention != null ? retention : this.retention;
    if (stored.size() > RAW_RESULT_BYTES) {
      putResult(key, leaseToken, stored, keep);
      return;
    }
    CompleteRequest request =
        new CompleteRequest().key(key).leaseToken(leaseToken).response(stored.toWire());
    if (keep != null) {
      request.retentionMs(keep.toMillis());
    }
    exec(new BatchItem().complete(request));
  }

  /**
   * Completes key with stored as raw bytes (PUT /v1/keys/{key}/result): the same transition as POST
   * /v1/complete, on its own rather than in a batch.
   */
  private void putResult(String key, String leaseToken, Sealing.Stored stored, Duration keep) {
    HttpRequest.Builder request =
        HttpRequest.newBuilder(
                URI.create(baseUrl + "/v1/keys/" + ApiClient.urlEncode(key) + "/result"))
            .timeout(timeout)
            .header("Content-Type", "application/octet-stream")
            .header("Accept", "application/json, application/problem+json")
            .header("Idemd-Lease-Token", leaseToken)
            .header("Idemd-Status", Integer.toString(stored.status()));
    if (stored.sealed()) {
      request.header("Idemd-Sealed", "1");
    } else if (!stored.headers().isEmpty()) {
      try {
        // Escaped to ASCII: a header's value carries no other bytes as they are.
        request.header(
            "Idemd-Result-Headers",
            mapper
                .writer()
                .with(JsonWriteFeature.ESCAPE_NON_ASCII)
                .writeValueAsString(stored.headers()));
      } catch (JsonProcessingException e) {
        throw new IdemException("idem: the headers of the result of \"" + key + "\"", e);
      }
    }
    if (keep != null) {
      request.header("Idemd-Retention-Ms", Long.toString(keep.toMillis()));
    }
    if (authorization != null) {
      request.header("Authorization", authorization);
    }
    ByteBuffer bytes = stored.bytes();
    // Streamed from the bytes where they are, with their length; a resend after a transport
    // failure reads them again from the start.
    request.PUT(
        HttpRequest.BodyPublishers.fromPublisher(
            HttpRequest.BodyPublishers.ofInputStream(() -> new BufferInput(bytes.duplicate())),
            bytes.remaining()));
    HttpRequest built = request.build();
    JsonNode record =
        call(
            () -> {
              HttpResponse<String> answer;
              try {
                answer = rawResults.send(built, HttpResponse.BodyHandlers.ofString());
              } catch (IOException e) {
                throw new ApiException(e);
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new ApiException(e);
              }
              if (answer.statusCode() / 100 != 2) {
                throw new ApiException(
                    answer.statusCode(),
                    "putResult call failed with: " + answer.statusCode(),
                    answer.headers(),
                    answer.body());
              }
              try {
                return mapper.readTree(answer.body());
              } catch (JsonProcessingException e) {
                throw new ApiException(e);
              }
            });
    if (record == null || !record.path("state").isTextual()) {
      throw new IdemException(
          "idem: the result was answered without the record; is the base URL idemd's?");
    }
  }

  /** Reads a buffer's remaining bytes as a stream, without copying them first. */
  private static final class BufferInput extends InputStream {
    private final ByteBuffer from;

    BufferInput(ByteBuffer from) {
      this.from = from;
    }

    @Override
    public int read() {
      return from.hasRemaining() ? from.get() & 0xFF : -1;
    }

    @Override
    public int read(byte[] b, int off, int len) {
      Objects.checkFromIndexSize(off, len, b.length);
      if (len == 0) {
        return 0;
      }
      if (!from.hasRemaining()) {
        return -1;
      }
      int n = Math.min(len, from.remaining());
      from.get(b, off, n);
      return n;
    }

    @Override
    public int available() {
      return from.remaining();
    }
  }

  /** Frees the key for the next claim (mode retry): nothing is stored. */
  public void releaseForRetry(String key, String leaseToken) {
    release(key, leaseToken, ReleaseRequest.ModeEnum.RETRY, null, null);
  }

  /**
   * Stores a terminal failure (mode fail): later claims replay response, which may be null. With
   * sealing, a failure without a response is stored sealed too (docs/sealing.md).
   */
  public void releaseAsFailed(
      String key, String leaseToken, StoredResponse response, Duration retention) {
    release(key, leaseToken, ReleaseRequest.ModeEnum.FAIL, response, retention);
  }

  private void release(
      String key,
      String leaseToken,
      ReleaseRequest.ModeEnum mode,
      StoredResponse response,
      Duration retention) {
    ReleaseRequest body = new ReleaseRequest().key(key).leaseToken(leaseToken).mode(mode);
    if (response != null) {
      body.response(sealing.toWire(key, true, response));
    } else if (mode == ReleaseRequest.ModeEnum.FAIL) {
      body.response(sealing.noResponse(key));
    }
    Duration keep = retention != null ? retention : this.retention;
    if (keep != null && mode == ReleaseRequest.ModeEnum.FAIL) {
      body.retentionMs(keep.toMillis());
    }
    exec(new BatchItem().release(body));
  }

  /** Renews the lease for lease from now. */
  public void extend(String key, String leaseToken, Duration lease) {
    ExtendRequest body =
        new ExtendRequest().key(key).leaseToken(leaseToken).leaseMs(lease.toMillis());
    exec(new BatchItem().extend(body));
  }

  /**
   * The record of key; a NotFoundException when it has none. Its result and recovery point are
   * opened as a claim opens them; one that does not open is an {@link UnsealableException}.
   */
  public KeyRecord lookup(String key) {
    io.idemd.api.model.KeyRecord r = call(() -> records.lookup(key));
    return new KeyRecord(
        r.getKey(),
        r.getState(),
        r.getAttempt(),
        Objects.toString(r.getFingerprint(), ""),
        Objects.toString(r.getOwner(), ""),
        r.getCreatedAt(),
        r.getUpdatedAt(),
        Optional.ofNullable(r.getLeaseExpiresAt()),
        r.getExpiresAt(),
        sealing.fromWire(key, r.getState(), r.getResponse()),
        sealing.openPoint(key, Optional.ofNullable(r.getRecoveryPoint())));
  }

  /**
   * Records a recovery point for key under the lease leaseToken: name (1 to 128 bytes of UTF-8) and
   * data (at most the daemon's --max-recovery-point-bytes, 4096 by default; null or empty records
   * none). It replaces the point recorded before; the next acquisition of the key receives it
   * ({@link Lease#recoveryPoint()}). A LeaseLostException says that leaseToken is no longer the
   * key's lease or that the key is not pending, a NotFoundException that the key is gone, and a
   * {@link PayloadTooLargeException} that data is over the limit; in each case nothing is recorded.
   * Repeating it is safe. Work run by run, once, consume, the filter or a {@link Completer} records
   * through its lease instead ({@link Lease#checkpoint}), which also loses the lease when idemd
   * says it is gone.
   *
   * <p>With sealing ({@link Builder#sealing}) the data is sealed, empty data too, bound to the key
   * and name: idemd and its store see the name and an envelope 47 bytes plus the key id longer than
   * the data, which counts against the limit.
   *
   * <p>A recovery point is never part of a batch: the contract has no batch item for it, so it
   * always goes as a request of its own.
   */
  public void recordRecoveryPoint(String key, String leaseToken, String name, byte[] data) {
    RecoveryPointRequest body =
        new RecoveryPointRequest()
            .key(Objects.requireNonNull(key, "key"))
            .leaseToken(Objects.requireNonNull(leaseToken, "leaseToken"))
            .name(Objects.requireNonNull(name, "name"));
    byte[] recorded = sealing.sealPoint(key, name, data);
    if (recorded != null) {
      body.data(recorded);
    }
    io.idemd.api.model.KeyRecord r = call(() -> claims.recordRecoveryPoint(body));
    if (r == null || r.getState() == null) {
      // Read only to know that the answer is idemd's: the point is the caller's.
      throw new IdemException(
          "idem: the recovery point was answered without the record; is the base URL idemd's?");
    }
  }

  /**
   * Reads a page of the abandoned-keys feed: the keys of the caller's tenant that are pending under
   * a lease that ran out, which their holders died or were cut off holding. To finish them, claim
   * each with its fingerprint (the claim decides who finishes a key: one renewed or taken over
   * since the page was read answers in_progress), or let a {@link Completer} do it. Read until the
   * page's next is empty, or stream them all with {@link #abandonedKeys}.
   */
  public AbandonedPage abandoned(AbandonedQuery query) {
    AbandonedQuery q = query == null ? AbandonedQuery.DEFAULT : query;
    // Whole milliseconds, rounded up: never a lease that ran out more recently than asked.
    Long olderThanMs =
        q.olderThan().isZero()
            ? null
            : q.olderThan().plusNanos(TimeUnit.MILLISECONDS.toNanos(1) - 1).toMillis();
    io.idemd.api.model.AbandonedKeys page =
        call(
            () ->
                records.listAbandoned(
                    q.prefix().isEmpty() ? null : q.prefix(),
                    olderThanMs,
                    q.limit() == 0 ? null : q.limit(),
                    q.cursor().isEmpty() ? null : q.cursor()));
    if (page == null || page.getKeys() == null) {
      // Not idemd's answer: an empty feed would hide that.
      throw new IdemException(
          "idem: the abandoned-keys feed was answered without keys; is the base URL idemd's?");
    }
    List<AbandonedKey> keys = new ArrayList<>(page.getKeys().size());
    for (io.idemd.api.model.AbandonedKey k : page.getKeys()) {
      keys.add(
          new AbandonedKey(
              k.getKey(),
              k.getAttempt() == null ? 0 : k.getAttempt(),
              Objects.toString(k.getFingerprint(), ""),
              Objects.toString(k.getOwner(), ""),
              k.getLeaseExpiredAt(),
              Objects.toString(k.getRecoveryPoint(), "")));
    }
    String next = page.getNextCursor();
    return new AbandonedPage(
        keys, next == null || next.isEmpty() ? Optional.empty() : Optional.of(next));
  }

  /**
   * Every abandoned key that query selects, from its cursor on, reading each page of the feed as
   * the stream reaches it. A page that cannot be read ends the stream with the exception {@link
   * #abandoned} throws, from whichever operation of the stream asked for the page. A key given up
   * and abandoned again while the stream is read may come twice.
   */
  public Stream<AbandonedKey> abandonedKeys(AbandonedQuery query) {
    AbandonedQuery first = query == null ? AbandonedQuery.DEFAULT : query;
    Iterator<AbandonedKey> all =
        new Iterator<>() {
          // The query of the next page to read; null once the last page was read.
          private AbandonedQuery next = first;
          private Iterator<AbandonedKey> page = Collections.emptyIterator();

          @Override
          public boolean hasNext() {
            while (!page.hasNext() && next != null) {
              AbandonedPage p = abandoned(next);
              page = p.keys().iterator();
              String cursor = p.next().orElse(null);
              if (cursor != null && cursor.equals(next.cursor())) {
                // A feed that never moves on would be read forever.
                throw new IdemException(
                    "idem: the abandoned-keys feed answered the cursor it was given as the next"
                        + " one");
              }
              next = cursor == null ? null : next.withCursor(cursor);
            }
            return page.hasNext();
          }

          @Override
          public AbandonedKey next() {
            if (!hasNext()) {
              throw new NoSuchElementException();
            }
            return page.next();
          }
        };
    return StreamSupport.stream(
        Spliterators.spliteratorUnknownSize(all, Spliterator.ORDERED | Spliterator.NONNULL), false);
  }

  /** Deletes the record of key (an operator's tool; the token needs the admin scope). */
  public void purge(String key) {
    call(
        () -> {
          records.purge(key);
          return null;
        });
  }

  /**
   * Runs work at most once per key and returns its value. With the lease, it runs work, renewing
   * the lease every lease/3, and stores work's value as JSON. When the key is already done it
   * returns the stored value, read as type, with replayed true, without running work.
   *
   * <p>If work throws, the key is released so that a later run runs work again; a
   * PermanentException is stored as a terminal failure instead, and later runs throw a
   * FailedException. If the lease is lost while work runs, {@link Lease#isLost()} turns true and
   * run throws a LeaseLostException, storing nothing and leaving the key to idemd: lost when idemd
   * answers a renewal so, and a LeaseExpiredException when no renewal was answered before the
   * lease's local deadline (idemd could not be reached). Work gets the lease: its attempt, whether
   * it recovered the key from a holder whose lease ran out, the recovery point an earlier holder
   * recorded, and the time it has left; it records its own with {@link Lease#checkpoint}.
   *
   * <p>A stored result that does not open (see {@link Builder#sealing}) is an {@link
   * UnsealableException}, and work does not run: the key is done, its answer unreadable here. So is
   * a recovery point the lease would start from that does not open; the key is then released for a
   * retry by a holder whose ring opens it, and work does not run either.
   */
  public <T> RunResult<T> run(String key, Class<T> type, Work<T> work, RunOptions options) {
    Ran<T> ran = claimAndRun(key, options, work, this::valueAsJson, this::failureAsJson, true);
    if (ran.finished() == null) {
      return new RunResult<>(ran.value(), false);
    }
    Claim.Finished finished = ran.finished();
    JsonNode stored = parseStored(key, finished.response());
    if (!finished.failed()) {
      try {
        return new RunResult<>(
            stored.isMissingNode() ? null : mapper.treeToValue(stored, type), true);
      } catch (JsonProcessingException e) {
        throw new IdemException(
            "idem: the result stored for \"" + key + "\" is not a " + type.getName(), e);
      }
    }
    String message =
        stored.path("message").isTextual() ? stored.path("message").asText() : "failed";
    JsonNode value = stored.path("value");
    throw new FailedException(message, value.isMissingNode() || value.isNull() ? null : value);
  }

  /**
   * What {@link #claimAndRun} did: the claim found the key finished (finished, value null), or work
   * ran under the lease and value is stored (finished null).
   */
  record Ran<T>(Claim.Finished finished, T value) {}

  /** Makes what is stored for a key of a value or of a permanent failure. */
  @FunctionalInterface
  interface Encoder<T> {
    StoredResponse encode(T value) throws Exception;
  }

  /**
   * The run path that run, once and consume, and a {@link Completer}, share: claims key with the
   * options' fingerprint, lease and wait; hands back a finished key's claim without running work;
   * otherwise runs work under the lease and stores its value as result encodes it. A
   * PermanentException is stored as the failure that failure makes of it, and thrown. Any other
   * exception from work releases the key for a retry when releaseOnError, and otherwise leaves it
   * pending, so that it comes back to the abandoned-keys feed once the lease runs out; it is thrown
   * (a checked one wrapped in an IdemException). A lost lease stores nothing and throws the
   * LeaseLostException; a value that could not be stored throws a ResultNotStoredException. A
   * recovery point the lease would start from that does not open is an UnsealableException, work
   * not run, and goes back with the key as a failure of work does: released for a retry when
   * releaseOnError, left pending otherwise.
   */
  <T> Ran<T> claimAndRun(
      String key,
      RunOptions options,
      Work<T> work,
      Encoder<? super T> result,
      Encoder<PermanentException> failure,
      boolean releaseOnError) {
    RunOptions o = options == null ? RunOptions.DEFAULT : options;
    Duration lease = o.lease() != null ? o.lease() : DEFAULT_LEASE;
    // A recovery point the lease would start from that does not open goes back with the key as a
    // failure of work does: released for a retry, or left pending for the feed.
    Claim claim =
        claim(
            key, new ClaimOptions(o.fingerprint(), lease, o.waitFor(), null, null), releaseOnError);
    if (claim instanceof Claim.Finished finished) {
      return new Ran<>(finished, null);
    }
    Claim.Acquired acquired = (Claim.Acquired) claim;
    T value;
    try {
      value = underLease(key, acquired, lease, work);
    } catch (LeaseLostException e) {
      throw e;
    } catch (PermanentException e) {
      StoredResponse stored;
      try {
        stored = failure.encode(e);
      } catch (Exception encoding) {
        throw new IdemException(
            "idem: the failure of \"" + key + "\" could not be made a stored response", encoding);
      }
      releaseAsFailed(key, acquired.leaseToken(), stored, null);
      throw e;
    } catch (RuntimeException | Error e) {
      if (releaseOnError) {
        releaseQuietly(key, acquired, e);
      }
      throw e;
    } catch (Exception e) {
      if (releaseOnError) {
        releaseQuietly(key, acquired, e);
      }
      throw new IdemException("idem: the work of \"" + key + "\" failed", e);
    }
    try {
      complete(key, acquired.leaseToken(), result.encode(value));
    } catch (Exception e) {
      throw new ResultNotStoredException(key, value, e);
    }
    return new Ran<>(null, value);
  }

  /** A value as run stores it: JSON, or an empty body for null. */
  StoredResponse valueAsJson(Object value) throws JsonProcessingException {
    return jsonResponse(value == null ? "" : mapper.writeValueAsString(value));
  }

  /**
   * A permanent failure as run stores it: its message and value as JSON, which later runs read back
   * into a FailedException.
   */
  StoredResponse failureAsJson(PermanentException e) {
    ObjectNode failure = mapper.createObjectNode();
    failure.put("message", e.getMessage());
    failure.set(
        "value", e.value() == null ? NullNode.getInstance() : mapper.valueToTree(e.value()));
    return jsonResponse(failure.toString());
  }

  public <T> RunResult<T> run(String key, Class<T> type, Work<T> work) {
    return run(key, type, work, RunOptions.DEFAULT);
  }

  /**
   * Runs work at most once per key, for consumers of brokers that deliver at least once. Returns
   * true when work ran now, false when an earlier delivery already ran it. An exception from work
   * releases the key so that the next delivery runs work again; another consumer running the same
   * key is an InProgressException: leave the message for redelivery. Work gets the lease, as with
   * run.
   */
  public boolean once(String key, Task work, RunOptions options) {
    RunResult<Void> r =
        run(
            key,
            Void.class,
            lease -> {
              work.run(lease);
              return null;
            },
            options);
    return !r.replayed();
  }

  public boolean once(String key, Task work) {
    return once(key, work, RunOptions.DEFAULT);
  }

  /**
   * Runs work at most once for a message's key and says what to do with the delivery, by the same
   * table in every idemd client (docs/queues.md):
   *
   * <ul>
   *   <li>work ran and its result is stored, or an earlier delivery ran it: ACK;
   *   <li>another consumer holds the key: REQUEUE after the time its lease has left; never drop the
   *       message;
   *   <li>work threw: the key is released and the message requeued;
   *   <li>work threw a PermanentException: the failure is stored and the message dead-lettered; a
   *       later delivery of it is dead-lettered without running work;
   *   <li>idemd could not be asked, or did not store the outcome: REQUEUE. Work does not run
   *       without a lease.
   *   <li>the key's stored result, or the recovery point work would start from, does not open (an
   *       {@link UnsealableException}: sealed with a key this client does not hold, say): REQUEUE
   *       with the error, without running work; never ACK. The message is kept, so that a consumer
   *       whose ring holds the key can take it, and the error shows that one is needed.
   * </ul>
   *
   * <p>Work gets the lease, as with run: a recovered lease means that a consumer died holding the
   * key, so the work may be done in part and must fence or reconcile its effects.
   */
  public Verdict consume(String key, Task work, RunOptions options) {
    boolean[] ran = {false};
    Throwable[] thrown = {null};
    try {
      run(
          key,
          Void.class,
          lease -> {
            ran[0] = true;
            try {
              work.run(lease);
            } catch (Exception | Error e) {
              thrown[0] = e;
              throw e;
            }
            return null;
          },
          options);
      return new Verdict(Verdict.Action.ACK, Duration.ZERO, ran[0], Optional.empty());
    } catch (RuntimeException | Error e) {
      if (!ran[0]) {
        // An UnsealableException is requeued with the rest: a configuration to fix (the
        // consumer's key ring), and never a reason to drop the message.
        if (e instanceof FailedException || e instanceof FingerprintMismatchException) {
          return new Verdict(Verdict.Action.DEAD_LETTER, Duration.ZERO, false, Optional.of(e));
        }
        Duration delay =
            e instanceof InProgressException p
                ? p.retryAfter().orElse(REQUEUE_DELAY)
                : REQUEUE_DELAY;
        return new Verdict(Verdict.Action.REQUEUE, delay, false, Optional.of(e));
      }
      if (e instanceof PermanentException && e == thrown[0]) {
        return new Verdict(Verdict.Action.DEAD_LETTER, Duration.ZERO, true, Optional.of(e));
      }
      return new Verdict(Verdict.Action.REQUEUE, REQUEUE_DELAY, true, Optional.of(e));
    }
  }

  public Verdict consume(String key, Task work) {
    return consume(key, work, RunOptions.DEFAULT);
  }

  /**
   * Runs work under the lease acquired gave, renewing it every lease/3, with the lease current on
   * this thread. When a renewal finds the lease gone, or the lease's local deadline passes with no
   * renewal answered, the lease turns lost and a LeaseLostException (a LeaseExpiredException for
   * the deadline) is thrown whatever work did. The key is not finished here.
   *
   * <p>A claim answered more than lease/3 after it started (it waited for another holder) would
   * hand work a lease already partly spent: it is renewed once first, and work gets the lease from
   * that renewal. If idemd answers that the lease is gone, work does not run.
   */
  public <T> T underLease(String key, Claim.Acquired acquired, Duration lease, Work<T> work)
      throws Exception {
    long from = acquired.sentAtNanos();
    if (System.nanoTime() - from > lease.toNanos() / 3) {
      // idemd started the lease when it granted it, after the wait, so the claim's own
      // deadline may have passed with the lease still whole: the renewal's answer decides.
      long sentAt = System.nanoTime();
      try {
        extend(key, acquired.leaseToken(), lease);
        from = sentAt;
      } catch (LeaseLostException | NotFoundException e) {
        throw takenOver(key, e);
      } catch (RuntimeException e) {
        // Not answered: the claim's own deadline stands, and the renewals try again.
      }
    }
    Lease held =
        new Lease(
            key,
            acquired.attempt(),
            acquired.recovered(),
            lease,
            from,
            acquired.recoveryPoint(),
            this,
            acquired.leaseToken());
    held.checkLive();
    Renewal renewal = renew(key, acquired.leaseToken(), lease, held);
    Lease.Scope scope = held.enter();
    try {
      T value = work.run(held);
      held.checkLive();
      return value;
    } catch (Exception e) {
      LeaseLostException lost = held.lostWith();
      if (lost != null && lost != e) {
        lost.addSuppressed(e);
        throw lost;
      }
      throw e;
    } finally {
      scope.close();
      renewal.stop();
      held.end();
    }
  }

  /**
   * Starts renewing a lease every lease/3 until the returned renewal is stopped. A renewal idemd
   * answers moves held's deadline; one it answers with lease_lost or not_found loses held at once.
   * After a renewal that was not answered (idemd unreachable, a timeout, a 5xx), the next comes
   * sooner, and sooner still as the deadline nears; once the deadline passes, held is lost and the
   * renewals end.
   */
  public Renewal renew(String key, String leaseToken, Duration lease, Lease held) {
    Renewer renewer = new Renewer(key, leaseToken, lease, held);
    renewer.afterPeriodFrom(held.deadlineNanos() - Lease.reckoned(lease.toNanos()));
    return renewer;
  }

  /**
   * The pause before the next renewal after one that was not answered: drawn from [d/2, d], where d
   * is a third of the time left before the deadline, at most a sixth of the lease, at least 10 ms.
   * The draw (u in [0, 1)) spreads the renewals of holders cut off together, so that they do not
   * all come back at once.
   */
  static long retryDelayNanos(long leaseNanos, long leftNanos, double u) {
    long d = Math.max(MIN_RENEWAL_NANOS, Math.min(leaseNanos / 6, leftNanos / 3));
    long half = d / 2;
    return half + (long) (u * (d - half));
  }

  /** One lease's renewals: one in flight at a time, the next scheduled once it is decided. */
  private final class Renewer implements Renewal {
    final String key;
    final String leaseToken;
    final Duration lease;
    final Lease held;
    final long period;
    private boolean stopped;
    private ScheduledFuture<?> next;

    Renewer(String key, String leaseToken, Duration lease, Lease held) {
      this.key = key;
      this.leaseToken = leaseToken;
      this.lease = lease;
      this.held = held;
      this.period = Math.max(lease.toNanos() / 3, MIN_RENEWAL_NANOS);
    }

    /**
     * Schedules the next renewal a period after the last one answered was sent: counted from the
     * send, not the answer, so that a slow answer does not push every later renewal back.
     */
    void afterPeriodFrom(long sentAtNanos) {
      after(Math.max(0, period - (System.nanoTime() - sentAtNanos)));
    }

    synchronized void after(long delayNanos) {
      if (stopped) {
        return;
      }
      try {
        next = renewals.schedule(this::send, delayNanos, TimeUnit.NANOSECONDS);
      } catch (RejectedExecutionException e) {
        // The client is closed: its leases are no longer renewed.
      }
    }

    private void send() {
      if (isStopped() || held.isLost()) {
        return;
      }
      try {
        renewalCalls.execute(this::extendOnce);
      } catch (RejectedExecutionException e) {
        // The client is closed: its leases are no longer renewed.
      }
    }

    private void extendOnce() {
      long sentAt = System.nanoTime();
      try {
        extend(key, leaseToken, lease);
      } catch (LeaseLostException | NotFoundException e) {
        synchronized (this) {
          if (!stopped) {
            held.lose(takenOver(key, e));
          }
        }
        return;
      } catch (RuntimeException e) {
        long left = held.deadlineNanos() - System.nanoTime();
        if (left > 0 && !held.isLost()) {
          after(retryDelayNanos(lease.toNanos(), left, ThreadLocalRandom.current().nextDouble()));
        }
        return;
      }
      if (held.renewed(sentAt)) {
        afterPeriodFrom(sentAt);
      }
    }

    private synchronized boolean isStopped() {
      return stopped;
    }

    @Override
    public synchronized void stop() {
      stopped = true;
      if (next != null) {
        next.cancel(false);
      }
    }
  }

  /** The LeaseLostException for a lease that idemd answered is no longer this caller's. */
  private static LeaseLostException takenOver(String key, IdemProblemException e) {
    return new LeaseLostException(
        new IdemProblemException.Problem(
            e.status(),
            "lease_lost",
            "Lease lost",
            "",
            "\"" + key + "\" was taken over while the operation ran",
            null),
        e);
  }

  /** The lease renewals started by {@link #renew}. */
  @FunctionalInterface
  public interface Renewal {
    void stop();
  }

  /** Stops the lease renewals' and the batches' threads. */
  @Override
  public void close() {
    renewals.shutdownNow();
    renewalCalls.shutdownNow();
    if (batcher != null) {
      batcher.close();
    }
  }

  /** Runs a claim, complete, release or extend, in a batch when it can share one. */
  private Object exec(BatchItem item) {
    return batcher != null ? batcher.run(item) : single(item);
  }

  /** Sends item's call on its own. */
  private Object single(BatchItem item) {
    if (item.getClaim() != null) {
      return call(() -> claims.claim(item.getClaim()));
    }
    if (item.getComplete() != null) {
      return call(() -> claims.complete(item.getComplete()));
    }
    if (item.getRelease() != null) {
      return call(() -> claims.release(item.getRelease()));
    }
    return call(() -> claims.extend(item.getExtend()));
  }

  /** How the batcher reaches idemd. */
  private final class Transport implements Batcher.Transport {
    @Override
    public Object single(BatchItem item) {
      return IdemClient.this.single(item);
    }

    @Override
    public BatchResults batch(java.util.List<BatchItem> items) {
      return call(() -> claims.batch(new BatchRequest().items(items)));
    }

    @Override
    public IdemProblemException problem(int status, io.idemd.api.model.Problem p) {
      if (p == null) {
        return problemOf(status, null, null, null);
      }
      return problemOf(
          status,
          Objects.toString(p.getCode(), ""),
          Objects.toString(p.getTitle(), ""),
          Objects.toString(p.getType(), ""),
          Objects.toString(p.getDetail(), ""),
          p.getRetryAfterMs() == null ? null : Duration.ofMillis(p.getRetryAfterMs()),
          null);
    }
  }

  private void releaseQuietly(String key, Claim.Acquired acquired, Throwable cause) {
    try {
      // If this release fails too, the lease runs out and a later run runs the work again.
      releaseForRetry(key, acquired.leaseToken());
    } catch (RuntimeException e) {
      cause.addSuppressed(e);
    }
  }

  private JsonNode parseStored(String key, Optional<StoredResponse> response) {
    if (response.isEmpty() || response.get().body().length == 0) {
      return com.fasterxml.jackson.databind.node.MissingNode.getInstance();
    }
    try {
      return mapper.readTree(response.get().body());
    } catch (IOException e) {
      throw new IdemException(
          "idem: the result stored for \"" + key + "\" is not JSON: was it stored by run?", e);
    }
  }

  private static StoredResponse jsonResponse(String body) {
    return StoredResponse.of(200, "application/json", body);
  }

  /** A call of the generated client. */
  @FunctionalInterface
  private interface Call<T> {
    T send() throws ApiException;
  }

  /**
   * Sends one call in a slot, resending it after a transport failure, and returns its answer or
   * throws the problem it answered.
   */
  private <T> T call(Call<T> send) {
    long deadline = System.nanoTime() + timeout.toNanos();
    try {
      if (!slots.tryAcquire(timeout.toNanos(), TimeUnit.NANOSECONDS)) {
        throw new UnavailableException(
            new IdemProblemException.Problem(
                0,
                "",
                "No free slot",
                "",
                "every one of the client's call slots stayed busy",
                null),
            null);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IdemException("idem: interrupted", e);
    }
    try {
      for (int attempt = 0; ; attempt++) {
        try {
          return send.send();
        } catch (ApiException e) {
          if (e.getCode() != 0) {
            throw problemOf(e.getCode(), e.getResponseHeaders(), e.getResponseBody(), e);
          }
          Throwable cause = e.getCause();
          if (cause instanceof InterruptedException || Thread.currentThread().isInterrupted()) {
            throw new IdemException("idem: interrupted", e);
          }
          if (cause instanceof JsonProcessingException) {
            throw new IdemException("idem: the answer is not idemd's; is the base URL idemd's?", e);
          }
          long pause = backoff.toNanos() << Math.min(attempt, 20);
          if (attempt >= retries
              || cause instanceof HttpTimeoutException
              || System.nanoTime() + pause >= deadline) {
            throw new UnavailableException(
                new IdemProblemException.Problem(
                    0, "", "No answer", "", "idemd could not be reached: " + cause, null),
                e);
          }
          try {
            TimeUnit.NANOSECONDS.sleep(pause);
          } catch (InterruptedException ie) {
            Thread.currentThread().interrupt();
            throw new IdemException("idem: interrupted", ie);
          }
        }
      }
    } finally {
      slots.release();
    }
  }

  /** Reads a failed answer into the exception its code (or, without one, its status) names. */
  IdemProblemException problemOf(int status, HttpHeaders headers, String body, Throwable cause) {
    String mediaType =
        headers == null
            ? ""
            : headers
                .firstValue("Content-Type")
                .orElse("")
                .split(";")[0]
                .trim()
                .toLowerCase(java.util.Locale.ROOT);
    String code = "";
    String title = "";
    String type = "";
    String detail = "";
    Duration retryAfter = null;
    JsonNode wire = null;
    if (mediaType.equals("application/problem+json") || mediaType.equals("application/json")) {
      try {
        wire = mapper.readTree(body == null ? "" : body);
      } catch (IOException e) {
        wire = null;
      }
    }
    if (wire != null && wire.isObject()) {
      code = wire.path("code").asText("");
      title = wire.path("title").asText("");
      type = wire.path("type").asText("");
      detail = wire.path("detail").asText("");
      if (wire.path("retry_after_ms").canConvertToLong()
          && wire.path("retry_after_ms").isNumber()) {
        retryAfter = Duration.ofMillis(wire.path("retry_after_ms").asLong());
      }
    } else {
      // Not idemd's answer: a proxy or load balancer in between.
      String text = body == null ? "" : body.strip();
      detail = text.length() > 200 ? text.substring(0, 200) : text;
    }
    if (retryAfter == null && headers != null) {
      Optional<String> seconds = headers.firstValue("Retry-After");
      if (seconds.isPresent() && seconds.get().matches("[0-9]{1,9}")) {
        retryAfter = Duration.ofSeconds(Long.parseLong(seconds.get()));
      }
    }
    return problemOf(status, code, title, type, detail, retryAfter, cause);
  }

  /** The exception a problem's code (or, without one, its status) names. */
  static IdemProblemException problemOf(
      int status,
      String code,
      String title,
      String type,
      String detail,
      Duration retryAfter,
      Throwable cause) {
    IdemProblemException.Problem p =
        new IdemProblemException.Problem(status, code, title, type, detail, retryAfter);
    switch (code) {
      case "in_progress":
        return new InProgressException(p, cause);
      case "fingerprint_mismatch":
        return new FingerprintMismatchException(p, cause);
      case "lease_lost":
        return new LeaseLostException(p, cause);
      case "not_found":
        return new NotFoundException(p, cause);
      case "payload_too_large":
        return new PayloadTooLargeException(p, cause);
      case "quota_exceeded":
        return new QuotaExceededException(p, cause);
      case "store_unavailable":
      case "not_replicated":
        return new UnavailableException(p, cause);
      case "":
        if (status == 502 || status == 503 || status == 504) {
          return new UnavailableException(p, cause);
        }
        if (status == 413) {
          return new PayloadTooLargeException(p, cause);
        }
        return new IdemProblemException(p, cause);
      default:
        return new IdemProblemException(p, cause);
    }
  }

  private static String hex(int bytes) {
    byte[] b = new byte[bytes];
    RANDOM.nextBytes(b);
    return HexFormat.of().formatHex(b);
  }

  /** Sets up an IdemClient. */
  public static final class Builder {
    private final String baseUrl;
    private String token;
    private Duration timeout = Duration.ofSeconds(10);
    private Duration connectTimeout = Duration.ofSeconds(5);
    private int retries = 3;
    private Duration backoff = Duration.ofMillis(50);
    private String owner;
    private Duration retention;
    private int maxConcurrentCalls = 64;
    private boolean batching = true;
    private String tenant;
    private KeyRing ring;
    private boolean requireSealed;

    private Builder(String baseUrl) {
      URI uri = URI.create(Objects.requireNonNull(baseUrl, "baseUrl").replaceAll("/+$", ""));
      if (uri.getScheme() == null || uri.getHost() == null) {
        throw new IllegalArgumentException(
            "idem: the base URL needs a scheme and a host: " + baseUrl);
      }
      this.baseUrl = uri.toString();
    }

    /** An API token, sent as Authorization: Bearer, for a daemon with an auth file. */
    public Builder token(String token) {
      this.token = token == null || token.isEmpty() ? null : token;
      return this;
    }

    /**
     * Bounds each call, resends included; a claim that waits gets its wait on top. Default 10 s.
     */
    public Builder timeout(Duration timeout) {
      this.timeout = positive(timeout, "timeout");
      return this;
    }

    /** Bounds each connection's setup. Default 5 s. */
    public Builder connectTimeout(Duration connectTimeout) {
      this.connectTimeout = positive(connectTimeout, "connectTimeout");
      return this;
    }

    /**
     * How many times a call is resent after a transport failure (a connection refused or reset
     * before any answer); default 3. A resent claim carries the same claim secret and gets the same
     * lease back; a resent complete or release is answered like the first.
     */
    public Builder retries(int retries) {
      if (retries < 0) {
        throw new IllegalArgumentException("idem: retries must not be negative");
      }
      this.retries = retries;
      return this;
    }

    /** The first pause before a resend, doubled for each next one; default 50 ms. */
    public Builder backoff(Duration backoff) {
      this.backoff = positive(backoff, "backoff");
      return this;
    }

    /**
     * The owner label of this client's claims, shown by lookups; it grants nothing. Default random.
     */
    public Builder owner(String owner) {
      this.owner = owner;
      return this;
    }

    /** How long completed and failed results are kept; default the daemon's (24 h). */
    public Builder retention(Duration retention) {
      this.retention = positive(retention, "retention");
      return this;
    }

    /**
     * How many calls may be in flight at once, hence how many connections the client opens at most;
     * default 64. A call waits up to the timeout for a slot.
     */
    public Builder maxConcurrentCalls(int maxConcurrentCalls) {
      if (maxConcurrentCalls < 1) {
        throw new IllegalArgumentException("idem: maxConcurrentCalls must be at least 1");
      }
      this.maxConcurrentCalls = maxConcurrentCalls;
      return this;
    }

    /**
     * Whether concurrent calls share requests; default true. A claim (that does not wait),
     * complete, release or extend goes out at once when none of this client's requests is in
     * flight; the calls made meanwhile go out together as one POST /v1/batch when it returns, each
     * answered as it would be alone. A daemon without the batch endpoint is detected on the first
     * batch, and calls go one by one from then on.
     */
    public Builder batching(boolean batching) {
      this.batching = batching;
      return this;
    }

    /**
     * Seals the results this client stores and the recovery points it records with ring, and opens
     * them when they come back (docs/sealing.md); off by default. tenant names the key space the
     * client works in (its token's tenant, such as "payments"): it is bound into every envelope, so
     * that one sealed under one tenant's name does not open under another's, and every client of
     * the tenant gives the same. Everything above the client seals and opens with it: run, once,
     * consume, a {@link Completer} and the Idempotency-Key filter.
     *
     * <p>Without sealing, results are stored plain, and a sealed one that comes back is an {@link
     * UnsealableException} (unknown_key), never its envelope passed on; recovery points are
     * recorded and handed on as they are, whatever their first byte (a point has no mark of its
     * own, so an envelope cannot be told from plain data that starts like one). With it, a plain
     * result (stored before sealing was turned on, or by a client without a ring) passes through as
     * it is, unless {@link #requireSealed}.
     */
    public Builder sealing(String tenant, KeyRing ring) {
      Objects.requireNonNull(tenant, "tenant");
      Objects.requireNonNull(ring, "ring");
      if (tenant.isEmpty()) {
        throw new IllegalArgumentException("idem: sealing needs the tenant's name");
      }
      this.tenant = tenant;
      this.ring = ring;
      return this;
    }

    /**
     * Whether a plain result or recovery point is refused, as an {@link UnsealableException}
     * (not_sealed), instead of passed through; default false. Turn it on once every plain result
     * has passed its retention: the store can then no longer slip a result of its own past the
     * client. It needs {@link #sealing}.
     */
    public Builder requireSealed(boolean requireSealed) {
      this.requireSealed = requireSealed;
      return this;
    }

    /** Builds the client; throws when requireSealed is set without sealing. */
    public IdemClient build() {
      if (requireSealed && ring == null) {
        throw new IllegalStateException(
            "idem: requireSealed needs sealing(tenant, ring): without a ring nothing opens");
      }
      return new IdemClient(this);
    }

    private static Duration positive(Duration d, String name) {
      if (d == null || d.isNegative() || d.isZero()) {
        throw new IllegalArgumentException("idem: " + name + " must be positive");
      }
      return d;
    }
  }
}
