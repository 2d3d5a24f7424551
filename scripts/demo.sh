#!/usr/bin/env bash
# The main job on the embedded default (no Kafka): set-up, then `runwatch demo`.
# Extra arguments go to `runwatch demo` (e.g. --out DIR, --kafka).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bash scripts/setup.sh >&2
venv="${RUNWATCH_VENV:-$HOME/.cache/runwatch/venv}"
exec "$venv/bin/runwatch" demo "$@"
