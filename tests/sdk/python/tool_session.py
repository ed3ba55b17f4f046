"""A tool-using agent on the official OpenAI Python SDK: one three-turn session, no session id
anywhere — what an agent framework's tool loop sends.

Turn 1 asks and must call a tool, turn 2 (streamed) brings the tool's result and must call
another, turn 3 brings that result and answers. Reads OPENAI_BASE_URL / OPENAI_API_KEY like any
agent and CLAWBACK_MODEL for the model; prints `ok <case>` per turn and, last, `session <json>`
with what the agent added after each reply (the tool messages), for the test to compare with the
recorded next states.
"""
import json
import os

from openai import OpenAI

MODEL = os.environ.get("CLAWBACK_MODEL", "mock-llama")
# One small tool: the tiny test model's context is 1024 byte-level tokens, and a rendered tool
# schema takes a good part of it.
TOOLS = [
    {"type": "function", "function": {
        "name": "weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                       "required": ["city"]}}},
]
RESULTS = {"weather": "18 C"}

client = OpenAI(max_retries=0, timeout=120)
messages = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
]
added = []


def tool_results(calls):
    """The tool messages for `calls`, as the agent's tool runner would write them."""
    return [{"role": "tool", "tool_call_id": call["id"],
             "content": RESULTS.get(call["function"]["name"], "unknown tool")} for call in calls]


def as_message(calls, content):
    return {"role": "assistant", "content": content, "tool_calls": calls}


# Turn 1: a plain call that must use a tool.
# A forced call is JSON the engine's guided decoding completes: room for it, bounded strings.
first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                       tool_choice="required", max_tokens=200, temperature=0)
calls = [c.model_dump(exclude_none=True) for c in first.choices[0].message.tool_calls]
assert calls, first
messages.append(as_message(calls, first.choices[0].message.content))
results = tool_results(calls)
messages.extend(results)
added.append(results)
print("ok turn_1")

# Turn 2: streamed, must use a tool again; the calls are put together from the deltas.
stream = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                        tool_choice="required", max_tokens=200, temperature=0,
                                        stream=True)
by_index, content = {}, ""
for chunk in stream:
    for choice in chunk.choices:
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = by_index.setdefault(delta.index, {"id": None, "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
            call["id"] = delta.id or call["id"]
            if delta.function:
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
calls = [by_index[i] for i in sorted(by_index)]
assert calls and all(c["id"] for c in calls), by_index
messages.append(as_message(calls, content or None))
results = tool_results(calls)
messages.extend(results)
added.append(results)
print("ok turn_2")

# Turn 3: the answer.
last = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                      tool_choice="none", max_tokens=24, temperature=0)
assert last.choices[0].finish_reason in ("stop", "length"), last
print("ok turn_3")

print("session " + json.dumps({"added": added}))
