// Retries against a real `stratamem serve` that is SIGKILLed and started again on the same
// port and SQLite file in the middle of the test: an add whose answer was lost is resent
// with the ids the client gave its messages before the first try, so the server stores each
// message exactly once (read back through the API afterwards).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { MemoryClient, verifyWebhook } from "../dist/esm/index.js";
import { ServerProcess, receiver } from "./server.mjs";

let server;
let hooks;
let client;
const posts = [];

before(async () => {
  // A killed worker's job is taken over after job_lease_seconds: 1 s instead of 30 s.
  server = await new ServerProcess({ env: { STRATAMEM_JOB_LEASE_SECONDS: "1" } }).start();
  // The first delivery is held unanswered (the server's batch waits for it); later ones
  // answer "no change" at once.
  hooks = await receiver((req, delivery) =>
    hooks.deliveries.indexOf(delivery) === 0 ? undefined : { status: 200, body: "{}" },
  );
  client = new MemoryClient({
    apiKey: server.key(),
    baseUrl: server.url,
    // Enough resends (with jittered backoff) to outlast a restart of a few seconds.
    maxRetries: 30,
    fetch: (url, init) => {
      if (init.method === "POST" && String(url).endsWith("/messages")) posts.push(Date.now());
      return fetch(url, init);
    },
  });
});

after(async () => {
  await hooks?.close();
  await server?.close();
});

test("a sync add whose answer was lost when the server died is stored once", async () => {
  const { secret } = await client.webhooks.create({
    resource: "fact",
    event: "before_add",
    targetUrl: hooks.url,
    mode: "sync",
    timeoutMs: 20_000,
  });
  const session = await client.sessions.create({ userId: "kim", sessionId: "kim-retry" });
  const contents = ["I moved to Berlin in March.", "I am allergic to peanuts.", "I play the cello."];
  const adding = session.addMessages(
    contents.map((content) => ({ role: "user", content })),
    { sync: true },
  );

  // The server has stored the messages and is processing them: its webhook was called.
  const [delivery] = await hooks.waitFor(1);
  const payload = await verifyWebhook(secret, delivery.headers, delivery.raw);
  const firstIds = payload.context.message_ids;
  assert.equal(firstIds.length, 3);
  const peek = new MemoryClient({ apiKey: server.key(), baseUrl: server.url, maxRetries: 0 });
  assert.equal((await peek.messages.list({ sessionId: "kim-retry" })).length, 3);
  assert.equal(posts.length, 1);

  // Killed before it could answer; started again on the same port and file.
  await server.kill();
  hooks.release();
  await server.start();

  const result = await adding;
  assert.ok(posts.length >= 2, `the add was sent ${posts.length} time(s)`);
  assert.deepEqual(result.message_ids, firstIds);
  assert.deepEqual([...result.duplicates].sort(), [...firstIds].sort());
  assert.equal(result.processed, true);

  const stored = await client.messages.list({ sessionId: "kim-retry" });
  assert.deepEqual(
    stored.map((m) => [m.id, m.content, m.status]),
    firstIds.map((id, i) => [id, contents[i], "processed"]),
  );
  const everything = await client.messages.list({ userId: "kim" });
  assert.equal(everything.length, 3);
});

test("an add sent while the server is down is retried until it is back, and stored once", async () => {
  await server.kill();
  const before = posts.length;
  const adding = client.addMessages("kim-retry", [{ role: "user", content: "I have a dog called Rex." }]);
  await new Promise((r) => setTimeout(r, 500));
  assert.ok(posts.length - before >= 1);
  await server.start();
  const result = await adding;
  assert.ok(posts.length - before >= 2, `sent ${posts.length - before} time(s)`);
  assert.deepEqual(result.duplicates, []);
  const stored = await client.messages.list({ sessionId: "kim-retry" });
  assert.equal(stored.length, 4);
  assert.deepEqual(
    stored.filter((m) => m.content === "I have a dog called Rex.").map((m) => m.id),
    result.message_ids,
  );
});
