#!/usr/bin/env bash
# Install promtool (Debian package `prometheus`) so CI can run `promtool check rules` and
# `promtool test rules` on deploy/prometheus/*.yml. Idempotent: does nothing when promtool
# already answers. `apt-get update` runs only when the package is missing. The Prometheus
# server the package also installs is not started (policy-rc.d denies service starts here).
#
# Exit status: 0 when promtool works afterwards, 1 otherwise (with the reason printed), so a
# CI setup step fails loudly instead of letting the promtool tests skip silently.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  echo "setup-prometheus: $(promtool --version 2>&1 | head -1)"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

echo "setup-prometheus: installing Debian package 'prometheus' (brings promtool)"
# Never start the daemon as a side effect of the install (no init system on CI boxes).
had_policy=0
if [[ -e /usr/sbin/policy-rc.d ]]; then had_policy=1; fi
if [[ $had_policy -eq 0 ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
fi
cleanup() { if [[ $had_policy -eq 0 ]]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus

if ! command -v promtool >/dev/null 2>&1; then
  echo "setup-prometheus: promtool still not on PATH after installing 'prometheus'" >&2
  exit 1
fi
echo "setup-prometheus: $(promtool --version 2>&1 | head -1)"
