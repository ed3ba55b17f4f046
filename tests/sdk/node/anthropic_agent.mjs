// The official Anthropic TypeScript SDK as a coding agent through the clawback sidecar.
// Reads ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY and CLAWBACK_MODEL; prints `ok <case>` per check;
// a mismatch throws.
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";

const model = process.env.CLAWBACK_MODEL;
const tools = [{
  name: "get_weather",
  description: "Current weather for a city.",
  input_schema: {
    type: "object",
    properties: { city: { type: "string", maxLength: 8 } },
    required: ["city"],
  },
}];
const client = new Anthropic({ maxRetries: 0, timeout: 120_000 });

const message = await client.messages.create({
  model, max_tokens: 12, temperature: 0, system: "You are terse.",
  messages: [{ role: "user", content: "Say hello" }],
});
assert.equal(message.type, "message");
assert.ok(message.id.startsWith("msg_"));
assert.ok(message.usage.input_tokens > 0);
console.log("ok message");

const types = [];
const stream = client.messages.stream({
  model, max_tokens: 200, temperature: 0, tools, tool_choice: { type: "any" },
  messages: [{ role: "user", content: "What's the weather in Paris?" }],
});
stream.on("streamEvent", (event) => types.push(event.type));
const streamed = await stream.finalMessage();
assert.equal(types[0], "message_start");
assert.equal(types.at(-1), "message_stop");
const use = streamed.content.find((b) => b.type === "tool_use");
assert.ok(use && use.name === "get_weather" && typeof use.input === "object", JSON.stringify(streamed));
assert.equal(streamed.stop_reason, "tool_use");
console.log("ok stream_tool_use");

await assert.rejects(
  client.messages.create({ model, max_tokens: 100000, messages: [{ role: "user", content: "x" }] }),
  (e) => e instanceof Anthropic.BadRequestError && e.error.error.type === "invalid_request_error",
);
console.log("ok engine_error");
