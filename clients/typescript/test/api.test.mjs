// Every method family of the client against a real `stratamem serve` on 127.0.0.1, the
// errors it maps (401, 404, 409, 413, 422), webhook verification of deliveries the server
// signed, and the generated types against the document the server serves. State is read
// back through the API, never from what the client sent.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";

import {
  APIError,
  AuthenticationError,
  ConflictError,
  MemoryClient,
  NotFoundError,
  PayloadTooLargeError,
  Session,
  ValidationError,
  WebhookVerificationError,
  verifyWebhook,
} from "../dist/esm/index.js";
import { generate } from "../scripts/generate.mjs";
import { ADMIN_TOKEN, ServerProcess, receiver } from "./server.mjs";

const ID_FORM = /^m_[0-9a-f]{24}$/;
let server;
let client;

before(async () => {
  server = await new ServerProcess().start();
  client = new MemoryClient({ apiKey: server.key(), baseUrl: server.url, adminToken: ADMIN_TOKEN });
});

after(async () => {
  await server?.close();
});

/** A client whose fetch counts the requests it sends (the platform's fetch underneath). */
function counted(options = {}) {
  const sent = [];
  const c = new MemoryClient({
    apiKey: server.key(),
    baseUrl: server.url,
    ...options,
    fetch: (url, init) => {
      sent.push(`${init.method} ${url}`);
      return fetch(url, init);
    },
  });
  return { client: c, sent };
}

describe("sessions and messages", () => {
  test("create, get, list; ids chosen by the client before the first try", async () => {
    const s = await client.sessions.create({ userId: "ana", title: "trip", metadata: { a: 1 } });
    assert.ok(s instanceof Session);
    assert.match(s.id, /^s_[0-9a-f]{24}$/);
    const again = await client.sessions.get(s.id);
    assert.equal(again.user_id, "ana");
    assert.equal(again.title, "trip");
    assert.deepEqual(again.metadata, { a: 1 });
    assert.deepEqual(JSON.parse(JSON.stringify(again)), JSON.parse(JSON.stringify(s)));
    const chosen = await client.sessions.create({ userId: "ana", sessionId: "ana/trip+1@x" });
    assert.equal((await client.sessions.get("ana/trip+1@x")).id, chosen.id);
    const listed = await client.sessions.list({ userId: "ana" });
    assert.deepEqual(
      listed.map((x) => x.id),
      [s.id, "ana/trip+1@x"],
    );
    // The same id again for the same user: the session as it is.
    const same = await client.sessions.create({ userId: "ana", sessionId: "ana/trip+1@x" });
    assert.equal(same.created_at, chosen.created_at);
  });

  test("addMessages stores each message once, with ids assigned in the server's form", async () => {
    const s = await client.sessions.create({ userId: "bo" });
    const result = await s.addMessages(
      [
        { role: "user", content: "I moved to Berlin in March." },
        { role: "assistant", content: "Noted!", id: "my-own-id-1" },
      ],
      { sync: true },
    );
    assert.equal(result.processed, true);
    assert.equal(result.message_ids.length, 2);
    assert.match(result.message_ids[0], ID_FORM);
    assert.equal(result.message_ids[1], "my-own-id-1");
    const stored = await client.messages.list({ sessionId: s.id });
    assert.deepEqual(
      stored.map((m) => [m.id, m.role, m.content, m.status]),
      [
        [result.message_ids[0], "user", "I moved to Berlin in March.", "processed"],
        ["my-own-id-1", "assistant", "Noted!", "processed"],
      ],
    );
    const one = await client.messages.get(result.message_ids[0]);
    assert.equal(one.session_id, s.id);
    const byUser = await client.messages.list({ userId: "bo", limit: 1 });
    assert.deepEqual(
      byUser.map((m) => m.id),
      [result.message_ids[0]],
    );
    // Resent with the same id and content: a duplicate, not stored again.
    const resent = await s.addMessages([{ role: "assistant", content: "Noted!", id: "my-own-id-1" }]);
    assert.deepEqual(resent.duplicates, ["my-own-id-1"]);
    assert.equal((await s.messages()).length, 2);
    // A new session through addMessages' userId.
    const added = await client.addMessages("bo-new", [{ role: "user", content: "Hi" }], { userId: "bo" });
    assert.equal((await client.sessions.get("bo-new")).user_id, "bo");
    assert.equal(added.session_id, "bo-new");
    // wait(): until the server processed what this client sent.
    await client.wait({ timeout: 30_000 });
    assert.equal((await client.processingStatus("bo-new")).done, true);
  });

  test("lists follow the server's pages past 1000 items", async () => {
    const s = await client.sessions.create({ userId: "pager" });
    const messages = Array.from({ length: 1005 }, (_, i) => ({ role: "user", content: `line ${i}` }));
    // The server takes at most 1000 messages per request.
    await client.addMessages(s.id, messages.slice(0, 1000));
    await client.addMessages(s.id, messages.slice(1000));
    const all = await client.messages.list({ sessionId: s.id, limit: 2000 });
    assert.equal(all.length, 1005);
    assert.equal(new Set(all.map((m) => m.id)).size, 1005);
    const tail = await client.messages.list({ sessionId: s.id, limit: 10, offset: 1000 });
    assert.deepEqual(
      tail.map((m) => m.content),
      ["line 1000", "line 1001", "line 1002", "line 1003", "line 1004"],
    );
  });
});

