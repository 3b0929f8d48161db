/**
 * `MemoryClient`: stratamem's REST API as typed calls, in the Python client's shape
 * (`stratamem.client.MemoryClient`): the same method families, the same retry rules and
 * the same errors, with camelCase names and options. Answers are the server's JSON as the
 * generated types describe it (snake_case fields, timestamps as ISO-8601 strings).
 */
import { StratamemError, ProcessingError, ValidationError, NotFoundError } from "./errors.js";
import type { FieldProblem } from "./errors.js";
import {
  DEFAULT_BASE_URL,
  DEFAULT_MAX_RETRIES,
  DEFAULT_SYNC_TIMEOUT_MS,
  DEFAULT_TIMEOUT_MS,
  MAX_LIMIT,
  Transport,
  segment,
} from "./http.js";
import type { Call, Fetch } from "./http.js";
import type {
  ActionsData,
  AddResult,
  ApiKey,
  AuditRecord,
  BodyOf,
  DataOf,
  Fact,
  Health,
  Hit,
  ItemOf,
  MemoryContext,
  Message,
  MessageInput,
  MessageStatus,
  Method,
  Path,
  ProcessingStatus,
  Project,
  ProjectInfo,
  QueryOf,
  Role,
  SearchLayer,
  SessionData,
  Summary,
  SummaryStatus,
  Topic,
  UserAction,
  Webhook,
  WebhookDelivery,
  WebhookEvent,
  WebhookMode,
  WebhookResource,
} from "./types.js";

export interface ClientOptions {
  /** Sent as `Authorization: Api-Key <key>` (default: `STRATAMEM_API_KEY`). A key pasted
   * with its scheme (`"Bearer sm_..."`) is sent as given. */
  apiKey?: string;
  /** The server (default: `STRATAMEM_BASE_URL`, else an http(s) `STRATAMEM_DATABASE_URL`,
   * else `http://127.0.0.1:8000`). `host:port` without a scheme means `http://`. */
  baseUrl?: string;
  /** The server's `STRATAMEM_ADMIN_TOKEN`, for `projects` and `keys` (the /admin API). */
  adminToken?: string;
  /** Longest wait for one attempt's answer, in milliseconds (default 30000). */
  timeout?: number;
  /** Resends of requests that are safe to resend (default 2); see the docs. */
  maxRetries?: number;
  /** Timeout of writes with `sync: true`, which the server answers once processed
   * (default 150000 ms). */
  syncTimeout?: number;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
  /** A `fetch` of your own (default: the platform's). */
  fetch?: Fetch;
}

/** A recall configuration: GUMem's PascalCase keys (`MessageRecentLimit`) or snake_case. */
export type RecallConfig = Record<string, unknown>;
/** Metadata filters, e.g. `{channel: "web"}` or `{score: {$gte: 3}}`. */
export type MetadataFilters = Record<string, unknown>;
/** A time: a `Date` or an ISO-8601 string. */
export type TimeInput = Date | string;

export interface Paging {
  /** At most this many items (1 to 10000; default 100). Lists follow the server's pages. */
  limit?: number;
  offset?: number;
}

export interface AddMessagesOptions {
  /** false (default): return once stored; true: return once processed. */
  sync?: boolean;
  /** The session's user: a session id that does not exist yet is created for this user
   * (an existing session must be this user's: 409 if not). */
  userId?: string;
}

export interface GetMemoryOptions {
  /** What the next model call is about. */
  query?: string | null;
  /** Also return the matched items of every layer with scores (`matches`). */
  details?: boolean;
  recallConfig?: RecallConfig;
  metadataFilters?: MetadataFilters;
  /** Texts the prompt carries already: messages with these contents are left out. */
  excludeTexts?: string[];
}

export interface SearchOptions {
  userId: string;
  /** 1 to 1000 (default 10). */
  limit?: number;
  filters?: MetadataFilters;
  sessionId?: string;
  since?: TimeInput;
  until?: TimeInput;
  roles?: Role[];
  eventTypes?: string[];
  asOf?: TimeInput;
  layers?: SearchLayer[];
  includeSuperseded?: boolean;
  recallConfig?: RecallConfig;
}

export interface CreateSessionOptions {
  userId: string;
  title?: string;
  metadata?: Record<string, unknown>;
  /** Choose the id; an existing session of the same user is returned as it is. Without it
   * the client chooses one (`s_...`) before the first try, so a resend cannot make two. */
  sessionId?: string;
}

export interface ListMessagesOptions extends Paging {
  sessionId?: string;
  userId?: string;
  status?: MessageStatus;
}

