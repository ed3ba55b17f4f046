"""Reference outputs from transformers and peft for the trainer's parity tests.

Nothing is downloaded: every model, tokenizer and adapter is created here, at random, and
written into the output folder that the Rust test hands us.

    python fixtures.py models OUT      tiny Llama / Qwen2 / Qwen3 checkpoints + reference logits,
                                       a PEFT-made adapter + its logits, a trained BPE tokenizer
                                       with Qwen chat templates + rendered tool conversations
    python fixtures.py lora JOBS.json  logits of transformers models with adapters that the
                                       Rust side saved, loaded through PeftModel.from_pretrained
"""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

torch.set_num_threads(1)

# The vocabulary is large enough for the tokenizer trained below (about 410 tokens), so a
# model folder + tokenizer folder make a working chat model for the CLI test.
COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_specs():
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    return {
        # Llama 3.1-style rope scaling, biases on every attention projection, separate
        # lm_head, and a sharded checkpoint so the index path is read.
        "llama": (
            LlamaForCausalLM,
            LlamaConfig(
                **COMMON,
                rope_theta=10000.0,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                attention_bias=True,
                tie_word_embeddings=False,
            ),
            "30KB",
        ),
        # q/k/v biases, tied embeddings, linear rope scaling.
        "qwen2": (
            Qwen2ForCausalLM,
            Qwen2Config(
                **COMMON,
                rope_theta=1000000.0,
                rope_scaling={"rope_type": "linear", "factor": 2.0},
                tie_word_embeddings=True,
            ),
            None,
        ),
        # q_norm/k_norm and a head_dim that is not hidden / heads.
        "qwen3": (
            Qwen3ForCausalLM,
            Qwen3Config(**COMMON, head_dim=32, rope_theta=1000000.0, tie_word_embeddings=False),
            None,
        ),
    }


def randomize(model, seed):
    """Every parameter random, norms around 1 and biases non-zero: the initialiser's zeros and
    ones would hide a missing bias or norm weight."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.15 * noise)


def reference_ids():
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, COMMON["vocab_size"], (2, 13), generator=g)


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def make_models(out):
    ids = reference_ids()
    for i, (name, (cls, config, shard)) in enumerate(model_specs().items()):
        torch.manual_seed(i)
        model = cls(config).float().eval()
        randomize(model, seed=100 + i)
        folder = os.path.join(out, name)
        if shard:
            model.save_pretrained(folder, max_shard_size=shard)
        else:
            model.save_pretrained(folder)
        prompt = ids[:1, :6]
        greedy = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=10,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        save_file(
            {"input_ids": ids, "logits": logits_of(model, ids), "greedy": greedy[0].contiguous()},
            os.path.join(folder, "reference.safetensors"),
        )
        if name == "qwen3":
            make_peft_adapter(model, ids, out)


def make_peft_adapter(model, ids, out):
    """An adapter written by peft itself, for our loader; rsLoRA to exercise its scaling."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.1, target_modules=LORA_TARGETS, use_rslora=True
    )
    peft_model = get_peft_model(model, config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    peft_model.eval()
    folder = os.path.join(out, "qwen3-peft-adapter")
    peft_model.save_pretrained(folder)
    save_file(
        {"input_ids": ids, "logits": logits_of(peft_model, ids)},
        os.path.join(folder, "reference.safetensors"),
    )


# The Qwen2.5 chat template, tools included.
QWEN2_5_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# A Qwen3-style template: namespaces, reversed slices, Python string methods, reasoning.
QWEN3_STYLE_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    '    {{- "# Tools\\n\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools><|im_end|>\\n" }}\n'
    "{%- elif messages[0].role == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == 'user' and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n"
    "    {%- else %}\n"
    "        {%- set content = '' %}\n"
    "    {%- endif %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- elif '</think>' in content %}\n"
    "            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
)

# Qwen2's pre-tokenizer split (it needs look-ahead, so fancy-regex on the Rust side).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — in °C unless asked otherwise.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
                "threshold": {"type": "number", "default": 0.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Search the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "paths": {"type": "array", "items": {"type": "string"}}},
            "required": ["pattern"],
        },
    },
}


