# Sourced by scripts/test.sh and scripts/legacy-clients.sh (from the
# repository's root): installs Debian packages, as root or through sudo.
#
#   apt_install <what> <package>...
#
# Says what it installs on stderr; exits 1 with the apt-get command to run
# when it is neither root nor has sudo.
apt_install() {
  local what=$1
  shift
  echo "installing missing $what: $*" >&2
  local sudo
  if [[ $(id -u) -eq 0 ]]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "error: need root (or sudo) to run: apt-get install -y $*" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  # Debian's policy here starts no services on install; the tests start
  # their own servers anyway.
  "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null
}
