#!/usr/bin/env bash
# Install the Prometheus tooling the tests and the operator stack use, from Debian:
#   - package `prometheus`: promtool (`promtool check rules`, `promtool test rules` on
#     deploy/prometheus/*.yml) and the Prometheus server the integration tests start;
#   - package `prometheus-alertmanager`: the Alertmanager server (Debian names the binary
#     `prometheus-alertmanager`) and amtool (`amtool check-config` on
#     deploy/alertmanager/alertmanager.yml; the real Alertmanager the alert-delivery test
#     starts).
# Idempotent: does nothing when promtool and amtool already answer; `apt-get update` runs
# only when a package is missing. The daemons the packages install are not started
# (policy-rc.d denies service starts here).
#
# Exit status: 0 when promtool, prometheus, alertmanager and amtool work afterwards, 1
# otherwise (with the reason printed), so a CI setup step fails loudly instead of letting
# the tests skip silently.
set -euo pipefail

# binary -> the Debian package that ships it
# (the upstream tarball's `alertmanager` is accepted too)
declare -A PACKAGE_OF=(
  [promtool]=prometheus
  [prometheus]=prometheus
  [prometheus-alertmanager]=prometheus-alertmanager
  [amtool]=prometheus-alertmanager
)

have() {
  command -v "$1" >/dev/null 2>&1 || { [[ $1 == prometheus-alertmanager ]] && command -v alertmanager >/dev/null 2>&1; }
}

missing_packages() {
  local bin pkgs=()
  for bin in promtool prometheus prometheus-alertmanager amtool; do
    if ! have "$bin"; then pkgs+=("${PACKAGE_OF[$bin]}"); fi
  done
  if [[ ${#pkgs[@]} -gt 0 ]]; then printf '%s\n' "${pkgs[@]}" | sort -u | paste -sd' '; fi
}

report() {
  local am
  am=$(command -v prometheus-alertmanager || command -v alertmanager)
  echo "setup-prometheus: $(promtool --version 2>&1 | head -1)"
  echo "setup-prometheus: $("$am" --version 2>&1 | head -1)"
}

todo=$(missing_packages)
if [[ -z $todo ]]; then
  report
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

echo "setup-prometheus: installing Debian package(s): $todo"
# Never start a daemon as a side effect of the install (no init system on CI boxes).
had_policy=0
if [[ -e /usr/sbin/policy-rc.d ]]; then had_policy=1; fi
if [[ $had_policy -eq 0 ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
fi
cleanup() { if [[ $had_policy -eq 0 ]]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

$SUDO apt-get update -qq
# shellcheck disable=SC2086  # $todo is a list of package names
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $todo

still=$(missing_packages)
if [[ -n $still ]]; then
  echo "setup-prometheus: still missing after the install: $still" >&2
  exit 1
fi
report
