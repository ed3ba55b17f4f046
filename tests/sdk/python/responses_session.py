"""The official OpenAI Python SDK keeping a Responses session server-side: each call sends only
its new items and `previous_response_id`, as the SDK's stateful agents do.

Reads OPENAI_BASE_URL / OPENAI_API_KEY, CLAWBACK_MODEL, and OTHER_API_KEY (another tenant's
key); prints `ok <case>` per check and, last, `session {...}` with the response ids and texts.
"""
import json
import os

import openai
from openai import OpenAI

MODEL = os.environ["CLAWBACK_MODEL"]
INSTRUCTIONS = "You are a weather agent."

client = OpenAI(max_retries=0, timeout=120)

first = client.responses.create(
    model=MODEL, instructions=INSTRUCTIONS, input="What's the weather in Paris?",
    max_output_tokens=16, temperature=0,
)
second = client.responses.create(
    model=MODEL, instructions=INSTRUCTIONS, previous_response_id=first.id,
    input=[{"role": "user", "content": "And in Rome?"}], max_output_tokens=16, temperature=0,
)
print("ok previous_response_id")

texts = ""
final = None
for event in client.responses.create(
    model=MODEL, instructions=INSTRUCTIONS, previous_response_id=second.id,
    input="Thanks. And tomorrow?", max_output_tokens=8, temperature=0, stream=True,
):
    if event.type == "response.output_text.delta":
        texts += event.delta
    if event.type == "response.completed":
        final = event.response
assert final is not None and final.output_text == texts, (final, texts)
print("ok previous_response_id_stream")

other = OpenAI(max_retries=0, timeout=120, api_key=os.environ["OTHER_API_KEY"])
try:
    other.responses.create(model=MODEL, previous_response_id=first.id, input="What did I ask?",
                           max_output_tokens=8)
    raise AssertionError("another tenant continued this tenant's session")
except openai.NotFoundError as e:
    assert e.body["code"] == "previous_response_not_found", e.body
try:
    other.responses.retrieve(first.id)
    raise AssertionError("another tenant read this tenant's response")
except openai.NotFoundError as e:
    assert e.body["code"] == "response_not_found", e.body
print("ok other_tenant_refused")

print("session " + json.dumps({
    "ids": [first.id, second.id, final.id],
    "texts": [first.output_text, second.output_text, final.output_text],
}))
