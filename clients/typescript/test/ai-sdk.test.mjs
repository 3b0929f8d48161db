// The AI SDK middleware (`stratamem/ai-sdk`) with the `ai` package's own mock model, plain
// and streamed, against a real `stratamem serve`: memory stored in one call is recalled in a
// later call for the same user and never for another, the block goes into the last user
// message (never the system role), and a server that is down or never answers leaves the
// call without memory, within the bound.
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, test } from "node:test";

import { generateText, streamText, wrapLanguageModel } from "ai";
import { MockLanguageModelV3, convertArrayToReadableStream } from "ai/test";

import { MemoryClient } from "../dist/esm/index.js";
import { stratamemMiddleware } from "../dist/esm/ai-sdk.js";
import { ADMIN_TOKEN, ServerProcess, freePort } from "./server.mjs";

let server;
let client;

before(async () => {
  // The bundled model, as a user's server has it: a correction supersedes what it corrects
  // when the two are alike in meaning, which the hashing embedder cannot tell.
  server = await new ServerProcess({ embedder: "local" }).start();
  client = new MemoryClient({ apiKey: server.key(), baseUrl: server.url, adminToken: ADMIN_TOKEN });
});

after(async () => {
  await server?.close();
});

const USAGE = {
  inputTokens: { total: 3, noCache: 3, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 2, text: 2, reasoning: 0 },
};

/** A mock model answering `answer`, plain or streamed in pieces; it keeps what it was sent. */
function model(answer) {
  return new MockLanguageModelV3({
    doGenerate: async () => ({
      content: [{ type: "text", text: answer }],
      finishReason: { unified: "stop", raw: "stop" },
      usage: USAGE,
      warnings: [],
    }),
    doStream: async () => ({
      stream: convertArrayToReadableStream([
        { type: "stream-start", warnings: [] },
        { type: "text-start", id: "t" },
        ...answer.split(" ").map((w, i) => ({ type: "text-delta", id: "t", delta: i ? ` ${w}` : w })),
        { type: "text-end", id: "t" },
        { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: USAGE },
      ]),
    }),
  });
}

function lastUserText(call) {
  const users = call.prompt.filter((m) => m.role === "user");
  return users[users.length - 1].content.map((p) => p.text).join("\n");
}

