"""The official Anthropic Python SDK as a coding agent through the clawback sidecar.

Reads ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY like any agent would (the key travels as
`x-api-key`) and CLAWBACK_MODEL for the model; prints `ok <case>` per check and, last, a JSON
line `session {...}` with what the multi-turn tool session sent and got. Any mismatch raises, so
the process fails.
"""
import json
import os

import anthropic

MODEL = os.environ["CLAWBACK_MODEL"]
TOOLS = [{
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    },
    "cache_control": {"type": "ephemeral"},
}]
SYSTEM = [{"type": "text", "text": "You are a weather agent.", "cache_control": {"type": "ephemeral"}}]

client = anthropic.Anthropic(max_retries=0, timeout=120)

# A plain message, system prompt as blocks with a cache marker.
message = client.messages.create(
    model=MODEL, max_tokens=12, extra_body={"temperature": 0}, system=SYSTEM,
    messages=[{"role": "user", "content": "Say hello"}],
)
assert message.type == "message" and message.role == "assistant", message
assert message.id.startswith("msg_"), message.id
assert message.stop_reason in ("end_turn", "max_tokens"), message.stop_reason
assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0, message.usage
assert all(block.type == "text" for block in message.content), message.content
print("ok message")

# A stream with tool use: the whole lifecycle, event by event.
types = []
with client.messages.stream(
    model=MODEL, max_tokens=200, extra_body={"temperature": 0}, system=SYSTEM, tools=TOOLS,
    tool_choice={"type": "any"},
    messages=[{"role": "user", "content": "What's the weather in Rome?"}],
) as stream:
    for event in stream:
        types.append(event.type)
    streamed = stream.get_final_message()
assert types[0] == "message_start", types
assert types[-1] == "message_stop", types
for needed in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
    assert needed in types, (needed, types)
uses = [b for b in streamed.content if b.type == "tool_use"]
assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input, dict), streamed.content
assert streamed.stop_reason == "tool_use", streamed.stop_reason
print("ok stream_tool_use")

# A three-turn tool session with no session id at all: the sidecar stitches it.
history = [{"role": "user", "content": "What's the weather in Paris?"}]
first = client.messages.create(
    model=MODEL, max_tokens=400, extra_body={"temperature": 0}, system=SYSTEM, tools=TOOLS,
    tool_choice={"type": "any", "disable_parallel_tool_use": True}, messages=history,
)
calls = [b for b in first.content if b.type == "tool_use"]
assert calls, (first.stop_reason, first.content)
call = calls[0]
history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
history.append({"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": call.id, "cache_control": {"type": "ephemeral"},
     "content": [{"type": "text", "text": "18 C and sunny"}]},
]})
second_text = ""
with client.messages.stream(
    model=MODEL, max_tokens=16, extra_body={"temperature": 0}, system=SYSTEM, tools=TOOLS, messages=history,
) as stream:
    for text in stream.text_stream:
        second_text += text
    second = stream.get_final_message()
assert second_text == "".join(b.text for b in second.content if b.type == "text"), second
history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]})
history.append({"role": "user", "content": "Thanks. And tomorrow?"})
third = client.messages.create(
    model=MODEL, max_tokens=8, extra_body={"temperature": 0}, system=SYSTEM, tools=TOOLS, messages=history,
)
print("ok tool_session")

# The first call's prompt, counted by the engine's tokenizer.
counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=history[:1])
assert counted.input_tokens > 0, counted
print("ok count_tokens")

try:
    client.messages.create(model=MODEL, max_tokens=100000, messages=[{"role": "user", "content": "x"}])
    raise AssertionError("max_tokens past the context was accepted")
except anthropic.BadRequestError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
print("ok engine_error")

try:
    client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    raise AssertionError("a document block was accepted")
except anthropic.BadRequestError as e:
    assert "messages.0.content.0.type" in e.body["error"]["message"], e.body
print("ok sidecar_error")

try:
    anthropic.Anthropic(max_retries=0, api_key="sk-nobody").messages.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    raise AssertionError("an unknown key was served")
except anthropic.AuthenticationError as e:
    assert e.body["error"]["type"] == "authentication_error", e.body
print("ok unknown_key")

print("session " + json.dumps({
    "tool_use_id": call.id,
    "counted": counted.input_tokens,
    "texts": ["".join(b.text for b in m.content if b.type == "text") for m in (first, second, third)],
    "stop_reasons": [first.stop_reason, second.stop_reason, third.stop_reason],
}))
