package io.idemd;

import io.idemd.api.model.BatchItem;
import io.idemd.api.model.BatchItemResult;
import io.idemd.api.model.BatchResults;
import io.idemd.api.model.ClaimAnswer;
import io.idemd.api.model.StoredResponse;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * Natural batching: the claims, completes, releases and extends an IdemClient makes while one of
 * its requests is in flight gather, and go out together as one POST /v1/batch when it returns.
 * There is no timer: a lone call waits for nothing.
 *
 * <p>The caller whose call finds nothing in flight sends it and becomes the sender; once its own
 * call is answered, it hands what gathered meanwhile to the batcher's thread and returns, so that
 * no caller waits for others' batches.
 */
final class Batcher {
  // The bounds of one batch. A call larger than MAX_ITEM_BYTES goes on its own, so that a
  // batch stays far below any daemon's body limit (at least 64 KiB).
  private static final int MAX_ITEMS = 128;
  private static final int MAX_BYTES = 60 << 10;
  private static final int MAX_ITEM_BYTES = 16 << 10;

  /** How a Batcher reaches idemd; both throw as IdemClient's calls do. */
  interface Transport {
    Object single(BatchItem item);

    BatchResults batch(List<BatchItem> items);

    IdemProblemException problem(int status, io.idemd.api.model.Problem problem);
  }

  private static final class Call {
    final BatchItem item;
    final int bytes;
    final CompletableFuture<Object> result = new CompletableFuture<>();

    Call(BatchItem item, int bytes) {
      this.item = item;
      this.bytes = bytes;
    }
  }

  private final Transport transport;
  private final Duration timeout;
  private final ArrayDeque<Call> queue = new ArrayDeque<>();
  private final ExecutorService sender =
      Executors.newSingleThreadExecutor(
          r -> {
            Thread t = new Thread(r, "idemd-batcher");
            t.setDaemon(true);
            return t;
          });
  private boolean sending;

  /** Set once the daemon answered a batch as an unknown endpoint. */
  private volatile boolean unsupported;

  Batcher(Transport transport, Duration timeout) {
    this.transport = transport;
    this.timeout = timeout;
  }