describe("memory: context, search, facts, summaries, topics", () => {
  let s;
  let ids;
  before(async () => {
    s = await client.sessions.create({ userId: "cy" });
    ({ message_ids: ids } = await s.addMessages(
      [
        { role: "user", content: "I moved to Berlin in March." },
        { role: "user", content: "I am allergic to peanuts." },
        { role: "user", content: "What should I cook tonight?" },
      ],
      { sync: true },
    ));
  });

  test("getMemory with details and a recallConfig", async () => {
    const ctx = await s.getMemory("Where does the user live?", { details: true });
    assert.equal(ctx.session_id, s.id);
    assert.equal(ctx.query, "Where does the user live?");
    assert.match(ctx.formatted_context, /Berlin/);
    assert.ok(ctx.matches.length > 0);
    assert.equal(ctx.history.length, 3);
    // recallConfig reaches the server: one recent message only; no details, no matches.
    const short = await client.getMemory(s.id, {
      query: "Where does the user live?",
      recallConfig: { MessageRecentLimit: 1 },
    });
    assert.deepEqual(
      short.history.map((m) => m.id),
      [ids[2]],
    );
    assert.equal(short.matches ?? null, null);
    // excludeTexts: the message the prompt already carries is left out.
    const without = await s.getMemory({ query: "cook", excludeTexts: ["What should I cook tonight?"] });
    assert.ok(!without.history.some((m) => m.id === ids[2]));
  });

  test("search: ranked hits with provenance", async () => {
    const hits = await client.search("Where does the user live?", { userId: "cy", limit: 5 });
    assert.ok(hits.length > 0);
    const berlin = hits.find((h) => /Berlin/.test(h.text));
    assert.ok(berlin);
    assert.ok(berlin.message_ids.includes(ids[0]));
    const facts = await client.search("Berlin", { userId: "cy", layers: ["fact"] });
    assert.ok(facts.length > 0 && facts.every((h) => h.layer === "fact"));
    assert.deepEqual(await client.search("Berlin", { userId: "nobody-here" }), []);
  });

  test("facts, summaries (with history) and topics, with provenance", async () => {
    const facts = await client.facts.list({ userId: "cy" });
    const fact = facts.find((f) => /Berlin/.test(f.text));
    assert.ok(fact, JSON.stringify(facts));
    assert.deepEqual(fact.message_ids, [ids[0]]);
    assert.equal((await client.facts.get(fact.id)).text, fact.text);
    assert.equal((await client.facts.list({ userId: "cy", status: "superseded" })).length, 0);
    assert.equal((await client.facts.list({ userId: "cy", until: new Date(0) })).length, 0);

    const summaries = await client.summaries.list({ userId: "cy" });
    const summary = summaries.find((x) => x.fact_ids.includes(fact.id));
    assert.ok(summary);
    assert.equal((await client.summaries.get(summary.id)).text, summary.text);
    const history = await client.summaries.history(summary.id);
    assert.equal(history.length, 1);

    const topics = await client.topics.list({ userId: "cy" });
    const topic = topics.find((t) => t.summary_ids.includes(summary.id));
    assert.ok(topic);
    assert.equal((await client.topics.get(topic.id)).name, topic.name);
  });
});