export interface ListItemsOptions extends Paging {
  userId: string;
  status?: string;
  since?: TimeInput;
  until?: TimeInput;
  metadataFilters?: MetadataFilters;
}

export interface ForgetOptions {
  userId: string;
  messageIds?: string[];
  sessionId?: string;
  topicId?: string;
  reason?: string;
}

export interface RecordActionOptions {
  userId: string;
  eventType?: string;
  content?: string;
  page?: string;
  metadata?: Record<string, unknown>;
  timestamp?: TimeInput;
  id?: string;
  /** Several events at once (instead of the inline fields). */
  events?: UserAction[];
  /** Session to file the events under (default: the user's own `actions-<user_id>`). */
  sessionId?: string;
  sync?: boolean;
}

export interface CreateWebhookOptions {
  resource: WebhookResource;
  event: WebhookEvent;
  targetUrl: string;
  mode?: WebhookMode;
  name?: string;
  timeoutMs?: number;
  enabled?: boolean;
}

export interface UpdateWebhookOptions {
  name?: string;
  resource?: WebhookResource;
  event?: WebhookEvent;
  targetUrl?: string;
  mode?: WebhookMode;
  timeoutMs?: number;
  enabled?: boolean;
}

/** A webhook and its signing secret (`whsec_...`), shown only when created or rotated. */
export interface WebhookWithSecret {
  webhook: Webhook;
  secret: string;
}

/** A new API key and the key itself (`secret`), shown only now. */
export interface NewApiKey {
  key: ApiKey;
  secret: string;
}

export type SummaryVersion = Record<string, unknown>;

// -- rules checked before anything is sent ------------------------------------------------

const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,199}$/;
const ID_RULE =
  "expected 1-200 characters of letters, digits and ._:@/+=- starting with a letter or digit";
const SUMMARY_STATUSES: readonly SummaryStatus[] = ["active", "deprioritized", "archived", "deleted"];

function shown(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

function refuse(what: string, problems: FieldProblem[]): never {
  throw new ValidationError(`invalid ${what}`, problems);
}

function checkId(value: unknown, name: string): string {
  if (typeof value !== "string" || !ID_RE.test(value)) {
    refuse(name, [{ field: name, message: `${ID_RULE} (got ${shown(value)})` }]);
  }
  return value;
}

function optionalId(value: unknown, name: string): string | undefined {
  return value === undefined || value === null ? undefined : checkId(value, name);
}

function checkPaging(paging: Paging | undefined, fallback = 100): [number, number] {
  const limit = paging?.limit ?? fallback;
  const offset = paging?.offset ?? 0;
  const problems: FieldProblem[] = [];
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    problems.push({
      field: "limit",
      message: `expected an integer from 1 to ${MAX_LIMIT} (got ${shown(limit)})`,
    });
  }
  if (!Number.isInteger(offset) || offset < 0) {
    problems.push({ field: "offset", message: `expected an integer >= 0 (got ${shown(offset)})` });
  }
  if (problems.length) refuse("paging", problems);
  return [limit, offset];
}

