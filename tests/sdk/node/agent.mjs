// The official OpenAI Node SDK as an agent through the clawback sidecar.
// Reads OPENAI_BASE_URL / OPENAI_API_KEY and prints `ok <case>` per check; a mismatch throws.
import assert from "node:assert/strict";
import OpenAI from "openai";

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city.",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string" } },
      required: ["city"],
    },
  },
}];
const messages = [{ role: "user", content: "What's the weather in Paris?" }];
const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });

const chat = await client.chat.completions.create({ model: "mock-llama", messages: [{ role: "user", content: "Hi" }] });
assert.ok(chat.choices[0].message.content.startsWith("The weather"));
console.log("ok chat");

const stream = await client.chat.completions.create({
  model: "mock-llama", messages, tools, tool_choice: "auto", max_completion_tokens: 256,
  stream: true, stream_options: { include_usage: true },
});
let name = null, args = "", finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    for (const call of choice.delta.tool_calls ?? []) {
      name = call.function?.name ?? name;
      args += call.function?.arguments ?? "";
    }
    finish = choice.finish_reason ?? finish;
  }
}
assert.equal(name, "get_weather");
assert.deepEqual(JSON.parse(args), { city: "Paris", unit: "celsius" });
assert.equal(finish, "tool_calls");
assert.ok(usage.total_tokens > 0);
console.log("ok chat_stream_tools");

const completion = await client.completions.create({ model: "mock-llama", prompt: "Paris is", max_tokens: 16 });
assert.ok(completion.choices[0].text.startsWith("The weather"));
console.log("ok completions");

const response = await client.responses.create({ model: "mock-llama", input: "Weather in Paris?" });
assert.ok(response.output_text.startsWith("The weather"));
console.log("ok responses");

// Only the new item and the previous response's id: the sidecar keeps the conversation.
const followUp = await client.responses.create({
  model: "mock-llama", previous_response_id: response.id, input: "And tomorrow?",
});
assert.ok(followUp.output_text.length > 0);
console.log("ok previous_response_id");

const events = [];
const responseStream = await client.responses.create({
  model: "mock-llama", input: messages, stream: true,
  tools: [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters }],
});
for await (const event of responseStream) events.push(event);
const last = events.at(-1);
assert.equal(last.type, "response.completed");
assert.equal(last.response.output[0].type, "function_call");
assert.equal(JSON.parse(last.response.output[0].arguments).city, "Paris");
console.log("ok responses_stream");

const models = await client.models.list();
assert.deepEqual(models.data.map((m) => m.id), ["mock-llama"]);
console.log("ok models");
