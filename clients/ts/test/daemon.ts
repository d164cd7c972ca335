// Real idemd daemons for the tests: the binary test/run.js built from this repository,
// started on a free loopback port with its embedded store in a temporary directory,
// and stopped by its PID.
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { IdemClient } from "../src/index.js";

/**
 * How much longer than an ordinary machine the tests allow for: every deadline a test
 * gives a condition is multiplied by IDEMD_TEST_SLOWDOWN, 3 unless set. A condition that
 * holds ends its wait at once, so a larger factor only makes a failing test slower to
 * fail. Lease lengths and timeouts that a test is about are not scaled.
 */
export const slowdown = ((value) => {
  if (value === undefined || value === "") return 3;
  const factor = Number(value);
  if (!(factor > 0)) throw new Error(`IDEMD_TEST_SLOWDOWN=${JSON.stringify(value)}: want a positive number`);
  return factor;
})(process.env.IDEMD_TEST_SLOWDOWN);

/** The deadline for a condition that an ordinary machine meets within ms. */
export function scaled(ms: number): number {
  return ms * slowdown;
}

export class Daemon {
  readonly url: string;
  readonly #process: ChildProcess;
  readonly #dataDir: string;
  readonly #exited: Promise<void>;

  private constructor(url: string, process: ChildProcess, dataDir: string) {
    this.url = url;
    this.#process = process;
    this.#dataDir = dataDir;
    this.#exited = new Promise((resolve) => process.once("exit", () => resolve()));
  }

  /** Starts idemd with args after --listen and --data-dir and waits until it is ready. */
  static start(...args: string[]): Promise<Daemon> {
    return Daemon.#start(tmpdir(), args);
  }

  /**
   * Starts idemd as start does, with its store in memory (/dev/shm) where the machine
   * has it: a test of timing then measures idemd and the client, not how long a busy
   * disk takes to sync each write.
   */
  static startInMemory(...args: string[]): Promise<Daemon> {
    return Daemon.#start(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), args);
  }

  static async #start(parent: string, args: string[]): Promise<Daemon> {
    const bin = process.env.IDEMD_BIN;
    if (!bin) throw new Error("IDEMD_BIN is not set: run the tests with `npm test` (test/run.js builds idemd)");
    const port = await freePort();
    const dataDir = mkdtempSync(join(parent, "idemd-ts-data-"));
    // Without a blob store unless args name one (a later --blob-store wins), so that a
    // result over --max-response-bytes is refused as the tests of that expect.
    const flags = [
      "--listen",
      `127.0.0.1:${port}`,
      "--data-dir",
      dataDir,
      "--log-level",
      "warn",
      "--blob-store",
      "none",
    ];
    const child = spawn(bin, [...flags, ...args], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let logs = "";
    child.stderr?.on("data", (chunk: Buffer) => {
      logs += chunk.toString();
    });
    const daemon = new Daemon(`http://127.0.0.1:${port}`, child, dataDir);
    // A test process that ends without its after hooks (a cancelled test) still stops
    // the daemons it started.
    process.once("exit", () => {
      if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
        process.kill(child.pid, "SIGKILL");
      }
    });
    const deadline = Date.now() + scaled(20_000);
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`idemd exited with ${child.exitCode}:\n${logs}`);
      try {
        const res = await fetch(`${daemon.url}/readyz`);
        if (res.status === 200) return daemon;
      } catch {
        // Not listening yet.
      }
      await sleep(20);
    }
    await daemon.stop();
    throw new Error(`idemd was not ready within 20 s:\n${logs}`);
  }

  /** The directory of the daemon's embedded store, to read what it keeps on disk. */
  get dataDir(): string {
    return this.#dataDir;
  }

  /** Kills the daemon by its PID, waits for it to exit, and removes its data. */
  async stop(): Promise<void> {
    if (this.#process.exitCode === null && this.#process.signalCode === null && this.#process.pid !== undefined) {
      process.kill(this.#process.pid, "SIGKILL");
      await this.#exited;
    }
    rmSync(this.#dataDir, { recursive: true, force: true });
  }
}

/** A loopback port nobody listens on right now. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise((resolve) => server.close(resolve));
  if (address === null || typeof address === "string") throw new Error("no port");
  return address.port;
}

let counter = 0;
/** A key no other test uses. */
export function freshKey(prefix: string): string {
  counter++;
  return `${prefix}-${process.pid}-${counter}-${Date.now()}`;
}

/** Waits until check() is true, failing after the deadline (scaled). */
export async function waitFor(
  what: string,
  check: () => boolean | Promise<boolean>,
  deadlineMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + scaled(deadlineMs);
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** A client whose link to idemd the test can cut: its renewals stop, its work goes on. */
export function stalledClient(baseUrl: string): { client: IdemClient; cut: (on: boolean) => void } {
  let cut = false;
  const linked: typeof fetch = (input, init) =>
    cut ? Promise.reject(new TypeError("link to idemd cut by the test")) : fetch(input, init);
  return {
    client: new IdemClient({ baseUrl, fetch: linked, retries: 0 }),
    cut: (on) => {
      cut = on;
    },
  };
}
