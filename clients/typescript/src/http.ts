/**
 * The HTTP layer under the client: URL, key, timeouts, retries, envelope, errors. The rules
 * are the Python client's (`stratamem/client/_http.py`):
 *
 * - A request that never reached the server (connection refused, host not found) is
 *   always safe to resend.
 * - A request that may have reached it is resent only when it is idempotent (reads, and
 *   the writes the server deduplicates: messages, events and new sessions get their ids
 *   here before the first try) and the connection dropped or the server answered 503 (or a
 *   reverse proxy in front of it 502/504).
 * - A timeout is never retried: the bound the caller set is the bound.
 * - A redirect is followed only on the server's own origin (scheme, host and port), with
 *   the same method, body and key, at most MAX_REDIRECTS times. A redirect to another origin
 *   is an error: following it would send the request, the API key included, to another
 *   host. (In a browser, where a redirect cannot be inspected, none is followed.)
 */
import {
  APIConnectionError,
  APIError,
  APIStatusError,
  APITimeoutError,
  StratamemError,
  ValidationError,
  errorForStatus,
  retryAfterSeconds,
} from "./errors.js";

export const DEFAULT_BASE_URL = "http://127.0.0.1:8000";
export const DEFAULT_TIMEOUT_MS = 30_000;
export const DEFAULT_MAX_RETRIES = 2;
/** `addMessages(..., {sync: true})` waits while the server processes (it gives up itself
 * after its `sync_timeout_seconds`, 120 s by default, with a 503). */
export const DEFAULT_SYNC_TIMEOUT_MS = 150_000;
/** The server's largest page; lists follow pages of at most this many items. */
export const MAX_PAGE = 1000;
/** The largest `limit` a list call takes (the embedded engine's bound too). */
export const MAX_LIMIT = 10_000;
const MAX_REDIRECTS = 5;
const BACKOFF_BASE_MS = 250;
const BACKOFF_CAP_MS = 8_000;
const RETRY_AFTER_CAP_MS = 30_000;
const IDEMPOTENT_METHODS = new Set(["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]);
const UNAVAILABLE = new Set([502, 503, 504]);
// Codes of errors (from Node's fetch, undici) raised before a request left this process.
const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

export type Fetch = typeof globalThis.fetch;

/** Where a value goes: a query-string value (undefined and null are left out). */
export type QueryValue = string | number | boolean | null | undefined;

/** One API request and how to send it. */
export interface Call {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  /** The path with its ids already encoded (see {@link segment}). */
  path: string;
  query?: Record<string, QueryValue>;
  body?: unknown;
  /** Override of the method's default (GET and DELETE are idempotent, POST and PATCH not). */
  idempotent?: boolean;
  /** A longer timeout for this call (e.g. a `sync` write the server answers once processed). */
  timeoutMs?: number;
  /** A 503/502/504 to a `sync` write usually means its messages are stored and their
   * processing outlasted the server's patience: it is resent after a dropped connection
   * only (false). Default true. */
  resendUnavailable?: boolean;
  /** "admin": authenticate with the admin token instead of the API key. */
  auth?: "key" | "admin" | "none";
}

export interface TransportOptions {
  baseUrl: string;
  apiKey: string | undefined;
  adminToken: string | undefined;
  timeoutMs: number;
  maxRetries: number;
  headers: Record<string, string>;
  fetch: Fetch | undefined;
}

/** An id as exactly one URL path segment ("/", "+", "@", ":" included). */
export function segment(value: string): string {
  return encodeURIComponent(value);
}

export function normalizeBaseUrl(baseUrl: unknown): string {
  if (typeof baseUrl !== "string" || !baseUrl.trim()) {
    throw new TypeError("baseUrl: expected the server's URL, e.g. http://127.0.0.1:8000");
  }
  let url = baseUrl.trim().replace(/\/+$/, "");
  if (!url.includes("://")) url = `http://${url}`;
  if (!/^https?:\/\//i.test(url)) {
    throw new TypeError(`baseUrl: expected an http:// or https:// URL (got ${JSON.stringify(baseUrl)})`);
  }
  return url;
}

export function authorization(key: string | undefined, name: string): Record<string, string> {
  if (key === undefined) return {};
  if (typeof key !== "string" || !key.trim()) throw new TypeError(`${name}: empty`);
  const trimmed = key.trim();
  const space = trimmed.indexOf(" ");
  if (space > 0) {
    const scheme = trimmed.slice(0, space);
    const rest = trimmed.slice(space + 1).trim();
    // A key pasted with its scheme ("Api-Key ...", "Bearer ...") is sent as it is.
    if (rest && ["api-key", "bearer"].includes(scheme.toLowerCase())) {
      return { Authorization: `${scheme} ${rest}` };
    }
  }
  return { Authorization: `${name === "adminToken" ? "Bearer" : "Api-Key"} ${trimmed}` };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function backoffMs(attempt: number, response: Response | undefined): number {
  const hint = response ? retryAfterSeconds(response.headers) : undefined;
  if (hint !== undefined) return Math.min(RETRY_AFTER_CAP_MS, hint * 1000);
  // Full jitter: many clients retrying after one outage must not arrive in step.
  return Math.random() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** attempt);
}

function causeCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

function describe(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current; depth += 1) {
    if (current instanceof Error) parts.push(current.message);
    current = (current as { cause?: unknown }).cause;
  }
  return parts.filter(Boolean).join(": ") || String(error);
}

// Strings UTF-8 cannot encode (a lone surrogate) or that a store cannot hold (NUL): the
// server would refuse them; say which field before anything is sent.
const UNSTORABLE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]|\u0000/;

