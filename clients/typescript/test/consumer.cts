// Compiled (not run) by the tests: the CommonJS declarations type a require() consumer.
import stratamem = require("stratamem");

export function make(): stratamem.MemoryClient {
  return new stratamem.MemoryClient({ baseUrl: "http://127.0.0.1:8000", maxRetries: 1 });
}
export const isError = (e: unknown): boolean => e instanceof stratamem.NotFoundError;