describe("governance", () => {
  test("setStatus, audit, forget, export, erase", async () => {
    const s = await client.sessions.create({ userId: "dee" });
    const { message_ids: ids } = await s.addMessages(
      [
        { role: "user", content: "I moved to Lisbon in May." },
        { role: "user", content: "I play the cello every evening." },
      ],
      { sync: true },
    );
    const [summary] = (await client.summaries.list({ userId: "dee" })).filter((x) =>
      x.message_ids.includes(ids[0]),
    );
    assert.ok(summary);
    const changed = await client.setStatus(summary.id, "archived", { reason: "user asked" });
    assert.equal(changed.status, "archived");
    assert.equal((await client.summaries.get(summary.id)).status, "archived");
    const history = await client.summaries.history(summary.id);
    assert.equal(history.at(-1).status, "archived");
    assert.equal(history.at(-1).reason, "user asked");
    const audit = await client.audit({ userId: "dee" });
    assert.ok(audit.some((r) => r.reason === "user asked"));

    const exported = await client.exportUser("dee");
    assert.ok(JSON.stringify(exported).includes("Lisbon"));

    const counts = await client.forget({ userId: "dee", messageIds: [ids[0]], reason: "mistake" });
    assert.ok(Object.values(counts).some((n) => n > 0), JSON.stringify(counts));
    await assert.rejects(client.messages.get(ids[0]), NotFoundError);
    assert.ok(!(await client.facts.list({ userId: "dee" })).some((f) => /Lisbon/.test(f.text)));
    assert.equal((await client.messages.get(ids[1])).id, ids[1]);

    const erased = await client.eraseUser("dee", { reason: "account closed" });
    assert.ok(Object.values(erased).some((n) => n > 0));
    assert.deepEqual(await client.sessions.list({ userId: "dee" }), []);
    await assert.rejects(client.messages.get(ids[1]), NotFoundError);
    assert.ok((await client.audit({ userId: "dee" })).some((r) => r.reason === "account closed"));
  });
});

describe("user actions", () => {
  test("one event inline and several in events, each stored once", async () => {
    const one = await client.userActions.record({
      userId: "eve",
      eventType: "view",
      page: "/products/42",
      metadata: { item: "Pegasus" },
    });
    assert.equal(one.user_id, "eve");
    assert.equal(one.session_id, "actions-eve");
    const many = await client.userActions.record({
      userId: "eve",
      sessionId: "eve-shop",
      events: [
        { event_type: "search", content: "running shoes" },
        { event_type: "click", page: "/products/7", id: "click-1" },
      ],
    });
    assert.equal(many.message_ids[1], "click-1");
    const inActions = await client.messages.list({ sessionId: "actions-eve" });
    assert.deepEqual(
      inActions.map((m) => [m.id, m.event_type, m.page]),
      [[one.message_ids[0], "view", "/products/42"]],
    );
    const inShop = await client.messages.list({ sessionId: "eve-shop" });
    assert.deepEqual(
      inShop.map((m) => [m.event_type, m.content]),
      [
        ["search", "running shoes"],
        ["click", "click on /products/7"],
      ],
    );
  });
});