function timeParam(value: TimeInput | undefined, name: string): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) refuse(name, [{ field: name, message: "invalid Date" }]);
    return value.toISOString();
  }
  if (typeof value !== "string" || !value.trim()) {
    refuse(name, [{ field: name, message: `expected a Date or an ISO-8601 string (got ${shown(value)})` }]);
  }
  return value;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function randomHex(bytes: number): string {
  const buffer = new Uint8Array(bytes);
  const crypto = (globalThis as { crypto?: { getRandomValues?: (a: Uint8Array) => Uint8Array } })
    .crypto;
  if (crypto?.getRandomValues) crypto.getRandomValues(buffer);
  else for (let i = 0; i < bytes; i += 1) buffer[i] = Math.floor(Math.random() * 256);
  return Array.from(buffer, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A new id in the server's own form: time-ordered, random (`m_0190f3a1c2d4a1b2c3d4e5f6`). */
export function newId(prefix: string): string {
  return `${prefix}_${Date.now().toString(16).padStart(12, "0")}${randomHex(6)}`;
}

/**
 * `items` (messages or events) each with an id, and whether all have one. The server
 * stores an id resent with the same content once, so ids given before the first try make
 * every resend of the request a no-op: a write whose answer was lost is resent without
 * storing it twice. The caller's own ids are kept.
 */
function withIds<T>(items: readonly T[], name: string): T[] {
  if (!Array.isArray(items) || items.length === 0) {
    refuse(name, [{ field: name, message: `expected a non-empty array (got ${shown(items)})` }]);
  }
  return items.map((item, i) => {
    if (!isObject(item)) {
      refuse(name, [{ field: `${name}[${i}]`, message: `expected an object (got ${shown(item)})` }]);
    }
    return (item.id === undefined || item.id === null ? { ...item, id: newId("m") } : item) as T;
  });
}

function given<T extends Record<string, unknown>>(fields: T): Partial<T> {
  const out: Partial<T> = {};
  for (const [key, value] of Object.entries(fields)) {
    if (value !== undefined) (out as Record<string, unknown>)[key] = value;
  }
  return out;
}

// -- the client ---------------------------------------------------------------------------

interface Spec<P extends Path, M extends Method> {
  ids?: Record<string, string>;
  query?: QueryOf<P, M>;
  body?: BodyOf<P, M>;
  idempotent?: boolean;
  timeoutMs?: number;
  resendUnavailable?: boolean;
  auth?: Call["auth"];
}

function env(name: string): string | undefined {
  const process = (globalThis as { process?: { env?: Record<string, string | undefined> } })
    .process;
  const value = process?.env?.[name];
  return value === undefined || value === "" ? undefined : value;
}

function defaultBaseUrl(): string {
  const url = env("STRATAMEM_BASE_URL") ?? env("STRATAMEM_DATABASE_URL") ?? "";
  return /^https?:\/\//i.test(url) ? url : DEFAULT_BASE_URL;
}

/**
 * A stratamem server, over HTTP.
 *
 * ```ts
 * const client = new MemoryClient({ apiKey: "sm_...", baseUrl: "http://127.0.0.1:8000" });
 * const session = await client.sessions.create({ userId: "u1", title: "trip planning" });
 * await session.addMessages([{ role: "user", content: "I moved to Berlin in March." }]);
 * const ctx = await session.getMemory("Where does the user live?");
 * ctx.formatted_context;
 * ```
 */
export class MemoryClient {
  readonly baseUrl: string;
  readonly syncTimeout: number;
  readonly sessions: Sessions;
  readonly messages: Messages;
  readonly facts: Facts;
  readonly summaries: Summaries;
  readonly topics: Topics;
  readonly webhooks: Webhooks;
  readonly userActions: UserActions;
  /** Projects (the /admin API; needs `adminToken`). */
  readonly projects: Projects;
  /** API keys of projects (the /admin API; needs `adminToken`). */
  readonly keys: Keys;
  private readonly transport: Transport;
  private readonly written = new Set<string>();

  constructor(options: ClientOptions = {}) {
    if (typeof options !== "object" || options === null) {
      throw new TypeError("MemoryClient: expected an options object");
    }
    this.transport = new Transport({
      baseUrl: options.baseUrl ?? defaultBaseUrl(),
      apiKey: options.apiKey ?? env("STRATAMEM_API_KEY"),
      adminToken: options.adminToken,
      timeoutMs: options.timeout ?? DEFAULT_TIMEOUT_MS,
      maxRetries: options.maxRetries ?? DEFAULT_MAX_RETRIES,
      headers: options.headers ?? {},
      fetch: options.fetch,
    });
    this.baseUrl = this.transport.baseUrl;
    this.syncTimeout = options.syncTimeout ?? DEFAULT_SYNC_TIMEOUT_MS;
    if (typeof this.syncTimeout !== "number" || !(this.syncTimeout > 0)) {
      throw new TypeError("syncTimeout: expected a positive number of milliseconds");
    }
    this.sessions = new Sessions(this);
    this.messages = new Messages(this);
    this.facts = new Facts(this);
    this.summaries = new Summaries(this);
    this.topics = new Topics(this);
    this.webhooks = new Webhooks(this);
    this.userActions = new UserActions(this);
    this.projects = new Projects(this);
    this.keys = new Keys(this);
  }

  /** @internal One route, its types read from the generated OpenAPI types. */
  async _op<P extends Path, M extends Method>(
    method: M,
    path: P,
    spec: Spec<P, M> = {},
  ): Promise<DataOf<P, M>> {
    return (await this.transport.send(this._call(method, path, spec))) as DataOf<P, M>;
  }

  /** @internal A list route, following its pages until `limit` items are collected. */
  async _paged<P extends Path, M extends Method>(
    method: M,
    path: P,
    spec: Spec<P, M>,
    [limit, offset]: [number, number],
  ): Promise<ItemOf<P, M>[]> {
    const call = this._call(method, path, spec);
    return (await this.transport.sendPaged(call, limit, offset)) as ItemOf<P, M>[];
  }

  private _call<P extends Path, M extends Method>(method: M, path: P, spec: Spec<P, M>): Call {
    const ids = spec.ids ?? {};
    const filled = (path as string).replace(/\{([a-z_]+)\}/g, (_, name: string) => {
      const id = ids[name];
      if (id === undefined) throw new StratamemError(`${path}: no value for {${name}}`);
      return segment(id);
    });
    const call: Call = {
      method: method.toUpperCase() as Call["method"],
      path: filled,
      query: spec.query as Call["query"],
      body: spec.body,
    };
    if (spec.idempotent !== undefined) call.idempotent = spec.idempotent;
    if (spec.timeoutMs !== undefined) call.timeoutMs = spec.timeoutMs;
    if (spec.resendUnavailable !== undefined) call.resendUnavailable = spec.resendUnavailable;
    if (spec.auth !== undefined) call.auth = spec.auth;
    return call;
  }

  /**
   * Store messages durably and queue their processing; with `sync: true` return once they
   * are processed. Messages without an `id` get one before the first try (your own ids are
   * kept; all are in `message_ids`), so the client's resends after a lost answer store
   * each message once.
   */
  async addMessages(
    sessionId: string,
    messages: MessageInput[],
    options: AddMessagesOptions = {},
  ): Promise<AddResult> {
    const sid = checkId(sessionId, "session_id");
    const userId = optionalId(options.userId, "user_id");
    const sync = options.sync ?? false;
    const result = await this._op("post", "/api/sessions/{session_id}/messages", {
      ids: { session_id: sid },
      body: { messages: withIds(messages, "messages"), sync, ...given({ user_id: userId }) },
      idempotent: true,
      ...(sync ? { timeoutMs: this.syncTimeout, resendUnavailable: false } : {}),
    });
    if (!result.processed) this.written.add(result.session_id);
    return result;
  }

  /**
   * What to put before the next model call in this session: `formatted_context`, the
   * recent `history`, matched `facts`, `summary`, `topics` (and `matches` with `details`).
   */
  async getMemory(
    sessionId: string,
    query?: string | null | GetMemoryOptions,
    options: GetMemoryOptions = {},
  ): Promise<MemoryContext> {
    const sid = checkId(sessionId, "session_id");
    const asked: GetMemoryOptions =
      typeof query === "object" && query !== null
        ? { ...query, ...options }
        : { ...options, query: query ?? options.query };
    if (asked.query !== undefined && asked.query !== null && typeof asked.query !== "string") {
      refuse("get_memory", [{ field: "query", message: `expected a string (got ${shown(asked.query)})` }]);
    }
    if (asked.excludeTexts !== undefined && !Array.isArray(asked.excludeTexts)) {
      refuse("get_memory", [{ field: "exclude_texts", message: "expected an array of strings" }]);
    }
    // Always POST: a long query does not fit in a URL, and GET takes no recall_config.
    return this._op("post", "/api/sessions/{session_id}/context", {
      ids: { session_id: sid },
      body: {
        exclude_texts: asked.excludeTexts ?? [],
        ...given({
          query: asked.query ?? undefined,
          details: asked.details,
          recall_config: asked.recallConfig,
          metadata_filters: asked.metadataFilters,
        }),
      },
      idempotent: true,
    });
  }

  /** Ranked memories of a user of every layer, each with `message_ids` (provenance). */
  async search(query: string, options: SearchOptions): Promise<Hit[]> {
    if (typeof query !== "string" || !query.trim()) {
      refuse("search", [{ field: "query", message: `expected a non-empty string (got ${shown(query)})` }]);
    }
    if (!isObject(options)) refuse("search", [{ field: "user_id", message: "required" }]);
    const uid = checkId(options.userId, "user_id");
    const limit = options.limit ?? 10;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
      refuse("search", [{ field: "limit", message: `expected an integer from 1 to 1000 (got ${shown(limit)})` }]);
    }
    return this._op("post", "/api/users/{user_id}/search", {
      ids: { user_id: uid },
      body: {
        query,
        limit,
        ...given({
          filters: options.filters,
          session_id: optionalId(options.sessionId, "session_id"),
          since: timeParam(options.since, "since"),
          until: timeParam(options.until, "until"),
          roles: options.roles,
          event_types: options.eventTypes,
          as_of: timeParam(options.asOf, "as_of"),
          layers: options.layers,
          include_superseded: options.includeSuperseded,
          recall_config: options.recallConfig,
        }),
      },
      idempotent: true,
    });
  }

  /** How far a session's messages are through the write pipeline. */
  processingStatus(sessionId: string): Promise<ProcessingStatus> {
    const sid = checkId(sessionId, "session_id");
    return this._op("get", "/api/sessions/{session_id}/status", { ids: { session_id: sid } });
  }

  /**
   * Wait until the server has processed every message this client sent (scripts, tests).
   * Throws `ProcessingError` if `timeout` milliseconds pass first.
   */
  async wait(options: { timeout?: number } = {}): Promise<void> {
    const deadline = options.timeout === undefined ? undefined : Date.now() + options.timeout;
    let delay = 20;
    for (;;) {
      for (const sid of [...this.written].sort()) {
        let done: boolean;
        try {
          done = (await this.processingStatus(sid)).done;
        } catch (error) {
          if (!(error instanceof NotFoundError)) throw error;
          done = true; // forgotten or erased meanwhile: nothing to wait for
        }
        if (done) this.written.delete(sid);
      }
      const left = [...this.written].sort();
      if (!left.length) return;
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new ProcessingError(
          `messages of ${left.length} session(s) still unprocessed after ${options.timeout} ms ` +
            `(e.g. ${JSON.stringify(left[0])}); they stay queued on the server`,
        );
      }
      const pause = deadline === undefined ? delay : Math.max(0, Math.min(delay, deadline - Date.now()));
      await new Promise((resolve) => setTimeout(resolve, pause));
      delay = Math.min(500, delay * 1.5);
    }
  }

  /** `GET /healthz` (no key needed): `{status: "ok", version}`. */
  health(): Promise<Health> {
    return this._op("get", "/healthz", { auth: "none" });
  }

  /** The project the API key belongs to, and which key it is (never the key itself). */
  project(): Promise<ProjectInfo> {
    return this._op("get", "/api/project");
  }

  /** Move a summary to active, deprioritized, archived or deleted; the server audits the
   * change with `reason` and the calling key. Not resent once it may have arrived. */
  setStatus(summaryId: string, status: SummaryStatus, options: { reason: string }): Promise<Summary> {
    const id = checkId(summaryId, "summary_id");
    const problems: FieldProblem[] = [];
    if (!SUMMARY_STATUSES.includes(status)) {
      problems.push({ field: "status", message: `expected one of ${SUMMARY_STATUSES.join(", ")} (got ${shown(status)})` });
    }
    const reason = options?.reason;
    if (typeof reason !== "string" || !reason.trim()) {
      problems.push({ field: "reason", message: "required: why (audited)" });
    }
    if (problems.length) refuse("set_status", problems);
    return this._op("patch", "/api/summaries/{summary_id}", {
      ids: { summary_id: id },
      body: { status, reason },
    });
  }

  /** Delete some of a user's memory (exactly one scope: `messageIds`, `sessionId` or
   * `topicId`) from provenance upward; the counts removed by layer. */
  forget(options: ForgetOptions): Promise<Record<string, number>> {
    if (!isObject(options)) refuse("forget", [{ field: "user_id", message: "required" }]);
    const uid = checkId(options.userId, "user_id");
    const scopes = [options.messageIds, options.sessionId, options.topicId].filter(
      (s) => s !== undefined && s !== null,
    );
    if (scopes.length !== 1) {
      const message = `give exactly one scope (got ${scopes.length})`;
      refuse("forget", ["message_ids", "session_id", "topic_id"].map((field) => ({ field, message })));
    }
    if (options.messageIds !== undefined) {
      if (!Array.isArray(options.messageIds) || !options.messageIds.length) {
        refuse("forget", [{ field: "message_ids", message: "expected a non-empty array of ids" }]);
      }
      options.messageIds.forEach((m, i) => checkId(m, `message_ids[${i}]`));
    }
    return this._op("post", "/api/forget", {
      body: {
        user_id: uid,
        ...given({
          message_ids: options.messageIds,
          session_id: optionalId(options.sessionId, "session_id"),
          topic_id: optionalId(options.topicId, "topic_id"),
          reason: options.reason,
        }),
      },
    });
  }

  /** Remove everything held about a user; the counts removed by layer. Not resent once it
   * may have arrived (a second erase would add a second audit record). */
  eraseUser(userId: string, options: { reason?: string } = {}): Promise<Record<string, number>> {
    const uid = checkId(userId, "user_id");
    return this._op("delete", "/api/users/{user_id}", {
      ids: { user_id: uid },
      query: given({ reason: options.reason }),
      idempotent: false,
    });
  }

  /** A user's whole memory, every layer with provenance, as JSON. */
  exportUser(userId: string): Promise<Record<string, unknown>> {
    const uid = checkId(userId, "user_id");
    return this._op("get", "/api/users/{user_id}/export", { ids: { user_id: uid } });
  }

  /** Status changes, forgets and erasures in the key's project, oldest first. */
  audit(options: Paging & { userId?: string } = {}): Promise<AuditRecord[]> {
    const userId = optionalId(options.userId, "user_id");
    return this._paged("get", "/api/audit", { query: given({ user_id: userId }) }, checkPaging(options));
  }
}

