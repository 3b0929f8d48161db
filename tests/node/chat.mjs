// A Node.js application using the official openai package, with the stratamem proxy as its
// base URL: one plain and one streamed chat completion, the user named in a default header.
// Prints one JSON object (answers, the X-Stratamem-Memory header of each call) on stdout.
//
//   node chat.mjs <proxy base URL, e.g. http://127.0.0.1:8000/v1> <user id> <question> <question>
//
// The provider key comes from OPENAI_API_KEY, as in any openai application. Run by
// tests/test_proxy_node.py.
import OpenAI from "openai";
import { VERSION } from "openai/version";

const [baseURL, user, first, second] = process.argv.slice(2);
if (!baseURL || !user || !first || !second) {
  console.error("usage: node chat.mjs <base URL> <user id> <question> <question>");
  process.exit(2);
}

const client = new OpenAI({
  baseURL,
  apiKey: process.env.OPENAI_API_KEY,
  defaultHeaders: { "X-Stratamem-User-Id": user },
  maxRetries: 0,
  timeout: 30_000,
});

const plain = await client.chat.completions
  .create({ model: "gpt-fake", messages: [{ role: "user", content: first }] })
  .withResponse();

const streamed = await client.chat.completions
  .create({ model: "gpt-fake", messages: [{ role: "user", content: second }], stream: true })
  .withResponse();
const pieces = [];
for await (const chunk of streamed.data) {
  const piece = chunk.choices[0]?.delta?.content;
  if (piece) pieces.push(piece);
}

console.log(
  JSON.stringify({
    openai: VERSION,
    plain: {
      answer: plain.data.choices[0].message.content,
      memory: plain.response.headers.get("x-stratamem-memory"),
      requestId: plain.response.headers.get("x-request-id"),
    },
    streamed: {
      answer: pieces.join(""),
      chunks: pieces.length,
      memory: streamed.response.headers.get("x-stratamem-memory"),
    },
  }),
);
