#!/usr/bin/env bash
# Makes sure the programs some tests run are installed: node and npm (tests/test_proxy_node.py
# runs the official openai npm package against the memory proxy), curl (tests/test_proxy.py)
# and Debian's chromium at /usr/bin/chromium (the browser tests drive it with Playwright;
# Playwright's own browser download is not used). Those tests fail, not skip, without them
# in CI. Called by .ci/run; safe to run again. Installs Debian's packages for what is missing.
set -euo pipefail

log() { printf 'tools.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CHROMIUM=/usr/bin/chromium
declare -A PACKAGE=([node]=nodejs [npm]=npm [curl]=curl)
missing=()
for tool in node npm curl; do
    command -v "$tool" >/dev/null || missing+=("${PACKAGE[$tool]}")
done
[ -x "$CHROMIUM" ] || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "not root and no sudo: cannot install ${missing[*]}"
        SUDO="sudo"
    fi
    log "installing ${missing[*]} (apt-get install)"
    start=$SECONDS
    $SUDO apt-get update -q >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >&2 \
        || die "apt-get install ${missing[*]} failed"
    log "installed ${missing[*]} in $((SECONDS - start)) s"
fi
for tool in node npm curl; do
    command -v "$tool" >/dev/null || die "$tool is still not installed"
done
[ -x "$CHROMIUM" ] || die "$CHROMIUM is still not installed (Debian package chromium)"
chromium_version="$("$CHROMIUM" --headless --no-sandbox --version 2>/dev/null)" \
    || die "$CHROMIUM is installed but does not run"
log "node $(node --version), npm $(npm --version), $(curl --version | head -n 1), $chromium_version"