class Face {
  constructor(protected readonly client: MemoryClient) {}
}

/**
 * A session as the server returned it (`id`, `user_id`, `title` ...), bound to the client
 * that fetched it: `addMessages`, `getMemory`, `messages` and `processingStatus` act on it.
 * `JSON.stringify(session)` gives the plain data.
 */
export class Session implements SessionData {
  declare id: string;
  declare session_id: string;
  declare project_id: string;
  declare user_id: string;
  declare title?: string | null;
  declare metadata: SessionData["metadata"];
  declare created_at: string;
  declare updated_at: string;
  readonly #client: MemoryClient;
  readonly #data: SessionData;

  constructor(client: MemoryClient, data: SessionData) {
    this.#client = client;
    this.#data = data;
    Object.assign(this, data);
  }

  addMessages(messages: MessageInput[], options: Omit<AddMessagesOptions, "userId"> = {}): Promise<AddResult> {
    return this.#client.addMessages(this.id, messages, options);
  }

  getMemory(query?: string | null | GetMemoryOptions, options: GetMemoryOptions = {}): Promise<MemoryContext> {
    return this.#client.getMemory(this.id, query, options);
  }

  messages(options: Omit<ListMessagesOptions, "sessionId" | "userId"> = {}): Promise<Message[]> {
    return this.#client.messages.list({ ...options, sessionId: this.id });
  }

