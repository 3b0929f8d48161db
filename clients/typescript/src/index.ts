/**
 * stratamem's TypeScript client: long-term memory for LLM apps from Node.js (and any
 * runtime with `fetch`), against a stratamem server (`stratamem serve`).
 *
 * ```ts
 * import { MemoryClient } from "stratamem";
 * const client = new MemoryClient({ apiKey: process.env.STRATAMEM_API_KEY });
 * ```
 */
export {
  MemoryClient,
  Session,
  Sessions,
  Messages,
  Facts,
  Summaries,
  Topics,
  Webhooks,
  UserActions,
  Projects,
  Keys,
  newId,
} from "./client.js";
export type {
  ClientOptions,
  AddMessagesOptions,
  GetMemoryOptions,
  SearchOptions,
  CreateSessionOptions,
  ListMessagesOptions,
  ListItemsOptions,
  ForgetOptions,
  RecordActionOptions,
  CreateWebhookOptions,
  UpdateWebhookOptions,
  WebhookWithSecret,
  NewApiKey,
  Paging,
  RecallConfig,
  MetadataFilters,
  TimeInput,
  SummaryVersion,
} from "./client.js";
export {
  StratamemError,
  APIError,
  APIConnectionError,
  APITimeoutError,
  APIStatusError,
  AuthenticationError,
  ValidationError,
  PayloadTooLargeError,
  NotFoundError,
  ConflictError,
  RateLimitError,
  ServerError,
  ProcessingError,
  WebhookVerificationError,
  errorForStatus,
} from "./errors.js";
export type { FieldProblem } from "./errors.js";
export { verifyWebhook, DEFAULT_TOLERANCE_SECONDS } from "./webhooks.js";
export type { WebhookHeaders, WebhookPayload, VerifyWebhookOptions } from "./webhooks.js";
export {
  DEFAULT_BASE_URL,
  DEFAULT_MAX_RETRIES,
  DEFAULT_SYNC_TIMEOUT_MS,
  DEFAULT_TIMEOUT_MS,
} from "./http.js";
export type { Fetch } from "./http.js";
export type * from "./types.js";
