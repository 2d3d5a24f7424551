#!/usr/bin/env bash
# Install Debian's Chromium and ChromeDriver for the dashboard's browser test
# (tests/integration/test_dashboard_browser.py drives /usr/bin/chromium through
# /usr/bin/chromedriver with Selenium). No browser is ever downloaded by a test tool: the
# machine only reaches package registries. Idempotent: does nothing when both binaries
# answer; `apt-get update` runs only when a package is missing. Also makes sure the
# project's virtualenv ($RUNWATCH_VENV, default ~/.cache/runwatch/venv) has selenium, in
# case the installed dependency set predates it.
#
# Exit status: 0 when chromium and chromedriver work afterwards, 1 otherwise (reason
# printed), so a CI setup step fails loudly instead of letting the browser test skip.
set -euo pipefail

have() {
  command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}

report() {
  echo "setup-browser: $(chromium --version 2>/dev/null | head -1); $(chromedriver --version 2>/dev/null | head -1)"
}

ensure_selenium() {
  local venv="${RUNWATCH_VENV:-$HOME/.cache/runwatch/venv}"
  if [[ -x "$venv/bin/python" ]] && ! "$venv/bin/python" -c "import selenium" 2>/dev/null; then
    echo "setup-browser: installing selenium into $venv"
    "$venv/bin/pip" install -q "selenium>=4.20"
  fi
}

if have; then
  ensure_selenium
  report
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

echo "setup-browser: installing Debian packages 'chromium' and 'chromium-driver'"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  chromium chromium-driver fonts-dejavu-core >/dev/null

if ! have; then
  echo "setup-browser: chromium/chromedriver still not on PATH after the install" >&2
  exit 1
fi
ensure_selenium
report