  processingStatus(): Promise<ProcessingStatus> {
    return this.#client.processingStatus(this.id);
  }

  toJSON(): SessionData {
    return { ...this.#data };
  }
}

/** `client.sessions`: create and look up conversation threads. */
export class Sessions extends Face {
  /** Create a session of `userId` (or return it, if `sessionId` names an existing session
   * of the same user; of another user: `ConflictError`). */
  async create(options: CreateSessionOptions): Promise<Session> {
    if (!isObject(options)) refuse("session", [{ field: "user_id", message: "required" }]);
    const userId = checkId(options.userId, "user_id");
    // The id is chosen here, before the first try: a resend after a lost answer returns
    // the session the first try made, not a second one.
    const sessionId = optionalId(options.sessionId, "session_id") ?? newId("s");
    const data = await this.client._op("post", "/api/sessions", {
      body: {
        user_id: userId,
        session_id: sessionId,
        ...given({ title: options.title, metadata: options.metadata }),
      },
      idempotent: true,
    });
    return new Session(this.client, data);
  }

  async get(sessionId: string): Promise<Session> {
    const sid = checkId(sessionId, "session_id");
    const data = await this.client._op("get", "/api/sessions/{session_id}", { ids: { session_id: sid } });
    return new Session(this.client, data);
  }

