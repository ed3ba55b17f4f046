"""What transformers and peft say about the real model, for the trainer's real-model tests.

    python reference.py cases MODEL OUT      conversations rendered by apply_chat_template
                                             (text and ids), transformers' f32 logits over each,
                                             and an adapter written by peft with its logits
    python reference.py lora MODEL JOBS      each job {"adapter", "ids", "out"}: the logits of
                                             MODEL + the adapter through PeftModel.from_pretrained
                                             over the ids in the safetensors file "ids"

MODEL is the converted SmolLM2-135M-Instruct folder (scripts/smollm2.py). Nothing is
downloaded; everything runs in f32 on the CPU.
"""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

torch.set_num_threads(1)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Real conversations, each with the reply the model is scored on: what a user of the personal
# demo, an agent with its own system message and a hint-distillation teacher send.
CASES = [
    {
        "name": "one question",
        "messages": [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is Paris."},
        ],
    },
    {
        "name": "a system message and two turns",
        "messages": [
            {"role": "system", "content": "You are a concise assistant for a gardening shop."},
            {"role": "user", "content": "How do I care for a houseplant?"},
            {
                "role": "assistant",
                "content": "Water it when the top of the soil is dry and give it bright, "
                "indirect light.",
            },
            {"role": "user", "content": "No, please answer with a bulleted list."},
            {
                "role": "assistant",
                "content": "- Water when the soil is dry\n- Bright, indirect light\n"
                "- Feed it in spring",
            },
        ],
    },
    {
        "name": "a question with the hint appended",
        "messages": [
            {
                "role": "user",
                "content": "Why is the sky blue?\n\nAnswer in one short sentence.",
            },
            {
                "role": "assistant",
                "content": "Air scatters blue sunlight more than red, so the sky looks blue.",
            },
        ],
    },
]


def load_model(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def cases(folder, out):
    from transformers import AutoTokenizer

    os.makedirs(out, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = load_model(folder)
    written = []
    for i, case in enumerate(CASES):
        text = tokenizer.apply_chat_template(case["messages"], tokenize=False)
        prompt = tokenizer.apply_chat_template(
            case["messages"][:-1], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        save_file(
            {"input_ids": ids, "logits": logits_of(model, ids)},
            os.path.join(out, f"case-{i}.safetensors"),
        )
        written.append(
            {
                "name": case["name"],
                "messages": case["messages"],
                "text": text,
                "prompt": prompt,
                "ids": ids[0].tolist(),
            }
        )
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(written, f, indent=1, ensure_ascii=False)

    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS)
    )
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    peft_model.eval()
    adapter = os.path.join(out, "peft-adapter")
    peft_model.save_pretrained(adapter)
    ids = load_file(os.path.join(out, "case-1.safetensors"))["input_ids"]
    save_file({"input_ids": ids, "logits": logits_of(peft_model, ids)},
              os.path.join(adapter, "reference.safetensors"))


def lora(folder, jobs_path):
    from peft import PeftModel

    with open(jobs_path) as f:
        jobs = json.load(f)
    for job in jobs:
        model = PeftModel.from_pretrained(load_model(folder), job["adapter"]).eval()
        ids = load_file(job["ids"])["input_ids"]
        save_file({"input_ids": ids, "logits": logits_of(model, ids)}, job["out"])


def main():
    mode, folder, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "cases":
        cases(folder, arg)
    elif mode == "lora":
        lora(folder, arg)
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
