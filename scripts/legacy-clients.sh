#!/usr/bin/env bash
# Installs the other libraries' clients that the interop tests run as
# processes (lock-zk/tests/kazoo.rs runs kazoo's Lock; the Redis interop
# tests may use redis-py): Debian's python3 and python3-venv when missing,
# then a virtualenv with pinned kazoo and redis. Idempotent: a second run
# with the same pins changes nothing. Prints the virtualenv's python path
# (the value of DISTLOCK_LEGACY_PYTHON the tests read) as its last line.
#
#   DISTLOCK_LEGACY_DIR  where the virtualenv goes
#                        (default: target/legacy-clients, the venv is its venv/)
set -euo pipefail
cd "$(dirname "$0")/.."

# The versions the interop tests were run with.
KAZOO_VERSION=2.11.0
REDIS_PY_VERSION=8.1.0

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
if ((${#missing[@]})); then
  echo "installing missing packages: ${missing[*]}" >&2
  if [[ $(id -u) -eq 0 ]]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "error: need root (or sudo) to run: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
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
if ! have kazoo "$KAZOO_VERSION" || ! have redis "$REDIS_PY_VERSION"; then
  "$python" -m pip install --quiet "kazoo==$KAZOO_VERSION" "redis==$REDIS_PY_VERSION" >&2
fi
"$python" -c 'import kazoo.recipe.lock, redis' >&2

# An absolute path, so the tests can be run from any directory.
(cd "$(dirname "$python")" && echo "$PWD/$(basename "$python")")