  /** Sessions of the project (or of one user), in creation order. */
  async list(options: Paging & { userId?: string } = {}): Promise<Session[]> {
    const userId = optionalId(options.userId, "user_id");
    const rows = await this.client._paged(
      "get",
      "/api/sessions",
      { query: given({ user_id: userId }) },
      checkPaging(options),
    );
    return rows.map((s) => new Session(this.client, s));
  }
}

/** `client.messages`: stored messages with their processing status. */
export class Messages extends Face {
  get(messageId: string): Promise<Message> {
    const mid = checkId(messageId, "message_id");
    return this.client._op("get", "/api/messages/{message_id}", { ids: { message_id: mid } });
  }

  /** A session's or a user's messages in acceptance order (one of `sessionId` and
   * `userId` is required). */
  async list(options: ListMessagesOptions = {}): Promise<Message[]> {
    const paging = checkPaging(options);
    const status = options.status;
    const userId = optionalId(options.userId, "user_id");
    const sessionId = optionalId(options.sessionId, "session_id");
    if (sessionId === undefined) {
      if (userId === undefined) {
        refuse("messages.list", [
          { field: "session_id or user_id", message: "required (the server lists per session or per user)" },
        ]);
      }
      return this.client._paged(
        "get",
        "/api/users/{user_id}/messages",
        { ids: { user_id: userId }, query: given({ status }) },
        paging,
      );
    }
    const rows = await this.client._paged(
      "get",
      "/api/sessions/{session_id}/messages",
      { ids: { session_id: sessionId }, query: given({ status }) },
      paging,
    );
    // A session of another user holds none of this user's messages.
    return userId === undefined ? rows : rows.filter((m) => m.user_id === userId);
  }
}

function itemQuery(options: ListItemsOptions) {
  return given({
    status: options.status,
    since: timeParam(options.since, "since"),
    until: timeParam(options.until, "until"),
    metadata: options.metadataFilters === undefined ? undefined : JSON.stringify(options.metadataFilters),
  });
}

/** `client.facts`: facts extracted from a user's messages, with provenance. */
export class Facts extends Face {
  list(options: ListItemsOptions): Promise<Fact[]> {
    const uid = checkId(options?.userId, "user_id");
    return this.client._paged(
      "get",
      "/api/users/{user_id}/facts",
      { ids: { user_id: uid }, query: itemQuery(options) as QueryOf<"/api/users/{user_id}/facts", "get"> },
      checkPaging(options),
    );
  }

