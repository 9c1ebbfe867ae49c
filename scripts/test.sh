#!/usr/bin/env bash
# The whole test suite: installs the servers it needs (Debian packages) if
# they are missing, then runs every test of the workspace. The tests start
# their own servers on free loopback ports in temporary directories; no
# system service is used.
set -euo pipefail
cd "$(dirname "$0")/.."

# binary-or-file -> Debian package
checks=(
  "redis-server:redis-server"
  "redis-cli:redis-tools"
  "etcd:etcd-server"
  "etcdctl:etcd-client"
  "/usr/share/java/zookeeper.jar:zookeeper"
  "java:zookeeper"
  "mariadbd:mariadb-server"
  "mariadb-install-db:mariadb-server"
  "/usr/lib/postgresql/15/bin/postgres:postgresql"
  "protoc:protobuf-compiler"
  # The Curator interop tests (lock-zk/tests/curator.rs) compile a Java peer.
  "javac:default-jdk-headless"
  "/usr/share/java/curator-recipes.jar:libcurator-recipes-java"
  "/usr/share/java/curator-framework.jar:libcurator-framework-java"
  "/usr/share/java/curator-client.jar:libcurator-client-java"
  "/usr/share/java/zookeeper-jute.jar:libzookeeper-java"
  "/usr/share/java/guava.jar:libguava-java"
  "/usr/share/java/slf4j-nop.jar:libslf4j-java"
  "/usr/share/java/netty-handler.jar:libnetty-java"
  "/usr/share/java/metrics-core.jar:libdropwizard-metrics-java"
)
missing=()
for check in "${checks[@]}"; do
  thing=${check%%:*}
  package=${check#*:}
  if [[ $thing == /* ]]; then
    [[ -e $thing ]] && continue
  else
    PATH="$PATH:/usr/sbin:/sbin" command -v "$thing" >/dev/null 2>&1 && continue
  fi
  # PostgreSQL may be another major version.
  if [[ $package == postgresql ]] && compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
    continue
  fi
  [[ " ${missing[*]} " == *" $package "* ]] || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "installing missing server packages: ${missing[*]}"
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
  # Debian's policy here starts no services on install; the tests start
  # their own servers anyway.
  "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# A missing server binary fails the tests instead of skipping them.
export CI="${CI:-true}"

# With arguments, one plain run (for example `scripts/test.sh -p lock-zk`).
if (($#)); then
  exec cargo test --workspace --no-fail-fast "$@"
fi

# Build everything once, then run the tests in two streams at the same
# time: most of the run is tests waiting on servers and TTLs, so two
# streams nearly halve it on two cores. Each stream's lines are prefixed
# with its name; both streams always run to the end.
cargo test --workspace --no-run
first=(lock-etcd lock-zk lock-core lock-slowmem)
first_args=()
rest_args=(--workspace)
for package in "${first[@]}"; do
  first_args+=(-p "$package")
  rest_args+=(--exclude "$package")
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
( cargo test "${first_args[@]}" --no-fail-fast 2>&1; echo $? >"$logs/a.rc" ) | sed -u 's/^/[a] /' &
( cargo test "${rest_args[@]}" --no-fail-fast 2>&1; echo $? >"$logs/b.rc" ) | sed -u 's/^/[b] /' &
wait
a=$(cat "$logs/a.rc" 2>/dev/null || echo 1)
b=$(cat "$logs/b.rc" 2>/dev/null || echo 1)
echo "stream a (${first[*]}): exit $a; stream b (the rest of the workspace): exit $b"
((a == 0 && b == 0))
