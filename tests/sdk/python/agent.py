"""The official OpenAI Python SDK as an agent through the clawback sidecar.

Reads OPENAI_BASE_URL / OPENAI_API_KEY like any agent would and prints `ok <case>` per check;
any mismatch raises, so the process fails.
"""
import json

from openai import OpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}]
MESSAGES = [{"role": "user", "content": "What's the weather in Paris?"}]

client = OpenAI(max_retries=0, timeout=30)

chat = client.chat.completions.create(model="mock-llama", messages=[{"role": "user", "content": "Hi"}])
assert chat.choices[0].message.content.startswith("The weather"), chat
assert chat.usage.total_tokens > 0
print("ok chat")

stream = client.chat.completions.create(
    model="mock-llama", messages=MESSAGES, tools=TOOLS, tool_choice="auto",
    max_completion_tokens=256, stream=True, stream_options={"include_usage": True},
)
name, arguments, finish, usage = None, "", None, None
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    for choice in chunk.choices:
        for call in choice.delta.tool_calls or []:
            name = call.function.name or name
            arguments += call.function.arguments or ""
        finish = choice.finish_reason or finish
assert name == "get_weather", name
assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}, arguments
assert finish == "tool_calls" and usage is not None
print("ok chat_stream_tools")

completion = client.completions.create(model="mock-llama", prompt="Paris is", max_tokens=16)
assert completion.choices[0].text.startswith("The weather")
print("ok completions")

response = client.responses.create(model="mock-llama", input="Weather in Paris?")
assert response.output_text.startswith("The weather"), response
print("ok responses")

# Only the new item and the previous response's id: the sidecar keeps the conversation.
follow_up = client.responses.create(model="mock-llama", previous_response_id=response.id,
                                    input="And tomorrow?")
assert follow_up.output_text, follow_up
print("ok previous_response_id")

events = list(client.responses.create(model="mock-llama", input=MESSAGES, tools=[{
    "type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"],
}], stream=True))
assert events[-1].type == "response.completed", events[-1]
call = events[-1].response.output[0]
assert call.type == "function_call" and json.loads(call.arguments)["city"] == "Paris"
print("ok responses_stream")

models = client.models.list()
assert [m.id for m in models.data] == ["mock-llama"]
print("ok models")
