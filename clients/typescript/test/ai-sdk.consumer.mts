// Compiled (not run) by the tests: the AI SDK middleware is a middleware that the `ai`
// package's own wrapLanguageModel takes (its v4 types; the mock model is a v3 one).
import { wrapLanguageModel } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { MemoryClient } from "stratamem";
import { stratamemMiddleware } from "stratamem/ai-sdk";

export function withMemory(client: MemoryClient): ReturnType<typeof wrapLanguageModel> {
  const middleware = stratamemMiddleware({ client, userId: "u1", sessionId: "s1" });
  return wrapLanguageModel({ model: new MockLanguageModelV3(), middleware });
}
