// Compiled (not run) by the tests: the CommonJS declarations type a require() consumer.
import memstrata = require("memstrata");

export function make(): memstrata.MemoryClient {
  return new memstrata.MemoryClient({ baseUrl: "http://127.0.0.1:8000", maxRetries: 1 });
}
export const isError = (e: unknown): boolean => e instanceof memstrata.NotFoundError;
