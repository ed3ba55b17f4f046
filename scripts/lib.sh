# Shared by scripts/run and scripts/test: idempotent installs of what clawback needs.
# Everything cached lives under $CLAWBACK_CACHE (default ~/.cache/clawback), outside the clone.

CLAWBACK_CACHE="${CLAWBACK_CACHE:-$HOME/.cache/clawback}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CLAWBACK_CACHE ROOT

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

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
    if ! "$venv/bin/python" -c 'import openai' >/dev/null 2>&1; then
        say "installing the OpenAI Python SDK into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --upgrade pip >/dev/null
        "$venv/bin/pip" install -q 'openai>=1.99'
    fi
    export CLAWBACK_SDK_PYTHON="$venv/bin/python"
    if [ ! -d "$ROOT/tests/sdk/node/node_modules/openai" ]; then
        say "installing the OpenAI Node SDK (npm ci)"
        (cd "$ROOT/tests/sdk/node" && npm ci --no-audit --no-fund --loglevel=error)
    fi
}

# The filter plugins (wasm-plugins/, its own workspace) built as wasm32-wasip2 components: the
# host's tests load them from wasm-plugins/target/wasm32-wasip2/release/.
ensure_wasm_plugins() {
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
        say "adding the wasm32-wasip2 target (rustup target add wasm32-wasip2)"
        rustup target add wasm32-wasip2
    fi
    say "building the filter plugins (wasm-plugins, wasm32-wasip2, release)"
    (cd "$ROOT/wasm-plugins" && cargo build --release --target wasm32-wasip2 --locked)
}
