/**
 * Memory for the Vercel AI SDK: a language-model middleware (`wrapLanguageModel({ model,
 * middleware })`) that recalls from a stratamem server before each call and stores the
 * exchange after it (docs/integrations/ai-sdk.md).
 *
 * - `transformParams`: recall for the last user message's text (`getMemory`, the prompt's
 *   own turns excluded) and append the memory block to that message as a text part. The
 *   system prompt and every earlier message stay byte-identical, so a provider's prompt
 *   cache keeps working (the system role is never touched).
 * - `wrapGenerate` / `wrapStream`: once the answer is complete (a streamed one when its
 *   stream ends), the user's text (without the block) and the answer's text are stored as
 *   two messages of the session, in the background (`flush()` waits for them).
 * - Fail-open: a recall slower than `recallTimeoutMs` (or failing) is skipped and a store
 *   that fails is reported, both to `onError`; neither ever fails the model call.
 *
 * The middleware is typed structurally (no import of `ai` or `@ai-sdk/provider`), so it
 * fits the AI SDK's v3 and v4 language-model middleware alike.
 */
import type { MemoryClient } from "./client.js";
import type { MessageInput } from "./types.js";

/** A part of a prompt message, as the AI SDK's prompts have them. */
interface PromptPart {
  type: string;
  text?: string;
}

/** A message of a prompt: system content is a string, the others' a list of parts. */
interface PromptMessage {
  role: string;
  content: unknown;
}

interface CallParams {
  prompt: PromptMessage[];
}

/** What failed, for `onError`: the recall before a call or the store after it. */
export type AiSdkMemoryPhase = "recall" | "store";

export interface StratamemMiddlewareOptions {
  /** The client of the stratamem server. */
  client: MemoryClient;
  /** The user whose memory it is. */
  userId: string;
  /** The stratamem session the exchanges are stored in (and recalled for). */
  sessionId: string;
  /** The most a recall may take before the call goes on without memory (default 250 ms). */
  recallTimeoutMs?: number;
  /** stratamem's recall configuration (default: capture's compact one, ~400 tokens). */
  recallConfig?: Record<string, unknown>;
  /** Told of every skipped recall and failed store (default: `console.warn`). */
  onError?: (error: unknown, phase: AiSdkMemoryPhase) => void;
}

/** The middleware, and `flush()`: wait until every exchange so far is stored. */
export interface StratamemMiddleware {
  readonly specificationVersion: "v3";
  transformParams<P extends CallParams>(options: { params: P }): Promise<P>;
  wrapGenerate<R extends { content: PromptPart[] }, P extends CallParams>(options: {
    doGenerate: () => PromiseLike<R>;
    params: P;
  }): Promise<R>;
  wrapStream<S extends { stream: ReadableStream<PromptPart & { delta?: string }> }, P extends CallParams>(options: {
    doStream: () => PromiseLike<S>;
    params: P;
  }): Promise<S>;
  flush(): Promise<void>;
}

/** Capture's compact recall (docs/capture.md), without the session's recent turns (the
 * prompt has them). */
export const RECALL_CONFIG: Readonly<Record<string, unknown>> = Object.freeze({
  proposition_top_k: 6,
  observation_semantic_top_k: 0,
  message_semantic_top_k: 6,
  observation_context_top_k: 1,
  candidate_pool: 10,
  token_budget: 400,
  message_recent_limit: 0,
});

function textOf(message: PromptMessage): string {
  if (typeof message.content === "string") return message.content;
  if (!Array.isArray(message.content)) return "";
  return (message.content as PromptPart[])
    .filter((p) => p.type === "text" && typeof p.text === "string")
    .map((p) => p.text as string)
    .join("\n");
}

function lastUser(prompt: PromptMessage[]): number {
  for (let i = prompt.length - 1; i >= 0; i--) {
    const m = prompt[i];
    if (m !== undefined && m.role === "user" && textOf(m).trim()) return i;
  }
  return -1;
}

class TimedOut extends Error {
  constructor(ms: number) {
    super(`stratamem recall took longer than ${ms} ms; the call goes without memory`);
    this.name = "TimedOut";
  }
}