async function waitProcessed(sessionId) {
  for (let i = 0; i < 200; i++) {
    if ((await client.processingStatus(sessionId)).done) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("not processed");
}

for (const streamed of [false, true]) {
  const kind = streamed ? "streamed" : "plain";
  const call = async (m, prompt, system) =>
    streamed
      ? await (async () => {
          const result = streamText({ model: m, prompt, system });
          return await result.text;
        })()
      : (await generateText({ model: m, prompt, system })).text;

  test(`${kind}: an exchange stored in one call is recalled in a later one, only for its user`, async () => {
    const errors = [];
    const ana = stratamemMiddleware({
      client, userId: `ana-${kind}`, sessionId: `ana-${kind}-1`, recallTimeoutMs: 10_000,
      onError: (e, phase) => errors.push([phase, e]),
    });
    const first = model("Noted, no peanuts.");
    const text = await call(wrapLanguageModel({ model: first, middleware: ana }), "I'm allergic to peanuts.", "Be brief.");
    assert.equal(text, "Noted, no peanuts.");
    await ana.flush();
    const stored = await client.messages.list({ sessionId: `ana-${kind}-1` });
    assert.deepEqual(stored.map((m) => [m.role, m.content]), [
      ["user", "I'm allergic to peanuts."],
      ["assistant", "Noted, no peanuts."],
    ]);
    await waitProcessed(`ana-${kind}-1`);

    const later = stratamemMiddleware({ client, userId: `ana-${kind}`, sessionId: `ana-${kind}-2`, recallTimeoutMs: 10_000 });
    const second = model("Try an apple.");
    await call(wrapLanguageModel({ model: second, middleware: later }), "Can you suggest a snack?", "Be brief.");
    const sent = streamed ? second.doStreamCalls[0] : second.doGenerateCalls[0];
    assert.deepEqual(sent.prompt[0], { role: "system", content: "Be brief." }); // untouched
    const asked = lastUserText(sent);
    assert.ok(asked.startsWith("Can you suggest a snack?\n<memory>"), asked);
    assert.match(asked, /allergic to peanuts/);
    // What is stored of the later call is the question as asked, without the block.
    await later.flush();
    const kept = await client.messages.list({ sessionId: `ana-${kind}-2` });
    assert.equal(kept[0].content, "Can you suggest a snack?");

    const ben = stratamemMiddleware({ client, userId: `ben-${kind}`, sessionId: `ben-${kind}-1`, recallTimeoutMs: 10_000 });
    const third = model("Try an apple.");
    await call(wrapLanguageModel({ model: third, middleware: ben }), "Can you suggest a snack?", "Be brief.");
    const other = streamed ? third.doStreamCalls[0] : third.doGenerateCalls[0];
    assert.ok(!lastUserText(other).includes("<memory>"));
    assert.deepEqual(errors, []);
  });
}

/** One plain call through the middleware for `userId` in `sessionId`; what the model got. */
async function ask(c, userId, sessionId, prompt, answer = "Ok.") {
  const memory = stratamemMiddleware({ client: c, userId, sessionId, recallTimeoutMs: 10_000 });
  const m = model(answer);
  await generateText({ model: wrapLanguageModel({ model: m, middleware: memory }), prompt });
  await memory.flush();
  return lastUserText(m.doGenerateCalls[0]);
}

test("another project recalls nothing; a correction replaces the old value; forgetting is seen", async () => {
  await ask(client, "cy", "cy-1", "I'm allergic to peanuts.");
  await client.wait();
  await client.projects.create({ name: "Other", projectId: "other-ai" });
  const { secret } = await client.keys.create("other-ai", { name: "ai-sdk" });
  const elsewhere = new MemoryClient({ apiKey: secret, baseUrl: server.url });
  assert.ok(!(await ask(elsewhere, "cy", "cy-elsewhere", "Can you suggest a snack?")).includes("peanuts"));

  await ask(client, "cy", "cy-2", "I drive a Honda Civic.");
  await client.wait();
  await ask(client, "cy", "cy-3", "Correction: I drive a Tesla Model 3 now.");
  await client.wait();
  const car = await ask(client, "cy", "cy-4", "What car do I drive?");
  assert.match(car, /Tesla/);
  if (car.includes("Honda")) assert.ok(car.indexOf("Tesla") < car.indexOf("Honda") && car.includes("(superseded)"));

  await client.forget({ userId: "cy", sessionId: "cy-1" });
  assert.ok(!(await ask(client, "cy", "cy-5", "Can you suggest a snack?")).includes("peanuts"));
});

test("a server that is down or never answers leaves the call without memory, within the bound", async () => {
  const port = await freePort();
  const silent = createServer(() => {}); // accepts connections, never answers
  await new Promise((ok) => silent.listen(0, "127.0.0.1", ok));
  try {
    for (const baseUrl of [`http://127.0.0.1:${port}`, `http://127.0.0.1:${silent.address().port}`]) {
      const errors = [];
      const dead = new MemoryClient({ apiKey: "sm_x", baseUrl, maxRetries: 0, timeout: 1_000 });
      const memory = stratamemMiddleware({
        client: dead, userId: "ana", sessionId: "s", recallTimeoutMs: 200,
        onError: (e, phase) => errors.push(phase),
      });
      const m = model("Hello.");
      const started = Date.now();
      const { text } = await generateText({ model: wrapLanguageModel({ model: m, middleware: memory }), prompt: "Hi" });
      assert.equal(text, "Hello.");
      assert.ok(Date.now() - started < 5_000);
      assert.equal(lastUserText(m.doGenerateCalls[0]), "Hi"); // no block
      assert.deepEqual(errors.slice(0, 1), ["recall"]);
      if (baseUrl.endsWith(`:${port}`)) {
        await memory.flush();
        assert.deepEqual(errors, ["recall", "store"]); // reported, never thrown
      }
    }
  } finally {
    silent.close();
  }
});

test("bad options are refused", () => {
  assert.throws(() => stratamemMiddleware({ client: {}, userId: "u", sessionId: "s" }), /MemoryClient/);
  assert.throws(() => stratamemMiddleware({ client, userId: " ", sessionId: "s" }), /userId/);
  assert.throws(() => stratamemMiddleware({ client, userId: "u", sessionId: "" }), /sessionId/);
  assert.throws(() => stratamemMiddleware({ client, userId: "u", sessionId: "s", recallTimeoutMs: 0 }), /recallTimeoutMs/);
});