  get(factId: string): Promise<Fact> {
    const id = checkId(factId, "fact_id");
    return this.client._op("get", "/api/facts/{fact_id}", { ids: { fact_id: id } });
  }
}

/** `client.summaries`: long-term memory with status, evidence and history. */
export class Summaries extends Face {
  list(options: ListItemsOptions): Promise<Summary[]> {
    const uid = checkId(options?.userId, "user_id");
    return this.client._paged(
      "get",
      "/api/users/{user_id}/summaries",
      { ids: { user_id: uid }, query: itemQuery(options) as QueryOf<"/api/users/{user_id}/summaries", "get"> },
      checkPaging(options),
    );
  }

  get(summaryId: string): Promise<Summary> {
    const id = checkId(summaryId, "summary_id");
    return this.client._op("get", "/api/summaries/{summary_id}", { ids: { summary_id: id } });
  }

  /** Every version of a summary: text, status, evidence, reason, actor, when. */
  history(summaryId: string): Promise<SummaryVersion[]> {
    const id = checkId(summaryId, "summary_id");
    return this.client._op("get", "/api/summaries/{summary_id}/history", { ids: { summary_id: id } });
  }
}

/** `client.topics`: the entry points that group a user's summaries. */
export class Topics extends Face {
  list(options: Paging & { userId: string }): Promise<Topic[]> {
    const uid = checkId(options?.userId, "user_id");
    return this.client._paged(
      "get",
      "/api/users/{user_id}/topics",
      { ids: { user_id: uid } },
      checkPaging(options, MAX_LIMIT),
    );
  }

  get(topicId: string): Promise<Topic> {
    const id = checkId(topicId, "topic_id");
    return this.client._op("get", "/api/topics/{topic_id}", { ids: { topic_id: id } });
  }
}

/** `client.userActions`: behaviour events (searches, clicks, views, tool calls). */
export class UserActions extends Face {
  /** Record one event (the inline fields) or several (`events`) for `userId`; they go to
   * `sessionId` or the user's own `actions-<user_id>` session. Every event gets an id
   * before the first try, so resends store it once. */
  record(options: RecordActionOptions): Promise<ActionsData> {
    if (!isObject(options)) refuse("user_actions.record", [{ field: "user_id", message: "required" }]);
    const userId = checkId(options.userId, "user_id");
    const sync = options.sync ?? false;
    const inline = given({
      event_type: options.eventType,
      content: options.content,
      page: options.page,
      metadata: options.metadata,
      timestamp: timeParam(options.timestamp, "timestamp"),
    });
    let body: BodyOf<"/api/user/actions", "post">;
    if (options.events !== undefined) {
      body = { user_id: userId, sync, events: withIds(options.events, "events"), ...inline };
      if (options.id !== undefined) body.id = options.id;
    } else {
      if (inline.event_type === undefined) {
        refuse("user_actions.record", [{ field: "event_type", message: "required (or give `events`)" }]);
      }
      body = { user_id: userId, sync, ...inline, id: optionalId(options.id, "id") ?? newId("m") };
    }
    const sessionId = optionalId(options.sessionId, "session_id");
    if (sessionId !== undefined) body.session_id = sessionId;
    return this.client._op("post", "/api/user/actions", {
      body,
      idempotent: true,
      // Like addMessages with sync: the server answers once the events are processed.
      ...(sync ? { timeoutMs: this.client.syncTimeout, resendUnavailable: false } : {}),
    });
  }
}

/** `client.webhooks`: the project's webhooks (docs/webhooks.md) and their delivery log. */
export class Webhooks extends Face {
  /** The webhook and its signing secret (`whsec_...`), shown only now. Not resent once it
   * may have arrived (nothing makes a second creation a no-op). */
  create(options: CreateWebhookOptions): Promise<WebhookWithSecret> {
    if (!isObject(options)) refuse("webhook", [{ field: "resource", message: "required" }]);
    const problems: FieldProblem[] = [];
    for (const [field, value] of [
      ["resource", options.resource],
      ["event", options.event],
      ["target_url", options.targetUrl],
    ] as const) {
      if (typeof value !== "string" || !value) problems.push({ field, message: "required" });
    }
    if (problems.length) refuse("webhook", problems);
    return this.client._op("post", "/api/webhooks", {
      body: {
        resource: options.resource,
        event: options.event,
        target_url: options.targetUrl,
        mode: options.mode ?? "sync",
        enabled: options.enabled ?? true,
        ...given({ name: options.name, timeout_ms: options.timeoutMs }),
      },
    });
  }