  /** Runs item: in a batch when it can share a request, on its own otherwise. */
  Object run(BatchItem item) {
    int bytes = estimate(item);
    if (unsupported || bytes > MAX_ITEM_BYTES) {
      return transport.single(item);
    }
    Call call = new Call(item, bytes);
    boolean lead;
    synchronized (this) {
      queue.add(call);
      lead = !sending;
      sending = true;
    }
    if (lead) {
      drive(call);
    }
    try {
      // The batch a call went in is bounded by the client's timeout, and so is its wait
      // in the queue for the request in flight.
      return call.result.get(2 * timeout.toNanos(), TimeUnit.NANOSECONDS);
    } catch (ExecutionException e) {
      if (e.getCause() instanceof RuntimeException r) {
        throw r;
      }
      throw new IdemException("idem: the call failed", e.getCause());
    } catch (TimeoutException e) {
      throw new UnavailableException(
          new IdemProblemException.Problem(
              0, "", "No answer", "", "no answer within " + timeout.multipliedBy(2), null),
          e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IdemException("idem: interrupted", e);
    }
  }

  void close() {
    sender.shutdownNow();
  }

  /** Sends what gathered, batch after batch, until mine is answered or nothing is left. */
  private void drive(Call mine) {
    for (; ; ) {
      List<Call> calls = next();
      if (calls.isEmpty()) {
        return;
      }
      send(calls);
      if (mine != null && mine.result.isDone()) {
        synchronized (this) {
          if (queue.isEmpty()) {
            sending = false;
            return;
          }
        }
        try {
          sender.execute(() -> drive(null));
        } catch (java.util.concurrent.RejectedExecutionException e) {
          // The client is closed: what gathered is answered with that, not left waiting.
          List<Call> left;
          synchronized (this) {
            left = new ArrayList<>(queue);
            queue.clear();
            sending = false;
          }
          IdemException closed = new IdemException("idem: the client is closed", e);
          left.forEach(c -> c.result.completeExceptionally(closed));
        }
        return;
      }
    }
  }

  /** Takes the calls of the next batch off the queue, or ends the sending when none are left. */
  private synchronized List<Call> next() {
    List<Call> calls = new ArrayList<>();
    int size = 0;
    while (!queue.isEmpty() && calls.size() < MAX_ITEMS) {
      Call call = queue.peek();
      if (size + call.bytes + 1 > MAX_BYTES && !calls.isEmpty()) {
        break;
      }
      queue.poll();
      size += call.bytes + 1;
      calls.add(call);
    }
    if (calls.isEmpty()) {
      sending = false;
    }
    return calls;
  }

  private void send(List<Call> calls) {
    try {
      if (calls.size() == 1 || unsupported) {
        for (Call call : calls) {
          alone(call);
        }
        return;
      }
      BatchResults results;
      try {
        results = transport.batch(calls.stream().map(c -> c.item).toList());
      } catch (IdemProblemException e) {
        if (e.status() == 404 || e.status() == 405) {
          // A daemon from before the batch endpoint: batches are not tried again.
          unsupported = true;
        }
        if (e.status() == 404
            || e.status() == 405
            || e.status() == 400
            || e.status() == 413
            || e.status() == 415) {
          // Refused as a whole: every call gets the answer it would get on its own.
          for (Call call : calls) {
            alone(call);
          }
          return;
        }
        throw e;
      }
      List<BatchItemResult> items = results == null ? null : results.getResults();
      if (items == null || items.size() != calls.size()) {
        throw new IdemException(
            "idem: a batch of "
                + calls.size()
                + " calls was answered with "
                + (items == null ? "no results" : items.size() + " results")
                + "; is the base URL idemd's?");
      }
      for (int i = 0; i < calls.size(); i++) {
        settle(calls.get(i), items.get(i));
      }
    } catch (RuntimeException e) {
      // Whatever went wrong, no call is left waiting.
      for (Call call : calls) {
        call.result.completeExceptionally(e);
      }
    }
  }

  private void alone(Call call) {
    try {
      call.result.complete(transport.single(call.item));
    } catch (RuntimeException e) {
      call.result.completeExceptionally(e);
    }
  }

  /** Answers call with its item's result, as its single call would be answered. */
  private void settle(Call call, BatchItemResult r) {
    if (r == null || r.getStatus() == null) {
      call.result.completeExceptionally(
          new IdemException(
              "idem: a batch item was answered without a status; is the base URL idemd's?"));
      return;
    }
    int status = r.getStatus();
    if (status < 200 || status >= 300 || r.getProblem() != null) {
      call.result.completeExceptionally(transport.problem(status, r.getProblem()));
      return;
    }
    Object data;
    if (call.item.getClaim() != null) {
      // A claim checks its answer itself, as it does on its own.
      data =
          r.getAcquired() != null
              ? new ClaimAnswer(r.getAcquired())
              : r.getFinished() != null ? new ClaimAnswer(r.getFinished()) : null;
    } else {
      data = call.item.getExtend() != null ? r.getExtended() : r.getRecord();
      if (data == null) {
        call.result.completeExceptionally(
            new IdemException(
                "idem: a batch item was answered "
                    + status
                    + " without its result; is the base URL idemd's?"));
        return;
      }
    }
    call.result.complete(data);
  }

  private static List<String> strings(BatchItem item) {
    if (item.getClaim() != null) {
      var c = item.getClaim();
      return java.util.Arrays.asList(
          c.getKey(), c.getFingerprint(), c.getOwner(), c.getClaimSecret());
    }
    if (item.getComplete() != null) {
      return java.util.Arrays.asList(
          item.getComplete().getKey(), item.getComplete().getLeaseToken());
    }
    if (item.getRelease() != null) {
      return java.util.Arrays.asList(item.getRelease().getKey(), item.getRelease().getLeaseToken());
    }
    return java.util.Arrays.asList(item.getExtend().getKey(), item.getExtend().getLeaseToken());
  }

  /** An upper bound of the item's size in the batch's JSON. */
  private static int estimate(BatchItem item) {
    StoredResponse response = null;
    if (item.getComplete() != null) {
      response = item.getComplete().getResponse();
    } else if (item.getRelease() != null) {
      response = item.getRelease().getResponse();
    }
    int bytes = 256;
    for (String s : strings(item)) {
      bytes += s == null ? 0 : 6 * s.length();
    }
    if (response != null) {
      byte[] body = response.getBody();
      bytes += body == null ? 0 : (body.length + 2) / 3 * 4;
      byte[] sealed = response.getSealed();
      bytes += sealed == null ? 0 : (sealed.length + 2) / 3 * 4;
      Map<String, List<String>> headers = response.getHeaders();
      if (headers != null) {
        for (Map.Entry<String, List<String>> h : headers.entrySet()) {
          for (String v : h.getValue()) {
            bytes += 6 * (h.getKey().length() + v.length()) + 8;
          }
        }
      }
    }
    return bytes;
  }
}