function unstorable(value: unknown, path: string): string | undefined {
  if (typeof value === "string") return UNSTORABLE.test(value) ? path : undefined;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i += 1) {
      const found = unstorable(value[i], `${path}[${i}]`);
      if (found !== undefined) return found;
    }
    return undefined;
  }
  if (typeof value === "object" && value !== null) {
    for (const [key, item] of Object.entries(value)) {
      const where = path ? `${path}.${key}` : key;
      if (UNSTORABLE.test(key)) return where;
      const found = unstorable(item, where);
      if (found !== undefined) return found;
    }
  }
  return undefined;
}

function malformed(call: Call, why: string): APIError {
  // A server of another version, or something else answering at baseUrl: say so rather
  // than let a parsing error from deep inside look like a bug of the caller.
  return new APIError(
    `${call.method} ${call.path}: the server's answer is not what this client expects (${why.slice(0, 300)})`,
  );
}

function redirectError(call: Call, status: number, what: string): APIStatusError {
  const error = new APIStatusError(
    `${call.method} ${call.path}: the server answered ${status}, ${what}, not followed: ` +
      "it would carry the request and its key elsewhere; set baseUrl to the server's own URL",
  );
  error.status = status;
  return error;
}

export class Transport {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  private readonly keyHeaders: Record<string, string>;
  private readonly adminHeaders: Record<string, string>;
  private readonly headers: Record<string, string>;
  private readonly fetchImpl: Fetch;

  constructor(options: TransportOptions) {
    this.baseUrl = normalizeBaseUrl(options.baseUrl);
    const { timeoutMs, maxRetries } = options;
    if (typeof timeoutMs !== "number" || !(timeoutMs > 0)) {
      throw new TypeError("timeout: expected a positive number of milliseconds");
    }
    if (!Number.isInteger(maxRetries) || maxRetries < 0) {
      throw new TypeError("maxRetries: expected an integer >= 0");
    }
    this.timeoutMs = timeoutMs;
    this.maxRetries = maxRetries;
    this.keyHeaders = authorization(options.apiKey, "apiKey");
    this.adminHeaders = authorization(options.adminToken, "adminToken");
    this.headers = { Accept: "application/json", ...options.headers };
    const fetchImpl = options.fetch ?? globalThis.fetch;
    if (typeof fetchImpl !== "function") {
      throw new TypeError("no fetch: use Node.js 18 or newer, or pass the `fetch` option");
    }
    this.fetchImpl = fetchImpl;
  }

