#!/usr/bin/env bash
# Makes sure the programs some tests run are installed: node and npm (tests/test_proxy_node.py
# runs the official openai npm package against the memory proxy) and curl
# (tests/test_proxy.py). Those tests fail, not skip, without them. Called by .ci/run; safe
# to run again. Installs Debian's packages for what is missing.
set -euo pipefail

log() { printf 'tools.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

declare -A PACKAGE=([node]=nodejs [npm]=npm [curl]=curl)
missing=()
for tool in node npm curl; do
    command -v "$tool" >/dev/null || missing+=("${PACKAGE[$tool]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "not root and no sudo: cannot install ${missing[*]}"
        SUDO="sudo"
    fi
    log "installing ${missing[*]} (apt-get install)"
    $SUDO apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >&2
fi
for tool in node npm curl; do
    command -v "$tool" >/dev/null || die "$tool is still not installed"
done
log "node $(node --version), npm $(npm --version), $(curl --version | head -n 1)"
