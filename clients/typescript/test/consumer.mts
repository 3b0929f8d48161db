// Compiled (not run) by the tests: the published declarations type a consumer's code.
import {
  MemoryClient,
  ValidationError,
  verifyWebhook,
  type Fact,
  type MemoryContext,
  type WebhookPayload,
} from "stratamem";

export async function example(client: MemoryClient): Promise<string> {
  const session = await client.sessions.create({ userId: "u1" });
  const added = await session.addMessages([{ role: "user", content: "hi" }], { sync: true });
  const ids: string[] = added.message_ids;
  const ctx: MemoryContext = await client.getMemory(session.id, "q", { details: true });
  const facts: Fact[] = await client.facts.list({ userId: "u1" });
  const payload: WebhookPayload = await verifyWebhook("whsec_x", { "webhook-id": "x" }, "{}");
  try {
    await client.search("q", { userId: "u1", layers: ["fact"] });
  } catch (error) {
    if (error instanceof ValidationError) return error.problems.map((p) => p.field).join();
  }
  // @ts-expect-error: roles are the server's enum
  await client.addMessages("s", [{ role: "robot", content: "x" }]);
  // @ts-expect-error: userId is required
  await client.search("q", {});
  return `${ids.length} ${ctx.formatted_context} ${facts.length} ${payload.hook_id}`;
}
