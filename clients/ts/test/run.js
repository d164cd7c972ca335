// Runs the compiled tests with Node's test runner after building idemd from this
// repository once, into a temporary directory the test files find in IDEMD_BIN.
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..", "..");
const dir = mkdtempSync(join(tmpdir(), "idemd-ts-test-"));
let status = 1;
try {
  const bin = join(dir, "idemd");
  execFileSync("go", ["build", "-o", bin, "./cmd/idemd"], { cwd: root, stdio: "inherit" });
  const compiled = resolve(here, "..", "dist", "test");
  const only = process.argv.slice(2);
  const files =
    only.length > 0
      ? only
      : readdirSync(compiled)
          .filter((f) => f.endsWith(".test.js"))
          .map((f) => join(compiled, f));
  const run = spawnSync(process.execPath, ["--test", "--test-reporter=spec", ...files], {
    stdio: "inherit",
    env: { ...process.env, IDEMD_BIN: bin },
  });
  status = run.status ?? 1;
} finally {
  rmSync(dir, { recursive: true, force: true });
}
process.exit(status);
