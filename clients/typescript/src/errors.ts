/**
 * Errors of the client: one class per way a request to the server can fail, as in the
 * Python client (`stratamem.client`). Every error derives from {@link StratamemError};
 * every error about a request from {@link APIError}, which carries what the server said:
 * `status`, `code`, `detail`, `requestId` (quote it when reporting a server error) and the
 * decoded `body`. Validation errors also carry `problems`, one `{field, message}` per
 * offending field.
 */

/** One rejected input: which field (a dotted path, e.g. `messages[0].role`) and why. */
export interface FieldProblem {
  field: string;
  message: string;
}

/** The base class of every error this package throws. */
export class StratamemError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** `wait()` ran out of time with messages still unprocessed (they stay queued). */
export class ProcessingError extends StratamemError {}

/** A webhook delivery whose signature, timestamp or headers do not check out. */
export class WebhookVerificationError extends StratamemError {}

/**
 * The server could not be reached, or it answered with an error. `status` is undefined
 * when no answer came (connection refused, timeout) and for arguments refused before any
 * request was sent.
 */
export class APIError extends StratamemError {
  status: number | undefined = undefined;
  /** The server's stable error code: `not_found`, `conflict`, `validation_error` ... */
  code: string | undefined = undefined;
  /** What went wrong, as the server (or this client) said it. */
  detail: string;
  /** The request's id (`error.request_id`, or the `X-Request-ID` header). */
  requestId: string | undefined = undefined;
  /** The decoded response body, if any. */
  body: unknown = undefined;

  constructor(message: string, detail?: string) {
    super(message);
    this.detail = detail ?? message;
  }
}

/** No answer: the server refused the connection, dropped it, or the URL is wrong. */
export class APIConnectionError extends APIError {}

/** The server did not answer within the configured timeout. */
export class APITimeoutError extends APIConnectionError {}

/** The server answered with an error status that no more specific class covers. */
export class APIStatusError extends APIError {}

/** 401 or 403: the API key (or admin token) is missing, wrong or revoked. */
export class AuthenticationError extends APIStatusError {}

/**
 * 400 or 422: the server refused the input (or this client did, before sending anything:
 * then `status` is undefined). `problems` has one `{field, message}` per offending field.
 */
export class ValidationError extends APIStatusError {
  problems: FieldProblem[];

  constructor(detail: string, problems: FieldProblem[] = []) {
    const lines = problems.map((p) => (p.field ? `${p.field}: ${p.message}` : p.message));
    super(lines.length ? `${detail}\n  ${lines.join("\n  ")}` : detail, detail);
    this.problems = problems;
  }
}

/** 413: the body, a message's content or its metadata is over the server's limit. */
export class PayloadTooLargeError extends ValidationError {}

/** 404: no such session or item in the key's project. */
export class NotFoundError extends APIStatusError {}

/** 409: the request contradicts stored state (a session of another user, a message id
 * resent with other content). */
export class ConflictError extends APIStatusError {}

/** 429: too many requests; `retryAfter` is the server's hint in seconds, if it sent one. */
export class RateLimitError extends APIStatusError {
  retryAfter: number | undefined = undefined;
}

/** 5xx: the server failed (500) or is unavailable for now (503). Quote `requestId`. */
export class ServerError extends APIStatusError {}

interface HeaderSource {
  get(name: string): string | null;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function problemsOf(value: unknown): FieldProblem[] {
  if (!Array.isArray(value)) return [];
  return value.map((p): FieldProblem => {
    if (isObject(p)) {
      return { field: String(p.field ?? ""), message: String(p.message ?? "") };
    }
    return { field: "", message: String(p) };
  });
}

/** Seconds from a `Retry-After` header (undefined for none, or for an HTTP date). */
export function retryAfterSeconds(headers: HeaderSource | undefined): number | undefined {
  const value = headers?.get("retry-after");
  if (value === null || value === undefined || value.trim() === "") return undefined;
  const seconds = Number(value);
  return Number.isFinite(seconds) ? Math.max(0, seconds) : undefined;
}

/**
 * The error for a response with `status`, from its decoded `body`: the server's envelope
 * `{"error": {"code", "detail", "problems", "request_id"}}`, FastAPI's plain
 * `{"detail": ...}`, or any text a proxy in between may have sent.
 */
export function errorForStatus(
  status: number,
  body: unknown,
  headers?: HeaderSource,
): APIStatusError {
  let info: Record<string, unknown> = {};
  if (isObject(body)) {
    if (isObject(body.error)) info = body.error;
    else if ("detail" in body) info = { detail: body.detail };
  }
  let detail: unknown = info.detail ?? (isObject(body) ? body.message : undefined);
  if (typeof detail !== "string" || !detail) {
    const text = typeof body === "string" ? body.trim().slice(0, 300) : "";
    detail = text || `HTTP ${status}`;
  }
  const said = detail as string;
  const problems = problemsOf(info.problems);
  const fromBody = typeof info.request_id === "string" ? info.request_id : undefined;
  const requestId = fromBody ?? headers?.get("x-request-id") ?? undefined;

  let error: APIStatusError;
  if (status === 400 || status === 422) error = new ValidationError(said, problems);
  else if (status === 413) error = new PayloadTooLargeError(said, problems);
  else if (status === 401 || status === 403) error = new AuthenticationError(said, said);
  else if (status === 404) error = new NotFoundError(said, said);
  else if (status === 409) error = new ConflictError(said, said);
  else if (status === 429) {
    const limited = new RateLimitError(said, said);
    limited.retryAfter = retryAfterSeconds(headers);
    error = limited;
  } else if (status >= 500) {
    const suffix = requestId && !said.includes(requestId) ? ` (request id ${requestId})` : "";
    error = new ServerError(said + suffix, said);
  } else error = new APIStatusError(`HTTP ${status}: ${said}`, said);
  error.status = status;
  error.code = typeof info.code === "string" ? info.code : undefined;
  error.requestId = requestId;
  error.body = body;
  return error;
}
