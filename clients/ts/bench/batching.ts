// Measures what natural batching saves: concurrent workers each claim a fresh key and
// complete it, through one IdemClient with batching off and then on, in the same run
// and against the same idemd, round after round. It reports calls per second, HTTP
// requests per call, and the CPU per call of this process and of idemd (from
// /proc/<pid>/stat). It is a command, not a test:
//
//     npm run build && node dist/bench/batching.js [-calls 20000] [-workers 64] [-rounds 3] [-- idemd flags]
//
// It builds ./cmd/idemd itself unless IDEMD_BIN names a binary, starts it on a free
// loopback port with its embedded store in a temporary directory (or the store the
// idemd flags after -- name), and stops it by its PID.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { IdemClient } from "../src/index.js";
import { freePort } from "../test/daemon.js";

const args = process.argv.slice(2);
const split = args.indexOf("--");
const own = split < 0 ? args : args.slice(0, split);
const idemdFlags = split < 0 ? [] : args.slice(split + 1);
function flag(name: string, fallback: number): number {
  const i = own.indexOf(`-${name}`);
  return i < 0 ? fallback : Number(own[i + 1]);
}
const calls = flag("calls", 20_000);
const workers = flag("workers", 64);
const rounds = flag("rounds", 3);

/** User plus system CPU time of a process, in microseconds. */
function cpuOf(pid: number): number {
  // Fields 14 and 15 of /proc/<pid>/stat, after the command name in parentheses.
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  const ticks = Number(fields[11]) + Number(fields[12]);
  return (ticks * 1e6) / 100;
}

async function startIdemd(bin: string, dataDir: string): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const child = spawn(
    bin,
    ["--listen", `127.0.0.1:${port}`, "--data-dir", dataDir, "--log-level", "warn", ...idemdFlags],
    {
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  for (let i = 0; i < 1000; i++) {
    if (child.exitCode !== null) throw new Error(`idemd exited with ${child.exitCode}`);
    const ready = await fetch(`${url}/readyz`).then(
      (res) => res.status === 200,
      () => false,
    );
    if (ready) return { url, child };
    await sleep(20);
  }
  throw new Error("idemd was not ready within 20 s");
}

async function phase(url: string, idemdPid: number, batching: boolean, round: number): Promise<string> {
  let requests = 0;
  const counting: typeof fetch = (input, init) => {
    requests++;
    return fetch(input, init);
  };
  const client = new IdemClient({ baseUrl: url, batching, fetch: counting });
  let next = 0;
  const worker = async () => {
    while (next < calls / 2) {
      const key = `bench-${round}-${batching}-${next++}`;
      const claim = await client.claim(key);
      if (claim.outcome !== "acquired") throw new Error(`${key}: ${claim.outcome}`);
      await client.complete(key, claim.leaseToken, { status: 201, body: "made" });
    }
  };
  const idemdBefore = cpuOf(idemdPid);
  const ownBefore = process.cpuUsage();
  const start = performance.now();
  await Promise.all(Array.from({ length: workers }, worker));
  const seconds = (performance.now() - start) / 1000;
  const own = process.cpuUsage(ownBefore);
  const idemdCPU = cpuOf(idemdPid) - idemdBefore;
  const made = next;
  const n = made * 2;
  return [
    `batching ${batching ? "on " : "off"}`,
    `${Math.round(n / seconds)} calls/s`,
    `${(requests / n).toFixed(3)} requests/call`,
    `client ${((own.user + own.system) / n).toFixed(1)} µs/call`,
    `idemd ${(idemdCPU / n).toFixed(1)} µs/call`,
  ].join("  ");
}

const here = dirname(fileURLToPath(import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "idemd-ts-bench-"));
let child: ChildProcess | undefined;
try {
  let bin = process.env.IDEMD_BIN;
  if (!bin) {
    bin = join(dir, "idemd");
    execFileSync("go", ["build", "-o", bin, "./cmd/idemd"], {
      cwd: resolve(here, "..", "..", "..", ".."),
      stdio: "inherit",
    });
  }
  const daemon = await startIdemd(bin, join(dir, "data"));
  child = daemon.child;
  const pid = child.pid as number;
  console.log(`${calls} calls a phase (claim and complete of fresh keys), ${workers} workers, ${rounds} rounds`);
  for (let round = 1; round <= rounds; round++) {
    console.log(`round ${round}`);
    console.log(`  ${await phase(daemon.url, pid, false, round)}`);
    console.log(`  ${await phase(daemon.url, pid, true, round)}`);
  }
} finally {
  if (child?.pid !== undefined && child.exitCode === null) process.kill(child.pid, "SIGKILL");
  rmSync(dir, { recursive: true, force: true });
}
