// A real `stratamem serve` process on 127.0.0.1 for the tests (as tests/server_proc.py
// starts one for the Python suite): a free port, a SQLite file in a temp directory, the
// hashing embedder (or the one named) and the offline pipeline, so it needs no network and
// starts in seconds.
//
// The Python that runs it: $STRATAMEM_TEST_PYTHON (tests/test_typescript_client.py sets it
// to its own interpreter), else the repository's .venv/bin/python, else python3; it must
// import stratamem (an editable install, or PYTHONPATH=src).
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const KEY_RE = /\bsm_[A-Za-z0-9_-]{20,}/;
export const ADMIN_TOKEN = "admin-token-for-the-typescript-tests";

export function python() {
  if (process.env.STRATAMEM_TEST_PYTHON) return process.env.STRATAMEM_TEST_PYTHON;
  const venv = resolve(here, "..", "..", "..", ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

export function freePort() {
  return new Promise((ok, fail) => {
    const probe = createServer();
    probe.once("error", fail);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => ok(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class ServerProcess {
  constructor({ env = {}, embedder = "hash" } = {}) {
    this.dir = mkdtempSync(join(tmpdir(), "stratamem-ts-"));
    this.db = `sqlite:///${join(this.dir, "m.db")}`;
    this.extraEnv = env;
    this.embedder = embedder;
    this.proc = undefined;
    this.port = undefined;
  }

  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Start (or start again, on the same port and file); resolves once /healthz answers. */
  async start(timeoutMs = 60_000) {
    this.port ??= await freePort();
    const env = Object.fromEntries(
      Object.entries(process.env).filter(([k]) => !k.startsWith("STRATAMEM_")),
    );
    Object.assign(env, {
      STRATAMEM_ADMIN_TOKEN: ADMIN_TOKEN,
      STRATAMEM_WEBHOOK_ALLOW: "127.0.0.1",
      STRATAMEM_UI: "false",
      ...this.extraEnv,
    });
    // Appended: a process started again keeps the earlier run's output (the bootstrap key).
    const out = openSync(join(this.dir, "serve.out"), "a");
    const err = openSync(join(this.dir, "serve.err"), "a");
    const args = ["-m", "stratamem", "--embedder", this.embedder, "serve", "--port", String(this.port)];
    this.proc = spawn(python(), [...args, "--database-url", this.db], {
      env,
      stdio: ["ignore", out, err],
    });
    const exited = new Promise((r) => this.proc.once("exit", (code) => r(code)));
    this.exited = exited;
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const code = await Promise.race([exited, sleep(100).then(() => undefined)]);
      if (code !== undefined) throw new Error(`stratamem serve exited (${code}):\n${this.stderr()}`);
      try {
        const r = await fetch(`${this.url}/healthz`);
        if (r.status === 200) return this;
      } catch {
        // not up yet
      }
    }
    await this.stop();
    throw new Error(`stratamem serve did not come up:\n${this.stderr()}`);
  }

  /** The bootstrap key `stratamem serve` printed on first start. */
  key() {
    const found = readFileSync(join(this.dir, "serve.out"), "utf8").match(KEY_RE);
    if (!found) throw new Error(`no bootstrap key printed:\n${this.stdout()}`);
    return found[0];
  }

  stdout() {
    return readFileSync(join(this.dir, "serve.out"), "utf8");
  }

  stderr() {
    return readFileSync(join(this.dir, "serve.err"), "utf8");
  }

  /** SIGKILL, as a crash or the OOM killer would; `start()` may be called again. */
  async kill() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill("SIGKILL");
      await this.exited;
    }
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill("SIGTERM");
      const timer = setTimeout(() => this.proc.kill("SIGKILL"), 20_000);
      await this.exited;
      clearTimeout(timer);
    }
  }

  async close() {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A webhook receiver on 127.0.0.1 that keeps every delivery's raw body and headers.
 * `answer(req, body)` decides the reply (default `{}`: "no change"); return undefined to
 * hold the request unanswered. */
export async function receiver(answer = () => ({ status: 200, body: "{}" })) {
  const { createServer: httpServer } = await import("node:http");
  const deliveries = [];
  const waiters = [];
  const held = [];
  const server = httpServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const delivery = { headers: req.headers, raw: Buffer.concat(chunks) };
      deliveries.push(delivery);
      for (const w of waiters.splice(0)) w();
      const reply = answer(req, delivery);
      if (reply === undefined) {
        held.push(res);
        return;
      }
      res.writeHead(reply.status, { "content-type": "application/json" });
      res.end(reply.body);
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}/hook`,
    deliveries,
    /** Resolves once at least `n` deliveries arrived. */
    async waitFor(n, timeoutMs = 30_000) {
      const deadline = Date.now() + timeoutMs;
      while (deliveries.length < n) {
        if (Date.now() > deadline) throw new Error(`${deliveries.length} of ${n} deliveries`);
        await new Promise((r) => {
          waiters.push(r);
          setTimeout(r, 100);
        });
      }
      return deliveries;
    },
    /** Drop the requests held unanswered. */
    release() {
      for (const res of held.splice(0)) res.destroy();
    },
    async close() {
      for (const res of held.splice(0)) res.destroy();
      server.closeAllConnections?.();
      await new Promise((r) => server.close(r));
    },
  };
}
