"""A rollout shaped like Claw-R1's black-box GSM8K agent flow, against the clawback sidecar.

As `BlackBoxAgentFlowBase.run` does: POST {gateway}/init_trajectory, replace the default
prompt_uid in the returned base_url with the task's id, POST {base_url}/register_trajectory with
the channel and the dataset's metadata, let the agent (the official OpenAI SDK, tools offered)
take turns until it stops calling tools, then POST {base_url}/complete_trajectory with the
reward. Prints `ok <trajectory_uid>`; any mismatch raises.

Environment: CLAW_GATEWAY (the sidecar's root URL), CLAW_TASK (the prompt_uid), CLAW_REWARD,
CLAW_CHANNEL (`train`, or `val` for a validation rollout; default `train`), OPENAI_API_KEY.
"""
import json
import os
import urllib.request

from openai import OpenAI

CHECK_ANSWER_TOOL = {
    "type": "function",
    "function": {
        "name": "check_answer",
        "description": "Check if your answer to the math problem is correct.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    },
}

gateway = os.environ["CLAW_GATEWAY"].rstrip("/")
task = os.environ["CLAW_TASK"]
reward = float(os.environ["CLAW_REWARD"])
key = os.environ["OPENAI_API_KEY"]


def post(url, body=None):
    """POST a JSON body (none: an empty one, as Claw-R1's init sends), the answer's JSON."""
    data = b"" if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "authorization": f"Bearer {key}", "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


channel = os.environ.get("CLAW_CHANNEL", "train")
data = post(f"{gateway}/init_trajectory")
uid = data["trajectory_uid"]
# base_url is http://host:port/{uid}/{default_prompt_uid}/v1: put the task's id in.
parts = data["base_url"].rsplit("/", 2)
assert parts[2] == "v1", data
base_url = f"{parts[0]}/{task}/v1"
registered = post(f"{base_url}/register_trajectory",
                  {"channel": channel,
                   "metadata": {"data_source": "gsm8k", "reward_model": {"ground_truth": "72"}}})
assert registered == {"status": "ok"}, registered

client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)
messages = [{"role": "user", "content": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?"}]
turns = 0
for _ in range(3):
    turns += 1
    reply = client.chat.completions.create(model="mock-llama", messages=messages, tools=[CHECK_ANSWER_TOOL])
    message = reply.choices[0].message
    if not message.tool_calls:
        messages.append({"role": "assistant", "content": message.content})
        break
    messages.append({"role": "assistant", "content": message.content,
                     "tool_calls": [c.model_dump() for c in message.tool_calls]})
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "Correct! Your answer is right."})
assert turns == 2, turns

done = post(f"{base_url}/complete_trajectory", {"reward": reward, "channel": channel})
assert done == {"status": "ok"}, done

print(f"ok {uid}")
