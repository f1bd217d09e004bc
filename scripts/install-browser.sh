#!/usr/bin/env bash
# Debian's Chromium for the spawn-page tests (a browser download by a test tool cannot
# work here: only package registries are reachable). Needs root or passwordless sudo.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  SUDO="sudo -n"
fi
echo "Installing Debian's chromium for the browser tests ..."
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
