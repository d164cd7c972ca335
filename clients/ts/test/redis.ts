// A real redis-server for the tests: on a free loopback port, without persistence,
// stopped by its PID, and read and written through redis-cli. Without redis-server the
// tests skip, unless IDEMD_REQUIRE_REDIS is set (as make test does), which turns the
// skip into a failure.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { freePort, scaled } from "./daemon.js";

export const notInstalled = "redis-server not installed (apt-get install redis-server)";

function onPath(name: string): boolean {
  return (process.env.PATH ?? "").split(":").some((dir) => dir !== "" && existsSync(join(dir, name)));
}

/** Why the Redis tests cannot run here, or undefined when they can. */
export function skipReason(): string | undefined {
  if (onPath("redis-server") && onPath("redis-cli")) return undefined;
  if (process.env.IDEMD_REQUIRE_REDIS) {
    throw new Error(`Redis is required (IDEMD_REQUIRE_REDIS is set): ${notInstalled}`);
  }
  return notInstalled;
}

export class Redis {
  readonly port: number;
  readonly #process: ChildProcess;
  readonly #exited: Promise<void>;

  private constructor(port: number, child: ChildProcess) {
    this.port = port;
    this.#process = child;
    this.#exited = new Promise((resolve) => child.once("exit", () => resolve()));
  }

  /** The URL idemd's --store takes for database 0. */
  get url(): string {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  /** Starts redis-server and resolves once it answers PING. */
  static async start(): Promise<Redis> {
    const port = await freePort();
    const child = spawn(
      "redis-server",
      ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    let logs = "";
    child.stderr?.on("data", (chunk: Buffer) => {
      logs += chunk.toString();
    });
    const server = new Redis(port, child);
    // A test process that ends without its after hooks still stops the server.
    process.once("exit", () => server.#kill());
    const deadline = Date.now() + scaled(20_000);
    for (;;) {
      if (child.exitCode !== null) throw new Error(`redis-server exited with ${child.exitCode}: ${logs}`);
      try {
        if (server.cli("PING") === "PONG") return server;
      } catch {
        // Not listening yet.
      }
      if (Date.now() > deadline) {
        await server.stop();
        throw new Error(`redis-server did not answer PING within 20 s: ${logs}`);
      }
      await sleep(20);
    }
  }

  /** Runs one command through redis-cli and returns its answer, trimmed. */
  cli(...args: string[]): string {
    return execFileSync("redis-cli", ["-p", String(this.port), ...args], { stdio: ["ignore", "pipe", "pipe"] })
      .toString()
      .trim();
  }

  /** Kills the server by its PID and waits for it to exit. */
  async stop(): Promise<void> {
    if (this.#process.exitCode === null && this.#process.signalCode === null) {
      this.#kill();
      await this.#exited;
    }
  }

  #kill(): void {
    const pid = this.#process.pid;
    if (this.#process.exitCode === null && this.#process.signalCode === null && pid !== undefined) {
      process.kill(pid, "SIGKILL");
    }
  }
}
