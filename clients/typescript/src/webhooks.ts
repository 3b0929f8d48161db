/**
 * `verifyWebhook`: check a delivery of a stratamem webhook the Standard Webhooks way
 * (https://www.standardwebhooks.com/), as the server signs it (`stratamem/hooks/_signing.py`):
 *
 * - `webhook-id`: the delivery id; `webhook-timestamp`: Unix seconds of this attempt;
 * - `webhook-signature`: `v1,` + base64 HMAC-SHA256 over `{id}.{timestamp}.{body}` keyed
 *   with the secret's bytes (base64 after `whsec_`); two such signatures, space-separated,
 *   while a rotated secret is in its grace period: any one that matches will do.
 *
 * It uses the platform's Web Crypto (Node.js 18+, Deno, Bun, edge runtimes), so it is async.
 */
import { WebhookVerificationError } from "./errors.js";

/** Five minutes either way, as the Standard Webhooks libraries allow. */
export const DEFAULT_TOLERANCE_SECONDS = 300;

/** Request headers as Node's `req.headers` has them, or a fetch `Headers` object. */
export type WebhookHeaders =
  | Record<string, string | string[] | undefined>
  | { get(name: string): string | null };

export interface VerifyWebhookOptions {
  /** How far `webhook-timestamp` may be from now, in seconds (default 300). */
  toleranceSeconds?: number;
  /** "Now" in Unix seconds (default: the clock); for tests and replays. */
  now?: number;
}

/** The body of a delivery (docs/webhooks.md); `data` depends on the hook point. */
export interface WebhookPayload {
  version: number;
  delivery_id: string;
  hook_id: string;
  hook_name: string;
  project_id: string;
  resource: "fact" | "summary" | "topic";
  event: "before_llm" | "after_llm" | "before_add";
  mode: "sync" | "async";
  triggered_at: string;
  context: {
    user_id: string;
    session_id: string | null;
    thread_id: string | null;
    session_ids: string[];
    message_ids: string[];
    [key: string]: unknown;
  };
  data: Record<string, unknown>;
  [key: string]: unknown;
}

interface Subtle {
  importKey(
    format: "raw",
    key: Uint8Array,
    algorithm: { name: string; hash: string },
    extractable: boolean,
    usages: string[],
  ): Promise<unknown>;
  sign(algorithm: string, key: unknown, data: Uint8Array): Promise<ArrayBuffer>;
}

async function subtle(): Promise<Subtle> {
  const global = (globalThis as { crypto?: { subtle?: Subtle } }).crypto;
  if (global?.subtle) return global.subtle;
  // Node.js 18 has Web Crypto without the global.
  const nodeCrypto = (await import("node:crypto")) as unknown as { webcrypto: { subtle: Subtle } };
  return nodeCrypto.webcrypto.subtle;
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof (headers as { get?: unknown }).get === "function") {
    return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  }
  const record = headers as Record<string, string | string[] | undefined>;
  for (const [key, value] of Object.entries(record)) {
    if (key.toLowerCase() === name) return Array.isArray(value) ? value.join(" ") : value;
  }
  return undefined;
}

function toBase64(bytes: Uint8Array): string {
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

function secretBytes(secret: string): Uint8Array {
  if (typeof secret !== "string" || !secret) {
    throw new TypeError("verifyWebhook: secret: expected the webhook's secret (whsec_...)");
  }
  const raw = secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret;
  try {
    return Uint8Array.from(atob(raw), (c) => c.charCodeAt(0));
  } catch {
    throw new TypeError("verifyWebhook: secret: not base64 after whsec_");
  }
}

function sameText(a: string, b: string): boolean {
  // Constant-time for strings of the same length (signatures all have one length).
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i += 1) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * Verify a webhook delivery and return its parsed body.
 *
 * `secret`: the webhook's `whsec_...` secret (or several: during a rotation a receiver may
 * hold the old and the new one). `headers`: the request's headers. `body`: the RAW body as
 * received (a string, or a `Buffer`/`Uint8Array`), before any JSON parsing: re-serialised
 * JSON would not match the signature.
 *
 * Throws `WebhookVerificationError` when a header is missing, the timestamp is more than
 * `toleranceSeconds` (300) from now, or no signature matches.
 */
export async function verifyWebhook<T = WebhookPayload>(
  secret: string | readonly string[],
  headers: WebhookHeaders,
  body: string | Uint8Array,
  options: VerifyWebhookOptions = {},
): Promise<T> {
  if (typeof headers !== "object" || headers === null) {
    throw new TypeError("verifyWebhook: headers: expected the request's headers");
  }
  let bytes: Uint8Array;
  if (typeof body === "string") bytes = new TextEncoder().encode(body);
  else if (body instanceof Uint8Array) bytes = body;
  else {
    throw new TypeError(
      "verifyWebhook: body: expected the raw body (a string or a Buffer), not parsed JSON; " +
        "e.g. express.raw({ type: 'application/json' }) or `await request.text()`",
    );
  }
  const keys = (typeof secret === "string" ? [secret] : [...secret]).map(secretBytes);
  if (!keys.length) throw new TypeError("verifyWebhook: secret: none given");

  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!id || !timestamp || !signatures) {
    const missing = [
      ["webhook-id", id],
      ["webhook-timestamp", timestamp],
      ["webhook-signature", signatures],
    ]
      .filter(([, v]) => !v)
      .map(([name]) => name);
    throw new WebhookVerificationError(`missing header(s): ${missing.join(", ")}`);
  }
  if (!/^\d+$/.test(timestamp.trim())) {
    throw new WebhookVerificationError(`invalid webhook-timestamp ${JSON.stringify(timestamp)}`);
  }
  const sent = Number(timestamp.trim());
  const now = options.now ?? Math.floor(Date.now() / 1000);
  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  if (now - sent > tolerance) {
    throw new WebhookVerificationError(`message timestamp too old (${now - sent} s ago)`);
  }
  if (sent - now > tolerance) {
    throw new WebhookVerificationError(`message timestamp too new (${sent - now} s ahead)`);
  }

  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const signed = new Uint8Array(prefix.length + bytes.length);
  signed.set(prefix, 0);
  signed.set(bytes, prefix.length);
  const crypto = await subtle();
  const given = signatures
    .split(" ")
    .filter(Boolean)
    .map((s) => s.split(","))
    .filter(([version, sig]) => version === "v1" && sig)
    .map(([, sig]) => sig as string);
  let ok = false;
  for (const key of keys) {
    const hmac = await crypto.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, [
      "sign",
    ]);
    const expected = toBase64(new Uint8Array(await crypto.sign("HMAC", hmac, signed)));
    for (const sig of given) ok = sameText(sig, expected) || ok;
  }
  if (!ok) throw new WebhookVerificationError("no matching signature found");
  const text = typeof body === "string" ? body : new TextDecoder().decode(bytes);
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new WebhookVerificationError("the body is not JSON");
  }
}
