// A loopback TCP proxy in front of a real server that can lose answers: it forwards a
// connection's request, and for the first `dropAnswers` connections it closes the
// client's side as soon as the server's answer starts, so the client never reads it
// although the server acted on the request.
import { connect, createServer, type Server, type Socket } from "node:net";

export class LossyProxy {
  readonly url: string;
  dropAnswers: number;
  /** How many answers were dropped so far. */
  dropped = 0;
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();

  private constructor(server: Server, url: string, dropAnswers: number) {
    this.#server = server;
    this.url = url;
    this.dropAnswers = dropAnswers;
  }

  static async start(target: string, dropAnswers: number): Promise<LossyProxy> {
    const { hostname, port } = new URL(target);
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("no address");
    const proxy = new LossyProxy(server, `http://127.0.0.1:${address.port}`, dropAnswers);
    server.on("connection", (client) => {
      const upstream = connect(Number(port), hostname);
      proxy.#sockets.add(client).add(upstream);
      const drop = proxy.dropped < proxy.dropAnswers;
      if (drop) proxy.dropped++;
      client.on("data", (chunk) => upstream.write(chunk));
      upstream.on("data", (chunk) => {
        if (drop) {
          client.destroy();
          upstream.destroy();
          return;
        }
        client.write(chunk);
      });
      for (const [a, b] of [
        [client, upstream],
        [upstream, client],
      ] as const) {
        a.on("end", () => b.end());
        a.on("error", () => b.destroy());
        a.on("close", () => {
          b.destroy();
          proxy.#sockets.delete(a);
        });
      }
    });
    return proxy;
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise((resolve) => this.#server.close(resolve));
  }
}
