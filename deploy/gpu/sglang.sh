#!/usr/bin/env bash
# SGLang as clawback's backend on a GPU host, with dynamic LoRA: /load_lora_adapter and
# /unload_lora_adapter take each tenant's new adapter from ADAPTERS (trainer-sglang.toml writes
# it there). Without --lora-paths, SGLang must be told the largest rank and the target modules up
# front. Full-weight publishing (`mode = { kind = "full_weights" }`) uses
# /update_weights_from_disk instead and needs none of the LoRA flags.
#   MODEL=Qwen/Qwen3-8B deploy/gpu/sglang.sh
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen3-8B}"
exec python -m sglang.launch_server \
    --model-path "$MODEL" \
    --host 0.0.0.0 --port 30000 \
    --enable-lora \
    --max-lora-rank 64 \
    --lora-target-modules all \
    --max-loras-per-batch 8 \
    --max-loaded-loras 32
