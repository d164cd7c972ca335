package io.idemd.testing;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A TCP relay on a loopback port in front of a real idemd, standing for the network between a
 * client and idemd: it can cut the link (every connection reset, and every new one reset as soon as
 * it is accepted, counted), restore it, and add latency to every request.
 */
public final class Relay implements AutoCloseable {
  private final ServerSocket server;
  private final String upstreamHost;
  private final int upstreamPort;
  private final Set<Socket> open = new HashSet<>();
  private final AtomicInteger refused = new AtomicInteger();
  private final AtomicInteger accepted = new AtomicInteger();
  private volatile long latencyMillis;
  private boolean cut;
  private boolean closed;

  /** The base URL a client reaches idemd by through the relay. */
  public final String url;

  private Relay(String upstreamUrl) throws IOException {
    URI upstream = URI.create(upstreamUrl);
    this.upstreamHost = upstream.getHost();
    this.upstreamPort = upstream.getPort();
    this.server = new ServerSocket(0, 256, InetAddress.getLoopbackAddress());
    this.url = "http://127.0.0.1:" + server.getLocalPort();
    Thread acceptor = new Thread(this::accept, "relay-accept");
    acceptor.setDaemon(true);
    acceptor.start();
  }

  /** Starts a relay to the idemd at upstreamUrl (such as a Daemon's url). */
  public static Relay to(String upstreamUrl) throws IOException {
    return new Relay(upstreamUrl);
  }

  /** Cuts the link: open connections are reset, and so is every new one until restore. */
  public synchronized void cut() {
    cut = true;
    for (Socket s : open) {
      reset(s);
    }
    open.clear();
  }

  /** Lets new connections through again. */
  public synchronized void restore() {
    cut = false;
  }

  /** How many connections were reset on arrival because the link was cut. */
  public int refused() {
    return refused.get();
  }

  /** How many connections were relayed to idemd. */
  public int accepted() {
    return accepted.get();
  }

  /** Holds everything a client sends for latency before passing it on. */
  public void latency(Duration latency) {
    this.latencyMillis = latency.toMillis();
  }

  @Override
  public void close() {
    synchronized (this) {
      closed = true;
      for (Socket s : open) {
        reset(s);
      }
      open.clear();
    }
    try {
      server.close();
    } catch (IOException e) {
      // Closed already.
    }
  }

  private void accept() {
    while (!server.isClosed()) {
      Socket client;
      try {
        client = server.accept();
      } catch (IOException e) {
        return;
      }
      if (isCut()) {
        refused.incrementAndGet();
        reset(client);
        continue;
      }
      Socket upstream;
      try {
        upstream = new Socket(upstreamHost, upstreamPort);
        // Each chunk goes on as it comes: Nagle's algorithm would hold a second small write
        // until the first is acknowledged, adding a delay the relay was not asked for.
        upstream.setTcpNoDelay(true);
        client.setTcpNoDelay(true);
      } catch (IOException e) {
        reset(client);
        continue;
      }
      synchronized (this) {
        // A cut that came while idemd was being connected to applies to this connection too.
        if (cut || closed) {
          refused.incrementAndGet();
          reset(client);
          reset(upstream);
          continue;
        }
        open.add(client);
        open.add(upstream);
      }
      accepted.incrementAndGet();
      pump(client, upstream, true);
      pump(upstream, client, false);
    }
  }

  private synchronized boolean isCut() {
    return cut || closed;
  }

  /**
   * Copies from one socket to the other until either ends. A delayed direction is a delay line:
   * each chunk goes on latency after it arrived, whatever came before it, so that a request written
   * in several chunks is held once, as a slower network would hold it.
   */
  private void pump(Socket from, Socket to, boolean delayed) {
    BlockingQueue<Chunk> line = new LinkedBlockingQueue<>();
    start(
        () -> {
          byte[] buf = new byte[16 << 10];
          try (InputStream in = from.getInputStream()) {
            for (int n; (n = in.read(buf)) >= 0; ) {
              Chunk c = new Chunk(System.nanoTime(), Arrays.copyOf(buf, n));
              if (delayed) {
                line.add(c);
              } else {
                to.getOutputStream().write(c.bytes);
                to.getOutputStream().flush();
              }
            }
          } catch (IOException e) {
            // The connection ended or was cut.
          } finally {
            if (delayed) {
              line.add(Chunk.END);
            } else {
              end(from, to);
            }
          }
        });
    if (!delayed) {
      return;
    }
    start(
        () -> {
          try {
            OutputStream out = to.getOutputStream();
            for (Chunk c; (c = line.take()) != Chunk.END; ) {
              long wait =
                  c.readAt + TimeUnit.MILLISECONDS.toNanos(latencyMillis) - System.nanoTime();
              if (wait > 0) {
                TimeUnit.NANOSECONDS.sleep(wait);
              }
              out.write(c.bytes);
              out.flush();
            }
          } catch (IOException | InterruptedException e) {
            // The connection ended or was cut.
          } finally {
            end(from, to);
          }
        });
  }

  private record Chunk(long readAt, byte[] bytes) {
    static final Chunk END = new Chunk(0, new byte[0]);
  }

  private void end(Socket from, Socket to) {
    synchronized (this) {
      open.remove(from);
      open.remove(to);
    }
    reset(from);
    reset(to);
  }

  private static void start(Runnable r) {
    Thread t = new Thread(r, "relay-pump");
    t.setDaemon(true);
    t.start();
  }

  private static void reset(Socket s) {
    try {
      // An abortive close, as a link that breaks leaves: the peer reads a reset.
      s.setSoLinger(true, 0);
      s.close();
    } catch (IOException e) {
      // Closed already.
    }
  }
}