  /** Send `call`, retrying as the rules above allow; the envelope's `data`. */
  async send(call: Call): Promise<unknown> {
    const url = this.url(call);
    const init = this.init(call);
    const timeoutMs = Math.max(this.timeoutMs, call.timeoutMs ?? 0);
    const safe = call.idempotent ?? IDEMPOTENT_METHODS.has(call.method);
    for (let attempt = 0; ; attempt += 1) {
      let response: Response | undefined;
      let text = "";
      const controller = new AbortController();
      const timer = setTimeout(() => controller.abort(), timeoutMs);
      try {
        response = await this.fetchFollowing(call, url, { ...init, signal: controller.signal });
        text = await response.text();
      } catch (error) {
        if (error instanceof APIStatusError) throw error; // a redirect refused
        if (controller.signal.aborted) {
          throw Object.assign(
            new APITimeoutError(`${call.method} ${url}: no answer within ${timeoutMs} ms`),
            { cause: error },
          );
        }
        const code = causeCode(error);
        // Never reached the server: always safe. Dropped on the way: only if idempotent.
        const retry = (code !== undefined && NOT_SENT.has(code)) || safe;
        if (attempt >= this.maxRetries || !retry) {
          throw Object.assign(
            new APIConnectionError(`${call.method} ${url}: ${describe(error)}`),
            { cause: error },
          );
        }
        await sleep(backoffMs(attempt, undefined));
        continue;
      } finally {
        clearTimeout(timer);
      }
      const again = safe && UNAVAILABLE.has(response.status) && call.resendUnavailable !== false;
      if (attempt >= this.maxRetries || !again) return this.decode(call, response, text);
      await sleep(backoffMs(attempt, response));
    }
  }

  /** `fetch` that follows redirects on the base URL's origin only (see the rules above). */
  private async fetchFollowing(call: Call, url: string, init: RequestInit): Promise<Response> {
    const origin = new URL(this.baseUrl).origin;
    let at = url;
    for (let hops = 0; ; hops += 1) {
      const response = await this.fetchImpl(at, { ...init, redirect: "manual" });
      if (response.type === "opaqueredirect") {
        throw redirectError(call, response.status, "a redirect this runtime hides (a browser's)");
      }
      const location = response.headers.get("location");
      if (response.status < 300 || response.status >= 400 || location === null) return response;
      await response.body?.cancel();
      const next = new URL(location, at);
      if (next.origin !== origin) {
        throw redirectError(call, response.status, `a redirect to another origin (${next.origin})`);
      }
      if (hops >= MAX_REDIRECTS) {
        throw redirectError(call, response.status, `more than ${MAX_REDIRECTS} redirects`);
      }
      at = next.href;
    }
  }

  /** A list route: follow `next_offset` across pages until `limit` items are collected. */
  async sendPaged(call: Call, limit: number, offset: number): Promise<unknown[]> {
    const items: unknown[] = [];
    let at = offset;
    for (;;) {
      const size = Math.min(limit - items.length, MAX_PAGE);
      const data = await this.send({ ...call, query: { ...call.query, limit: size, offset: at } });
      if (
        typeof data !== "object" ||
        data === null ||
        !Array.isArray((data as { items?: unknown }).items)
      ) {
        throw malformed(call, "expected a page {items, limit, offset, next_offset}");
      }
      const page = data as { items: unknown[]; next_offset?: unknown };
      items.push(...page.items);
      if (typeof page.next_offset !== "number" || items.length >= limit) return items;
      at = page.next_offset;
    }
  }

  private url(call: Call): string {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(call.query ?? {})) {
      if (value !== undefined && value !== null) params.set(key, String(value));
    }
    const query = params.toString();
    return this.baseUrl + call.path + (query ? `?${query}` : "");
  }

  private init(call: Call): RequestInit {
    const auth =
      call.auth === "admin" ? this.adminHeaders : call.auth === "none" ? {} : this.keyHeaders;
    const headers: Record<string, string> = { ...this.headers, ...auth };
    const found = unstorable({ query: call.query ?? {}, body: call.body ?? null }, "");
    if (found !== undefined) {
      const field = found.replace(/^(query|body)\.?/, "") || "body";
      throw new ValidationError("invalid request; nothing was sent", [
        { field, message: "text with a lone surrogate or a NUL character cannot be stored" },
      ]);
    }
    const init: RequestInit = { method: call.method, headers };
    if (call.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(call.body);
    }
    return init;
  }

  private decode(call: Call, response: Response, text: string): unknown {
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      // not JSON: kept as text
    }
    if (response.status >= 400) throw errorForStatus(response.status, body, response.headers);
    if (typeof body !== "object" || body === null || !("success" in body)) {
      const error = new APIStatusError(
        `${call.method} ${call.path}: the server answered ${response.status} without ` +
          "stratamem's envelope; is baseUrl a stratamem server?",
      );
      error.status = response.status;
      error.body = body;
      throw error;
    }
    const envelope = body as { success: unknown; data?: unknown };
    if (envelope.success === false) throw errorForStatus(500, body, response.headers);
    return envelope.data;
  }
}

export { StratamemError };