describe("webhooks", () => {
  let hooks;
  before(async () => {
    hooks = await receiver();
  });
  after(async () => {
    await hooks.close();
  });

  // The hook is the project's: a batch another test queued earlier may be processed while
  // this one runs (on a loaded machine it was), a delivery of its own. Each step takes the
  // delivery of the messages it sent.
  async function deliveryOf(messageIds) {
    const wanted = JSON.stringify(messageIds);
    for (let n = 1; ; n++) {
      const found = (await hooks.waitFor(n)).find(
        (d) => JSON.stringify(JSON.parse(d.raw).context.message_ids) === wanted,
      );
      if (found) return found;
    }
  }

  test("CRUD, delivery log, and verifyWebhook on deliveries the server signed", async () => {
    const { webhook, secret } = await client.webhooks.create({
      resource: "fact",
      event: "before_add",
      targetUrl: hooks.url,
      name: "ts-test",
      timeoutMs: 5000,
    });
    assert.match(secret, /^whsec_/);
    assert.equal((await client.webhooks.get(webhook.id)).name, "ts-test");
    assert.ok((await client.webhooks.list()).some((h) => h.id === webhook.id));
    assert.equal((await client.webhooks.update(webhook.id, { timeoutMs: 4000 })).timeout_ms, 4000);
    assert.equal((await client.webhooks.get(webhook.id)).timeout_ms, 4000);

    const s = await client.sessions.create({ userId: "fay" });
    const { message_ids } = await s.addMessages([{ role: "user", content: "I live in Oslo." }], {
      sync: true,
    });
    const delivery = await deliveryOf(message_ids);
    const payload = await verifyWebhook(secret, delivery.headers, delivery.raw);
    assert.equal(payload.hook_id, webhook.id);
    assert.equal(payload.event, "before_add");
    assert.deepEqual(payload.context.message_ids, message_ids);
    // The same delivery as a string body, and with fetch-style Headers.
    await verifyWebhook(secret, new Headers(delivery.headers), delivery.raw.toString("utf8"));
    // A changed body, another secret, a stale or future timestamp: refused.
    const tampered = Buffer.from(delivery.raw.toString("utf8").replace("Oslo", "Rome"));
    await assert.rejects(verifyWebhook(secret, delivery.headers, tampered), WebhookVerificationError);
    const other = `whsec_${Buffer.alloc(32, 7).toString("base64")}`;
    await assert.rejects(verifyWebhook(other, delivery.headers, delivery.raw), /no matching signature/);
    const sent = Number(delivery.headers["webhook-timestamp"]);
    await verifyWebhook(secret, delivery.headers, delivery.raw, { now: sent + 299 });
    await assert.rejects(
      verifyWebhook(secret, delivery.headers, delivery.raw, { now: sent + 301 }),
      /too old/,
    );
    await assert.rejects(
      verifyWebhook(secret, delivery.headers, delivery.raw, { now: sent - 301 }),
      /too new/,
    );
    const { "webhook-signature": _, ...unsigned } = delivery.headers;
    await assert.rejects(verifyWebhook(secret, unsigned, delivery.raw), /missing header/);
    await assert.rejects(verifyWebhook(secret, delivery.headers, JSON.parse(delivery.raw)), TypeError);

    // The delivery log has it.
    const log = await client.webhooks.deliveries(webhook.id);
    const logged = log.find((d) => d.id === delivery.headers["webhook-id"]);
    assert.equal(logged?.status, "delivered");

    // Rotation with a grace period: two signatures; either secret verifies.
    const rotated = await client.webhooks.rotateSecret(webhook.id, { graceSeconds: 3600 });
    assert.notEqual(rotated.secret, secret);
    assert.ok(rotated.webhook.rotation_grace_until);
    const nurse = await s.addMessages([{ role: "user", content: "I work as a nurse." }], {
      sync: true,
    });
    const second = await deliveryOf(nurse.message_ids);
    assert.equal(second.headers["webhook-signature"].split(" ").length, 2);
    await verifyWebhook(secret, second.headers, second.raw);
    await verifyWebhook(rotated.secret, second.headers, second.raw);
    await verifyWebhook([other, rotated.secret], second.headers, second.raw);
    await assert.rejects(verifyWebhook(other, second.headers, second.raw), WebhookVerificationError);
    // Without grace the old secret stops at once.
    const third = await client.webhooks.rotateSecret(webhook.id);
    const rex = await s.addMessages([{ role: "user", content: "I have a dog called Rex." }], {
      sync: true,
    });
    const last = await deliveryOf(rex.message_ids);
    await verifyWebhook(third.secret, last.headers, last.raw);
    await assert.rejects(verifyWebhook(rotated.secret, last.headers, last.raw), WebhookVerificationError);

    assert.equal((await client.webhooks.disable(webhook.id)).enabled, false);
    assert.equal((await client.webhooks.get(webhook.id)).enabled, false);
    assert.equal((await client.webhooks.enable(webhook.id)).enabled, true);
    assert.equal((await client.webhooks.delete(webhook.id)).id, webhook.id);
    await assert.rejects(client.webhooks.get(webhook.id), NotFoundError);
  });
});

