#!/usr/bin/env bash
# vLLM as clawback's backend on a GPU host: the base model plus runtime LoRA, so the trainer can
# load each tenant's new adapter (`<tenant>@v<N>`) while serving and unload the one it replaced.
# vLLM reads each adapter from the path the trainer names in the load call: give both the same
# folder (trainer-vllm.toml's adapter_root, /adapters) — one host, or a shared volume.
#   MODEL=Qwen/Qwen3-8B deploy/gpu/vllm.sh
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen3-8B}"
# /v1/load_lora_adapter and /v1/unload_lora_adapter exist only with this set.
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
# The logprobs vLLM returns (and the sidecar records) are those of the distribution each token was
# drawn from — after penalties, temperature, top-k/top-p — so the trainer's importance ratios
# describe the policy that sampled (trainer-vllm.toml: [sampler] logprobs = "processed").
exec vllm serve "$MODEL" \
    --host 0.0.0.0 --port 8000 \
    --logprobs-mode processed_logprobs \
    --enable-lora \
    --max-lora-rank 64 \
    --max-loras 8 \
    --max-cpu-loras 32
