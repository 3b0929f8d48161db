/**
 * The API's request and response types, by name: aliases of the generated `src/openapi.ts`
 * (never edited by hand), plus the helpers that read a route's types from it so every call
 * of the client is checked against the server's OpenAPI document at compile time.
 */
import type { components, paths } from "./openapi.js";

type Schemas = components["schemas"];

/** A conversation thread of one user (`session_id` repeats `id`, GUMem's name). */
export type SessionData = Schemas["SessionData"];
/** One message as a caller sends it: a chat turn or a behaviour event. */
export type MessageInput = Schemas["MessageInput"];
/** A stored message with its processing status. */
export type Message = Schemas["Message"];
/** What an add accepted: every message id in input order, and which were duplicates. */
export type AddResult = Schemas["AddResult"];
/** What `userActions.record` accepted (an {@link AddResult} with the user's id). */
export type ActionsData = Schemas["ActionsData"];
/** One behaviour event of `userActions.record({events: [...]})`. */
export type UserAction = Schemas["UserAction"];
/** What to put before the next model call: history, facts, summary, topics, formatted. */
export type MemoryContext = Schemas["MemoryContext"];
/** One ranked search result of any layer, with provenance down to messages. */
export type Hit = Schemas["Hit"];
export type Fact = Schemas["Fact"];
export type Summary = Schemas["Summary"];
export type Topic = Schemas["Topic"];
export type ProcessingStatus = Schemas["ProcessingStatus"];
export type MessageState = Schemas["MessageState"];
export type AuditRecord = Schemas["AuditRecord"];
export type Webhook = Schemas["Webhook"];
export type WebhookDelivery = Schemas["WebhookDelivery"];
export type Project = Schemas["Project"];
export type ApiKey = Schemas["ApiKey"];
export type ProjectInfo = Schemas["ProjectInfo"];
export type Health = Schemas["Health"];
export type ErrorInfo = Schemas["ErrorInfo"];
export type Problem = Schemas["Problem"];

export type Role = MessageInput["role"];
export type SummaryStatus = Schemas["SummaryStatusChange"]["status"];
export type MessageStatus = MessageState["status"];
export type WebhookResource = Webhook["resource"];
export type WebhookEvent = Webhook["event"];
export type WebhookMode = Webhook["mode"];
export type SearchLayer = NonNullable<Schemas["SearchRequest"]["layers"]>[number];

export type { components, paths };

// -- a route's types, read from the generated document --------------------------------------

export type Method = "get" | "post" | "patch" | "delete";
export type Path = keyof paths;
type Operation<P extends Path, M extends Method> = NonNullable<paths[P][M]>;
type Success<R> = R extends { 200: infer A } ? A : R extends { 201: infer B } ? B : never;
type JsonOf<X> = X extends { content: { "application/json": infer J } } ? J : never;
type Envelope<P extends Path, M extends Method> = JsonOf<
  Success<Operation<P, M> extends { responses: infer R } ? R : never>
>;

/** The `data` of a route's success envelope. */
export type DataOf<P extends Path, M extends Method> = NonNullable<
  Envelope<P, M> extends { data?: infer D } ? D : never
>;
/** The items of a list route's page. */
export type ItemOf<P extends Path, M extends Method> =
  DataOf<P, M> extends { items: Array<infer I> } ? I : never;
/** A route's JSON request body. */
export type BodyOf<P extends Path, M extends Method> =
  Operation<P, M> extends { requestBody?: { content: { "application/json": infer B } } }
    ? B
    : never;
/** A route's query parameters. */
export type QueryOf<P extends Path, M extends Method> =
  Operation<P, M> extends { parameters: { query?: infer Q } } ? NonNullable<Q> : never;