describe("admin: projects and keys", () => {
  test("a project, a key that opens it, and revocation", async () => {
    const project = await client.projects.create({ name: "Acme", projectId: "acme" });
    assert.equal(project.id, "acme");
    assert.equal((await client.projects.get("acme")).name, "Acme");
    assert.ok((await client.projects.list()).some((p) => p.id === "acme"));
    const { key, secret } = await client.keys.create("acme", { name: "ts" });
    const acme = new MemoryClient({ apiKey: secret, baseUrl: server.url });
    const me = await acme.project();
    assert.equal(me.project_id, "acme");
    assert.equal(me.key.id, key.id);
    // Another project's sessions are not visible to it.
    assert.deepEqual(await acme.sessions.list({ userId: "ana" }), []);
    assert.ok((await client.keys.list("acme")).some((k) => k.id === key.id));
    const revoked = await client.keys.revoke(key.id);
    assert.ok(revoked.revoked_at);
    await assert.rejects(acme.project(), (e) => e instanceof AuthenticationError && e.status === 401);
    const wrong = new MemoryClient({ baseUrl: server.url, adminToken: "not-the-token" });
    await assert.rejects(wrong.projects.list(), AuthenticationError);
  });
});

describe("errors", () => {
  test("401: a wrong key", async () => {
    const bad = new MemoryClient({ apiKey: "sm_not_a_real_key_0000000000000", baseUrl: server.url });
    const error = await bad.sessions.list().catch((e) => e);
    assert.ok(error instanceof AuthenticationError && error instanceof APIError);
    assert.equal(error.status, 401);
    assert.equal(error.code, "unauthorized");
    assert.match(error.requestId, /^[0-9a-f]{32}$/);
  });

  test("404: an unknown session, message, summary", async () => {
    for (const call of [
      () => client.sessions.get("no-such-session"),
      () => client.messages.get("m_nope"),
      () => client.summaries.get("s_nope"),
      () => client.addMessages("no-such-session", [{ role: "user", content: "x" }]),
    ]) {
      const error = await call().catch((e) => e);
      assert.ok(error instanceof NotFoundError, String(error));
      assert.equal(error.status, 404);
      assert.equal(error.code, "not_found");
      assert.ok(error.requestId);
    }
  });

  test("409: a session of another user; a message id resent with other content", async () => {
    await client.sessions.create({ userId: "gus", sessionId: "gus-1" });
    const error = await client.sessions.create({ userId: "hal", sessionId: "gus-1" }).catch((e) => e);
    assert.ok(error instanceof ConflictError);
    assert.equal(error.status, 409);
    assert.equal((await client.sessions.get("gus-1")).user_id, "gus");
    await client.addMessages("gus-1", [{ role: "user", content: "first", id: "gus-m1" }]);
    await assert.rejects(
      client.addMessages("gus-1", [{ role: "user", content: "changed", id: "gus-m1" }]),
      (e) => e instanceof ConflictError && e.code === "conflict",
    );
    assert.equal((await client.messages.get("gus-m1")).content, "first");
  });

  test("413: content over the server's limit, nothing stored", async () => {
    const s = await client.sessions.create({ userId: "ida" });
    const error = await s.addMessages([{ role: "user", content: "x".repeat(40_000) }]).catch((e) => e);
    assert.ok(error instanceof PayloadTooLargeError && error instanceof ValidationError);
    assert.equal(error.status, 413);
    assert.deepEqual(await s.messages(), []);
    const body = await s.addMessages([{ role: "user", content: "y".repeat(1_100_000) }]).catch((e) => e);
    assert.ok(body instanceof PayloadTooLargeError, String(body));
  });

  test("422: the server's field problems", async () => {
    const s = await client.sessions.create({ userId: "jo" });
    const error = await s
      .addMessages([{ role: "robot", content: "" }, { role: "user", content: "ok", colour: "red" }])
      .catch((e) => e);
    assert.ok(error instanceof ValidationError);
    assert.equal(error.status, 422);
    assert.equal(error.code, "validation_error");
    assert.deepEqual(
      error.problems.map((p) => p.field),
      ["messages[0].role", "messages[0].content", "messages[1].colour"],
    );
    assert.match(error.message, /messages\[0\]\.role: /);
    assert.deepEqual(await s.messages(), []);
    const webhook = await client.webhooks
      .create({ resource: "topic", event: "before_llm", targetUrl: "http://10.0.0.1/x" })
      .catch((e) => e);
    assert.ok(webhook instanceof ValidationError && webhook.status === 422, String(webhook));
    assert.ok(webhook.problems.length > 0);
  });

  test("arguments refused before any request", async () => {
    const { client: c, sent } = counted();
    const cases = [
      [() => c.sessions.get(""), "session_id"],
      [() => c.sessions.get("bad id"), "session_id"],
      [() => c.addMessages("ok", []), "messages"],
      [() => c.addMessages("ok", ["hello"]), "messages[0]"],
      [() => c.messages.list({}), "session_id or user_id"],
      [() => c.messages.list({ sessionId: "ok", limit: 0 }), "limit"],
      [() => c.search("", { userId: "u" }), "query"],
      [() => c.search("q", { userId: "u", limit: 5000 }), "limit"],
      [() => c.forget({ userId: "u" }), "message_ids"],
      [() => c.forget({ userId: "u", sessionId: "a", topicId: "b" }), "session_id"],
      [() => c.setStatus("s_1", "gone", { reason: "x" }), "status"],
      [() => c.setStatus("s_1", "archived", { reason: "" }), "reason"],
      [() => c.sessions.create({}), "user_id"],
      [() => c.userActions.record({ userId: "u" }), "event_type"],
      [() => c.addMessages("ok", [{ role: "user", content: "lone \ud800 surrogate" }]), "messages[0].content"],
    ];
    for (const [call, field] of cases) {
      let error;
      try {
        await call();
      } catch (e) {
        error = e;
      }
      assert.ok(error instanceof ValidationError, `${call}: ${error}`);
      assert.equal(error.status, undefined);
      assert.ok(
        error.problems.some((p) => p.field === field),
        `${call}: ${JSON.stringify(error.problems)}`,
      );
    }
    assert.deepEqual(sent, []);
    assert.throws(() => new MemoryClient({ baseUrl: "ftp://x" }), TypeError);
    assert.throws(() => new MemoryClient({ baseUrl: server.url, maxRetries: -1 }), TypeError);
    assert.throws(() => new MemoryClient({ baseUrl: server.url, timeout: 0 }), TypeError);
  });
});

describe("the package", () => {
  test("the CommonJS build talks to the server too", async () => {
    const require = createRequire(import.meta.url);
    const cjs = require("../dist/cjs/index.js");
    const c = new cjs.MemoryClient({ apiKey: server.key(), baseUrl: server.url });
    assert.equal((await c.health()).status, "ok");
    const s = await c.sessions.create({ userId: "cjs-user" });
    assert.equal((await c.sessions.get(s.id)).user_id, "cjs-user");
    await assert.rejects(c.sessions.get("nope"), cjs.NotFoundError);
  });

  test("src/openapi.ts is what the served OpenAPI document generates", async () => {
    const { readFile } = await import("node:fs/promises");
    const served = await (await fetch(`${server.url}/openapi.json`)).json();
    const committed = await readFile(new URL("../src/openapi.ts", import.meta.url), "utf8");
    assert.ok(
      (await generate(served)) === committed,
      "src/openapi.ts differs from the types generated from the server's /openapi.json: run " +
        "`npm run generate` in clients/typescript and commit src/openapi.ts",
    );
  });
});
