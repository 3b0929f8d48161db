// The transport's rules where the real server cannot be made to misbehave on cue: a plain
// HTTP or TCP server on 127.0.0.1 answers 429, 503, nothing, or drops the connection, and
// the test counts what the client sent. (No code of this package is replaced.)
import assert from "node:assert/strict";
import { createServer as httpServer } from "node:http";
import { createServer as tcpServer } from "node:net";
import { test } from "node:test";

import {
  APIConnectionError,
  APIStatusError,
  APITimeoutError,
  MemoryClient,
  RateLimitError,
  ServerError,
} from "../dist/esm/index.js";

async function listen(server) {
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${server.address().port}`;
}

async function http(handler) {
  const requests = [];
  const server = httpServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      requests.push({ method: req.method, url: req.url, body, headers: req.headers, at: Date.now() });
      handler(req, res, requests.length);
    });
  });
  const url = await listen(server);
  return {
    url,
    requests,
    close: () => {
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    },
  };
}

function envelope(res, status, data, headers = {}) {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify({ success: status < 400, data, message: null, error: null }));
}

function failure(res, status, code, headers = {}) {
  res.writeHead(status, { "content-type": "application/json", "x-request-id": "req-42", ...headers });
  res.end(
    JSON.stringify({
      success: false,
      data: null,
      message: code,
      error: { code, detail: `said ${code}`, problems: [], request_id: "req-42" },
    }),
  );
}

test("429: RateLimitError with retryAfter, not resent", async () => {
  const srv = await http((req, res) => failure(res, 429, "rate_limited", { "retry-after": "7" }));
  try {
    const c = new MemoryClient({ apiKey: "k", baseUrl: srv.url });
    const error = await c.sessions.get("s1").catch((e) => e);
    assert.ok(error instanceof RateLimitError && error instanceof APIStatusError);
    assert.equal(error.status, 429);
    assert.equal(error.retryAfter, 7);
    assert.equal(error.requestId, "req-42");
    assert.equal(srv.requests.length, 1);
    assert.equal(srv.requests[0].headers.authorization, "Api-Key k");
  } finally {
    await srv.close();
  }
});

test("503: an idempotent call is resent (honouring Retry-After), a write that is not is not", async () => {
  const srv = await http((req, res, n) => {
    if (req.method === "GET" && n < 3) return failure(res, 503, "unavailable", { "retry-after": "0.2" });
    if (req.method === "GET") return envelope(res, 200, { id: "s1", user_id: "u" });
    return failure(res, 503, "unavailable");
  });
  try {
    const c = new MemoryClient({ apiKey: "k", baseUrl: srv.url, maxRetries: 2 });
    const s = await c.sessions.get("s1");
    assert.equal(s.user_id, "u");
    assert.equal(srv.requests.length, 3);
    assert.ok(srv.requests[1].at - srv.requests[0].at >= 190, "Retry-After 0.2 s honoured");
    const error = await c.setStatus("s_1", "archived", { reason: "r" }).catch((e) => e);
    assert.ok(error instanceof ServerError);
    assert.equal(error.status, 503);
    assert.match(error.message, /request id req-42/);
    assert.equal(srv.requests.filter((r) => r.method === "PATCH").length, 1);
    // An add with sync: the messages are stored and processing; not resent on a 503.
    const before = srv.requests.length;
    await assert.rejects(c.addMessages("s1", [{ role: "user", content: "x" }], { sync: true }), ServerError);
    assert.equal(srv.requests.length - before, 1);
    // Without sync it is idempotent (ids given before the first try): resent, same ids.
    await assert.rejects(c.addMessages("s1", [{ role: "user", content: "x" }]), ServerError);
    const adds = srv.requests.slice(before + 1);
    assert.equal(adds.length, 3);
    const ids = adds.map((r) => JSON.parse(r.body).messages[0].id);
    assert.match(ids[0], /^m_[0-9a-f]{24}$/);
    assert.deepEqual(ids, [ids[0], ids[0], ids[0]]);
  } finally {
    await srv.close();
  }
});

test("a dropped connection: idempotent calls are resent, other writes are not", async () => {
  let connections = 0;
  const server = tcpServer((socket) => {
    connections += 1;
    socket.once("data", () => socket.destroy());
  });
  const url = await listen(server);
  try {
    const c = new MemoryClient({ apiKey: "k", baseUrl: url, maxRetries: 2 });
    const read = await c.sessions.get("s1").catch((e) => e);
    assert.ok(read instanceof APIConnectionError, String(read));
    assert.equal(read.status, undefined);
    assert.equal(connections, 3);
    connections = 0;
    const write = await c.forget({ userId: "u", sessionId: "s1" }).catch((e) => e);
    assert.ok(write instanceof APIConnectionError);
    assert.equal(connections, 1);
    connections = 0;
    await assert.rejects(
      c.webhooks.create({ resource: "fact", event: "before_add", targetUrl: "https://x.example" }),
      APIConnectionError,
    );
    assert.equal(connections, 1);
    connections = 0;
    await assert.rejects(c.eraseUser("u"), APIConnectionError);
    assert.equal(connections, 1);
  } finally {
    await new Promise((r) => server.close(r));
  }
});

test("connection refused: resent whatever the call (it never reached a server)", async () => {
  const server = tcpServer();
  const url = await listen(server);
  await new Promise((r) => server.close(r));
  let tries = 0;
  const c = new MemoryClient({
    apiKey: "k",
    baseUrl: url,
    maxRetries: 3,
    fetch: (u, init) => {
      tries += 1;
      return fetch(u, init);
    },
  });
  const error = await c.forget({ userId: "u", sessionId: "s" }).catch((e) => e);
  assert.ok(error instanceof APIConnectionError && !(error instanceof APITimeoutError));
  assert.match(error.message, /ECONNREFUSED|fetch failed/);
  assert.equal(tries, 4);
});

test("a timeout is APITimeoutError and is not resent", async () => {
  const srv = await http(() => {
    // never answers
  });
  try {
    const c = new MemoryClient({ apiKey: "k", baseUrl: srv.url, timeout: 300, maxRetries: 3 });
    const started = Date.now();
    const error = await c.sessions.get("s1").catch((e) => e);
    assert.ok(error instanceof APITimeoutError && error instanceof APIConnectionError, String(error));
    assert.ok(Date.now() - started < 2000);
    assert.equal(srv.requests.length, 1);
  } finally {
    await srv.close();
  }
});

test("an answer without stratamem's envelope is an APIStatusError", async () => {
  const srv = await http((req, res) => {
    res.writeHead(200, { "content-type": "text/html" });
    res.end("<html>not stratamem</html>");
  });
  try {
    const c = new MemoryClient({ apiKey: "k", baseUrl: srv.url });
    const error = await c.sessions.get("s1").catch((e) => e);
    assert.ok(error instanceof APIStatusError);
    assert.match(error.message, /without stratamem's envelope/);
    assert.equal(error.body, "<html>not stratamem</html>");
  } finally {
    await srv.close();
  }
});

test("keys with their scheme are sent as given; ids travel as one path segment", async () => {
  const srv = await http((req, res) => envelope(res, 200, { id: "x", user_id: "u" }));
  try {
    const c = new MemoryClient({ apiKey: "Bearer abc", baseUrl: srv.url.replace("http://", "") });
    await c.sessions.get("a/b+c@d:e");
    assert.equal(srv.requests[0].headers.authorization, "Bearer abc");
    assert.equal(srv.requests[0].url, "/api/sessions/a%2Fb%2Bc%40d%3Ae");
  } finally {
    await srv.close();
  }
});

test("a redirect to another origin is refused: nothing, the key least of all, goes there", async () => {
  const elsewhere = await http((req, res) => envelope(res, 200, { id: "s1", user_id: "u" }));
  const srv = await http((req, res) => {
    res.writeHead(307, { location: `${elsewhere.url}${req.url}` });
    res.end();
  });
  try {
    const c = new MemoryClient({ apiKey: "sm_secret", baseUrl: srv.url, maxRetries: 0 });
    for (const call of [
      () => c.sessions.create({ userId: "u", sessionId: "s1" }),
      () => c.sessions.get("s1"),
    ]) {
      const error = await call().catch((e) => e);
      assert.ok(error instanceof APIStatusError, String(error));
      assert.equal(error.status, 307);
      assert.match(error.message, /redirect to another origin \(http:\/\/127\.0\.0\.1:\d+\), not followed/);
    }
    assert.equal(srv.requests.length, 2);
    assert.equal(elsewhere.requests.length, 0);
  } finally {
    await srv.close();
    await elsewhere.close();
  }
});

test("a redirect on the same origin is followed, with the key, the method and the body", async () => {
  const srv = await http((req, res) => {
    if (req.url.startsWith("/old/")) {
      res.writeHead(308, { location: req.url.replace("/old/", "/") });
      return res.end();
    }
    envelope(res, 200, { id: "s1", user_id: "u" });
  });
  try {
    const c = new MemoryClient({ apiKey: "sm_secret", baseUrl: `${srv.url}/old` });
    const created = await c.sessions.create({ userId: "u", sessionId: "s1" });
    assert.equal(created.id, "s1");
    assert.deepEqual(
      srv.requests.map((r) => [r.method, r.url, r.headers.authorization]),
      [
        ["POST", "/old/api/sessions", "Api-Key sm_secret"],
        ["POST", "/api/sessions", "Api-Key sm_secret"],
      ],
    );
    assert.equal(srv.requests[1].body, srv.requests[0].body);
  } finally {
    await srv.close();
  }
});