function within<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimedOut(ms)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * A language-model middleware giving the wrapped model stratamem memory:
 *
 * ```ts
 * const memory = stratamemMiddleware({ client, userId: "u1", sessionId: "chat-1" });
 * const model = wrapLanguageModel({ model: openai("gpt-4o-mini"), middleware: memory });
 * ```
 */
export function stratamemMiddleware(options: StratamemMiddlewareOptions): StratamemMiddleware {
  const { client, userId, sessionId } = options;
  if (!client || typeof client.getMemory !== "function") {
    throw new TypeError("stratamemMiddleware: `client` must be a stratamem MemoryClient");
  }
  for (const [name, value] of [["userId", userId], ["sessionId", sessionId]] as const) {
    if (typeof value !== "string" || !value.trim()) {
      throw new TypeError(`stratamemMiddleware: \`${name}\` must be a non-empty string`);
    }
  }
  const timeoutMs = options.recallTimeoutMs ?? 250;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new TypeError("stratamemMiddleware: `recallTimeoutMs` must be a positive number");
  }
  const recallConfig = options.recallConfig ?? { ...RECALL_CONFIG };
  const onError =
    options.onError ??
    ((error: unknown, phase: AiSdkMemoryPhase) => console.warn(`stratamem ${phase}:`, error));
  // The user's own text of each call, by its (transformed) params: what is stored after it.
  const asked = new WeakMap<object, string>();
  const pending = new Set<Promise<void>>();
  // The session is made once, before the first recall (a recall of a session that does
  // not exist yet would fail); a failed attempt is tried again at the next call.
  let ready: Promise<void> | undefined;
  const session = (): Promise<void> => {
    ready ??= client.sessions.create({ userId, sessionId }).then(
      () => undefined,
      (error: unknown) => {
        ready = undefined;
        throw error;
      },
    );
    return ready;
  };

  const report = (error: unknown, phase: AiSdkMemoryPhase): void => {
    try {
      onError(error, phase);
    } catch {
      // a failing reporter must not fail the model call either
    }
  };

  const store = (params: object, answer: string): void => {
    const question = asked.get(params);
    if (question === undefined) return;
    const messages: MessageInput[] = [{ role: "user", content: question }];
    if (answer.trim()) messages.push({ role: "assistant", content: answer });
    const done = client
      .addMessages(sessionId, messages, { userId })
      .then(() => undefined)
      .catch((error: unknown) => report(error, "store"))
      .finally(() => pending.delete(done));
    pending.add(done);
  };

  return {
    specificationVersion: "v3",

    async transformParams<P extends CallParams>({ params }: { params: P }): Promise<P> {
      const at = lastUser(params.prompt);
      if (at < 0) return params;
      const message = params.prompt[at] as PromptMessage;
      const query = textOf(message);
      let block = "";
      try {
        const excludeTexts = params.prompt
          .filter((m) => m.role === "user" || m.role === "assistant")
          .map(textOf)
          .filter((t) => t.trim());
        const context = await within(
          session().then(() => client.getMemory(sessionId, { query, recallConfig, excludeTexts })),
          timeoutMs,
        );
        block = context.formatted_context ?? "";
      } catch (error) {
        report(error, "recall");
      }
      const parts = Array.isArray(message.content) ? (message.content as PromptPart[]) : [];
      const prompt = block
        ? params.prompt.map((m, i) =>
            i === at ? { ...m, content: [...parts, { type: "text", text: block }] } : m,
          )
        : params.prompt;
      const out = { ...params, prompt };
      asked.set(out, query);
      return out;
    },

    async wrapGenerate({ doGenerate, params }) {
      const result = await doGenerate();
      const answer = result.content
        .filter((p) => p.type === "text" && typeof p.text === "string")
        .map((p) => p.text as string)
        .join("");
      store(params, answer);
      return result;
    },

    async wrapStream({ doStream, params }) {
      const result = await doStream();
      let answer = "";
      const collect = new TransformStream<PromptPart & { delta?: string }, PromptPart & { delta?: string }>({
        transform(part, controller) {
          if (part.type === "text-delta" && typeof part.delta === "string") answer += part.delta;
          controller.enqueue(part);
        },
        flush() {
          store(params, answer);
        },
      });
      return { ...result, stream: result.stream.pipeThrough(collect) };
    },

    async flush(): Promise<void> {
      while (pending.size) await Promise.all([...pending]);
    },
  };
}
