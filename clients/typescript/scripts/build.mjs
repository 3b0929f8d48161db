// Builds dist/esm (ES modules) and dist/cjs (CommonJS), each with .d.ts declarations, with
// two runs of tsc; dist/cjs/package.json marks its .js files as CommonJS (this package is
// "type": "module").
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");

rmSync(join(root, "dist"), { recursive: true, force: true });
for (const project of ["tsconfig.json", "tsconfig.cjs.json"]) {
  try {
    execFileSync(process.execPath, [tsc, "-p", join(root, project)], { cwd: root, stdio: "inherit" });
  } catch {
    console.error(`build failed: tsc -p ${project} (its errors are above)`);
    process.exit(1);
  }
}
mkdirSync(join(root, "dist", "cjs"), { recursive: true });
writeFileSync(join(root, "dist", "cjs", "package.json"), '{\n  "type": "commonjs"\n}\n');
console.log("built dist/esm and dist/cjs");
