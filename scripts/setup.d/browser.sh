#!/usr/bin/env bash
# Tests only: Debian's Chromium, driven headless over the DevTools protocol by tests/browser.py to check the listening
# page (maspo_verl/listening.py) as a listener's browser shows it. Run by scripts/setup.sh; idempotent.
set -euo pipefail
if ! command -v chromium >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
