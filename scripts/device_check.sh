#!/usr/bin/env bash
# The checks that need a GPU, for a machine that has one (never CI: CI has no GPU and
# skips tests/integration/test_trainer_cuda.py).
#
#   bash scripts/device_check.sh            # results under $OUT (default /tmp/device-check)
#
# Assumes the machine's python3 holds torch with CUDA and transformers (a GPU image);
# what it lacks of ours travels as wheels in .whl/ (pydantic, pydantic-core,
# annotated-types, typing-inspection, msgspec for Python 3.12, downloaded with
# `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`). No Kafka, no
# vLLM: the trainer runs the torch sampler on the GPU, events go to the embedded log.
#
# 1. tests/integration/test_trainer_cuda.py: kill -9 + bitwise resume on CUDA, GPU
#    billing, a GPU checkpoint read with CUDA hidden; tests/integration/test_hooks_cuda.py:
#    a multi-process run's verdict broadcast on NCCL (a CUDA tensor);
# 2. benchmarks/trainer_bench.py on cuda, then on cpu, same machine (the ratio is the
#    figure; absolute rates move between machines): the test config (84k parameters),
#    then its steps alone at hidden 512 x 4 layers (5.0M parameters).
# Every step runs even if one before it failed; the exit status is the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/runwatch-site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/runwatch-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
step() {  # step NAME SECONDS CMD...: run, keep its output in $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  [ "$rc" -ne 0 ] && [ "$status" -eq 0 ] && status=$rc
  return 0
}
nvidia-smi -L
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
transformers.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
step cuda_tests 300 "$PY" -m pytest -q -p no:cacheprovider -rs tests/integration/test_trainer_cuda.py \
  tests/integration/test_hooks_cuda.py
step bench_cuda 240 "$PY" benchmarks/trainer_bench.py --device cuda --reps 20 --json
step bench_cpu 240 "$PY" benchmarks/trainer_bench.py --device cpu --reps 20 --json
big=(--only steps --hidden 512 --heads 8 --layers 4 --json)
step bench_cuda_big 180 "$PY" benchmarks/trainer_bench.py --device cuda --steps 10 "${big[@]}"
step bench_cpu_big 240 "$PY" benchmarks/trainer_bench.py --device cpu --steps 6 "${big[@]}"
exit "$status"