def conversations():
    tool_calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2, "threshold": 1.0}},
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "search_files", "arguments": {"pattern": "TODO<&>", "paths": ["src/", "tests/"]}},
        },
    ]
    return [
        (
            "system, tool call, tool result, answer, follow-up",
            [
                {"role": "system", "content": "You are a careful agent.\nUse tools when needed."},
                {"role": "user", "content": "What's the weather in Zürich? 😀"},
                {"role": "assistant", "content": "", "tool_calls": tool_calls[:1]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21.5, "sky": "clear"}'},
                {"role": "assistant", "content": "It is 21.5 °C and clear."},
                {"role": "user", "content": "And tomorrow?"},
            ],
            [WEATHER_TOOL, SEARCH_TOOL],
            True,
            {},
        ),
        (
            "two parallel tool calls with text, two tool results in a row",
            [
                {"role": "user", "content": "Check the weather and find TODOs."},
                {"role": "assistant", "content": "Let me look.", "tool_calls": tool_calls},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "src/main.rs:3: TODO"},
            ],
            [WEATHER_TOOL, SEARCH_TOOL],
            True,
            {},
        ),
        (
            "arguments as an OpenAI JSON string",
            [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "-3"},
            ],
            [WEATHER_TOOL],
            False,
            {},
        ),
        (
            "no tools, reasoning in the last assistant turn",
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
            ],
            None,
            False,
            {},
        ),
        (
            "thinking switched off through a template kwarg",
            [{"role": "user", "content": "Quick: capital of Norway?"}],
            None,
            True,
            {"enable_thinking": False},
        ),
    ]


def make_tokenizer(out):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "The weather in Zürich is sunny today, 21.5 °C.",
        "def main():\n    print('hello world')  # TODO: tests",
        "You are a helpful assistant. Use tools when needed.",
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
        "function calls, tool responses and system prompts",
    ] * 20
    tok.train_from_iterator(corpus, trainer)
    # Qwen's tool-call markers are added (non-special) tokens.
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ["<tool_call>", "</tool_call>", "<think>", "</think>"]])

    for name, template in [("tokenizer-qwen2.5", QWEN2_5_TEMPLATE), ("tokenizer-qwen3", QWEN3_STYLE_TEMPLATE)]:
        folder = os.path.join(out, name)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            model_max_length=32768,
        )
        fast.chat_template = template
        fast.save_pretrained(folder)
        move_template_into_config(folder, template)


def move_template_into_config(folder, template):
    """Real Qwen checkpoints keep the template inside tokenizer_config.json; newer transformers
    write chat_template.jinja instead. Put it where the released models have it."""
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(jinja):
        os.remove(jinja)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = template
    with open(path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)


def render_cases(out):
    from transformers import AutoTokenizer

    cases = []
    for folder in ["tokenizer-qwen2.5", "tokenizer-qwen3"]:
        tok = AutoTokenizer.from_pretrained(os.path.join(out, folder))
        for name, messages, tools, add_generation_prompt, kwargs in conversations():
            text = tok.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
            cases.append(
                {
                    "folder": folder,
                    "name": name,
                    "messages": messages,
                    "tools": tools,
                    "add_generation_prompt": add_generation_prompt,
                    "kwargs": kwargs,
                    "text": text,
                    "ids": ids,
                }
            )
    with open(os.path.join(out, "chat_cases.json"), "w") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)


def lora_logits(jobs_path):
    """Each job: {"model": dir, "adapter": dir, "out": file}; logits of the reference ids."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with open(jobs_path) as f:
        jobs = json.load(f)
    ids = reference_ids()
    for job in jobs:
        base = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32).eval()
        model = PeftModel.from_pretrained(base, job["adapter"]).eval()
        save_file({"input_ids": ids, "logits": logits_of(model, ids)}, job["out"])


def main():
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == "models":
        os.makedirs(arg, exist_ok=True)
        make_models(arg)
        make_tokenizer(arg)
        render_cases(arg)
    elif mode == "lora":
        lora_logits(arg)
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
