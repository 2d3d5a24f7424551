#!/usr/bin/env bash
# The whole test suite, on a fresh machine: set-up, lint, then pytest. Integration tests
# provision their own real Kafka broker ($KAFKA_BOOTSTRAP_SERVERS if set, else a
# testcontainers broker if a Docker daemon answers, else a JVM KRaft broker from Maven
# Central jars); the run prints which one it used. Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bash scripts/setup.sh
venv="${RUNWATCH_VENV:-$HOME/.cache/runwatch/venv}"
export PATH="$venv/bin:$PATH"

echo "== ruff check"
ruff check .
echo "== pytest"
set +e
python -m pytest -ra "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no test: that is a failure, not a pass" >&2
  exit 1
fi
exit "$rc"