  list(options: Paging = {}): Promise<Webhook[]> {
    return this.client._paged("get", "/api/webhooks", {}, checkPaging(options));
  }

  get(hookId: string): Promise<Webhook> {
    const id = checkId(hookId, "hook_id");
    return this.client._op("get", "/api/webhooks/{hook_id}", { ids: { hook_id: id } });
  }

  /** Change some fields (those left out stay as they are). */
  update(hookId: string, changes: UpdateWebhookOptions): Promise<Webhook> {
    const id = checkId(hookId, "hook_id");
    return this.client._op("patch", "/api/webhooks/{hook_id}", {
      ids: { hook_id: id },
      body: given({
        name: changes?.name,
        resource: changes?.resource,
        event: changes?.event,
        target_url: changes?.targetUrl,
        mode: changes?.mode,
        timeout_ms: changes?.timeoutMs,
        enabled: changes?.enabled,
      }),
    });
  }

  enable(hookId: string): Promise<Webhook> {
    return this.update(hookId, { enabled: true });
  }

  disable(hookId: string): Promise<Webhook> {
    return this.update(hookId, { enabled: false });
  }

  /** Delete a webhook with its delivery log; the webhook as it was. */
  delete(hookId: string): Promise<Webhook> {
    const id = checkId(hookId, "hook_id");
    return this.client._op("delete", "/api/webhooks/{hook_id}", { ids: { hook_id: id } });
  }

  /** A new signing secret; with `graceSeconds` the old one keeps signing beside it (two
   * signatures per delivery) for that long. */
  rotateSecret(hookId: string, options: { graceSeconds?: number } = {}): Promise<WebhookWithSecret> {
    const id = checkId(hookId, "hook_id");
    return this.client._op("post", "/api/webhooks/{hook_id}/rotate-secret", {
      ids: { hook_id: id },
      body: { grace_seconds: options.graceSeconds ?? 0 },
    });
  }

  /** The delivery log, newest first. */
  deliveries(hookId: string, options: Paging = {}): Promise<WebhookDelivery[]> {
    const id = checkId(hookId, "hook_id");
    return this.client._paged(
      "get",
      "/api/webhooks/{hook_id}/deliveries",
      { ids: { hook_id: id } },
      checkPaging(options),
    );
  }
}

/** `client.projects`: tenants, through the /admin API (needs `adminToken`). */
export class Projects extends Face {
  /** Create a project; with `projectId`, an existing project of that id is returned as it
   * is (so that call is resent after a dropped connection; without it, it is not). */
  create(options: { name: string; projectId?: string }): Promise<Project> {
    if (!isObject(options) || typeof options.name !== "string" || !options.name.trim()) {
      refuse("project", [{ field: "name", message: "required" }]);
    }
    const projectId = optionalId(options.projectId, "project_id");
    return this.client._op("post", "/admin/projects", {
      body: { name: options.name, ...given({ project_id: projectId }) },
      idempotent: projectId !== undefined,
      auth: "admin",
    });
  }

  list(): Promise<Project[]> {
    return this.client._op("get", "/admin/projects", { auth: "admin" });
  }

  get(projectId: string): Promise<Project> {
    const id = checkId(projectId, "project_id");
    return this.client._op("get", "/admin/projects/{project_id}", { ids: { project_id: id }, auth: "admin" });
  }
}

/** `client.keys`: API keys of projects, through the /admin API (needs `adminToken`). */
export class Keys extends Face {
  /** A new key of the project; `secret` is the key itself, shown only now. */
  create(projectId: string, options: { name?: string } = {}): Promise<NewApiKey> {
    const id = checkId(projectId, "project_id");
    return this.client._op("post", "/admin/projects/{project_id}/keys", {
      ids: { project_id: id },
      body: given({ name: options.name }),
      auth: "admin",
    });
  }

  /** The project's keys (never the keys themselves). */
  list(projectId: string): Promise<ApiKey[]> {
    const id = checkId(projectId, "project_id");
    return this.client._op("get", "/admin/projects/{project_id}/keys", { ids: { project_id: id }, auth: "admin" });
  }

  /** Revoke a key: requests with it are refused (401) from then on. */
  revoke(keyId: string): Promise<ApiKey> {
    const id = checkId(keyId, "key_id");
    return this.client._op("delete", "/admin/keys/{key_id}", { ids: { key_id: id }, auth: "admin" });
  }
}
