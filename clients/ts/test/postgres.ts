// A real PostgreSQL for the tests: initdb into a directory of its own, postgres on a free
// loopback port (as the postgres user when the tests run as root, since initdb refuses
// root), stopped by its PID. Without PostgreSQL installed the tests skip, unless
// IDEMD_REQUIRE_POSTGRES is set (as .ci/run does), which turns the skip into a failure.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { chownSync, closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { freePort, scaled } from "./daemon.js";

export const notInstalled = "PostgreSQL not installed (apt-get install postgresql)";

/** Where initdb and postgres are: the PATH, else the newest of Debian's /usr/lib/postgresql/N/bin. */
function binDir(): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(":")) {
    if (dir && existsSync(join(dir, "initdb")) && existsSync(join(dir, "postgres"))) return dir;
  }
  const root = "/usr/lib/postgresql";
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(join(root, v, "bin", "initdb")))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] === undefined ? undefined : join(root, versions[0], "bin");
}

/** Why the PostgreSQL tests cannot run here, or undefined when they can. */
export function skipReason(): string | undefined {
  if (binDir() !== undefined) return undefined;
  if (process.env.IDEMD_REQUIRE_POSTGRES) {
    throw new Error(`PostgreSQL is required (IDEMD_REQUIRE_POSTGRES is set): ${notInstalled}`);
  }
  return notInstalled;
}

export class Postgres {
  readonly url: string;
  readonly #process: ChildProcess;
  readonly #dir: string;
  readonly #exited: Promise<void>;

  private constructor(url: string, child: ChildProcess, dir: string) {
    this.url = url;
    this.#process = child;
    this.#dir = dir;
    this.#exited = new Promise((resolve) => child.once("exit", () => resolve()));
  }

  /** Runs initdb and postgres, and resolves once the server accepts connections. */
  static async start(): Promise<Postgres> {
    const bin = binDir();
    if (bin === undefined) throw new Error(notInstalled);
    const dir = mkdtempSync(join(tmpdir(), "idemd-pg-"));
    let user: { uid: number; gid: number } | undefined;
    if (process.getuid?.() === 0) {
      const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
      const gid = Number(execFileSync("id", ["-g", "postgres"]).toString().trim());
      user = { uid, gid };
      chownSync(dir, uid, gid);
    }
    const data = join(dir, "data");
    execFileSync(
      join(bin, "initdb"),
      ["-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
      { stdio: "pipe", ...user },
    );
    // A port found free may be taken before postgres binds it: try a few.
    for (let tries = 0; ; tries++) {
      const port = await freePort();
      const log = join(dir, `postgres-${tries}.log`);
      const out = openSync(log, "w");
      const child = spawn(
        join(bin, "postgres"),
        [
          ...["-D", data, "-p", String(port), "-h", "127.0.0.1", "-k", dir],
          ...["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
        ],
        { stdio: ["ignore", out, out], ...user },
      );
      closeSync(out);
      const server = new Postgres(`postgres://postgres@127.0.0.1:${port}/postgres`, child, dir);
      // A test process that ends without its after hooks still stops the server.
      process.once("exit", () => server.#kill());
      const deadline = Date.now() + scaled(30_000);
      for (;;) {
        if (child.exitCode !== null) break;
        const conn = new pg.Client({ connectionString: server.url });
        try {
          await conn.connect();
          await conn.end();
          return server;
        } catch {
          await conn.end().catch(() => undefined);
        }
        if (Date.now() > deadline) {
          await server.stop();
          throw new Error(`postgres did not accept connections in time: ${readFileSync(log, "utf8")}`);
        }
        await sleep(20);
      }
      const logs = readFileSync(log, "utf8");
      if (tries >= 4 || !/could not bind|could not create any TCP\/IP sockets/.test(logs)) {
        rmSync(dir, { recursive: true, force: true });
        throw new Error(`postgres exited: ${logs}`);
      }
    }
  }

  /** Stops the server (a fast shutdown; SIGKILL after 30 s) and removes its directory. */
  async stop(): Promise<void> {
    const pid = this.#process.pid;
    if (this.#process.exitCode === null && this.#process.signalCode === null && pid !== undefined) {
      process.kill(pid, "SIGINT");
      const killed = setTimeout(() => this.#kill(), 30_000);
      await this.#exited;
      clearTimeout(killed);
    }
    rmSync(this.#dir, { recursive: true, force: true });
  }

  #kill(): void {
    const pid = this.#process.pid;
    if (this.#process.exitCode === null && this.#process.signalCode === null && pid !== undefined) {
      process.kill(pid, "SIGKILL");
    }
  }
}
