// Generates clients from ../openapi.yaml with openapi-typescript and with
// @hey-api/openapi-ts, both with their default settings, into a temporary directory
// (never committed), and compiles the strict callers in typing/ against them.
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const spec = resolve(process.argv[2] ?? join(here, "..", "openapi.yaml"));
const bin = (name) => join(here, "node_modules", ".bin", name);
const dir = mkdtempSync(join(tmpdir(), "idemd-typing-"));
const run = (cmd, args) => execFileSync(cmd, args, { cwd: dir, stdio: ["ignore", "inherit", "inherit"] });
try {
  cpSync(join(here, "typing"), dir, { recursive: true });
  symlinkSync(join(here, "node_modules"), join(dir, "node_modules"), "dir");
  // The generators run in the temporary directory, so that no configuration of this
  // repository (redocly.yaml) changes their defaults.
  run(bin("openapi-typescript"), [spec, "-o", join(dir, "gen", "openapi-typescript", "schema.ts")]);
  run(bin("openapi-ts"), ["-i", spec, "-o", join(dir, "gen", "hey-api"), "--silent"]);
  // The generated code is compiled too (no --skipLibCheck on it): strict users compile it.
  run(bin("tsc"), ["-p", join(dir, "tsconfig.json")]);
  console.log("typing: strict callers compile against openapi-typescript and @hey-api/openapi-ts clients");
} finally {
  rmSync(dir, { recursive: true, force: true });
}
