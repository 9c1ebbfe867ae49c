#!/usr/bin/env bash
# The whole test suite: installs the servers it needs (Debian packages) if
# they are missing, then runs every test of the workspace. The tests start
# their own servers on free loopback ports in temporary directories; no
# system service is used.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt-install.sh
source scripts/apt-install.sh

# In CI the build is made once: incremental state would only take disk.
if [[ ${CI:-} == true ]]; then
  export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# The whole run builds every test binary first, before this script installs
# anything: the build must need nothing it installs, since the README's
# main job builds the same crates on a machine where this script never ran.
# On a fresh machine a build that needed, say, protobuf-compiler fails here
# as it would there.
if ((!$#)); then
  cargo test --workspace --no-run --message-format=json-render-diagnostics >"$logs/build.json"
  built=$SECONDS
fi

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
  # lock-sql/tests/pgbouncer.rs runs the pooler in front of PostgreSQL.
  "/usr/sbin/pgbouncer:pgbouncer"
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
  # distlock-cli/tests/metrics.rs scrapes the metrics endpoint with curl.
  "curl:curl"
  # Real partitions (lock-testkit's netns): namespaces, veth, bridge, tc.
  "ip:iproute2"
  "tc:iproute2"
  # distlock-cli/tests/supervision.rs runs distlock on a pseudo-terminal.
  "script:bsdutils"
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
  apt_install "server packages" "${missing[@]}"
fi

# The other libraries' clients the interop tests run (kazoo, redis-py), in
# a virtualenv under target/; its python, as an absolute path (tests run
# from their package's directory).
legacy_python=$(bash scripts/legacy-clients.sh | tail -n 1)
[[ $legacy_python == /* ]] || legacy_python="$PWD/$legacy_python"
export DISTLOCK_LEGACY_PYTHON="$legacy_python"

# A missing server binary fails the tests instead of skipping them.
export CI="${CI:-true}"

# With arguments, one plain run (for example `scripts/test.sh -p lock-zk`).
if (($#)); then
  exec cargo test --workspace --no-fail-fast "$@"
fi

# Build every test binary once, then run them three at a time: most of
# the run is tests waiting on servers and TTLs (a load average near 1 on
# two cores), so a third runner shortens it by a third. Two runners take
# jobs from the head of the list (the slow ones first), the third from its
# tail (the quick ones), so that at most two slow jobs, whose cases time
# themselves, run at once until the lists meet. Each binary runs from its
# package's directory, as cargo runs it; its output is printed whole when
# it ends. The doc tests are one more job. Every job runs; the exit status
# says whether all passed.
# "<package dir> <test binary>" per test target; the slow ones first.
# (Test targets only: `"test":true` in the profile; the binaries and
# examples the tests run are built too, but are not tests.)
grep '"profile":{[^}]*"test":true' "$logs/build.json" | grep '"executable":"/' |
  sed -E 's/.*"manifest_path":"([^"]*)\/Cargo.toml".*"executable":"([^"]*)".*/\1 \2/' |
  awk '{ slow = ($2 ~ /\/(scenarios|conformance|etcd|soak|ensemble|migration_rollout|behaviour|security|shedlock|round_trips|legacy|pgbouncer|session_postgres|session_mariadb|postgres|mariadb)-/) ? 0 : 1; print slow, $0 }' |
  sort -s -k1,1n | cut -d' ' -f2- >"$logs/jobs"
echo "doc -" >>"$logs/jobs"
total=$(wc -l <"$logs/jobs")
# The next job from the head and from the tail (0-based, inclusive).
echo "0 $((total - 1))" >"$logs/next"
worker() {
  local end=$1 n dir exe out rc started
  while true; do
    n=$(flock "$logs/next" sh -c '
      read -r head tail <"$1"
      if [ "$head" -gt "$tail" ]; then echo -1; exit; fi
      if [ "$2" = head ]; then echo "$((head + 1)) $tail" >"$1"; echo "$head"
      else echo "$head $((tail - 1))" >"$1"; echo "$tail"; fi' _ "$logs/next" "$end")
    ((n >= 0)) || return 0
    read -r dir exe < <(sed -n "$((n + 1))p" "$logs/jobs")
    out="$logs/out.$n"
    started=$SECONDS
    if [[ $dir == doc ]]; then
      cargo test --workspace --doc >"$out" 2>&1 && rc=0 || rc=$?
      exe="doc tests"
    else
      (cd "$dir" && "$exe") >"$out" 2>&1 && rc=0 || rc=$?
    fi
    {
      echo "=== ${exe#"$PWD"/} ($dir): exit $rc, $((SECONDS - started)) s"
      cat "$out"
    } | flock "$logs/print" cat
    ((rc == 0)) || echo "${exe#"$PWD"/} ($dir)" >>"$logs/failed"
  done
}
worker head &
worker head &
worker tail &
wait
if [[ -s $logs/failed ]]; then
  echo "FAILED test binaries (setup and build $built s, tests $((SECONDS - built)) s):"
  cat "$logs/failed"
  exit 1
fi
echo "all $total test jobs passed (setup and build $built s, tests $((SECONDS - built)) s)"
