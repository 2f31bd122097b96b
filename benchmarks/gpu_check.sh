#!/usr/bin/env bash
# One prepared check for the GPU machine (H200 image: Python 3.12, jax 0.11.2, flax,
# optax, chex, orbax preinstalled; no network). Under 6 minutes; JSON/markdown under $OUT.
#
#   From the device tool, with the missing wheels carried in .whl (see below):
#     bash benchmarks/gpu_check.sh
#   Locally, tiny sizes, to check the script itself:
#     GPU_CHECK_SMOKE=1 OUT=/tmp/gpu_check bash benchmarks/gpu_check.sh
#
# Wheels the image lacks (ml-collections and tensorboardX; its package list, in the device
# tool's KINDS.md, has the rest) travel in .whl/ (ignored by git; fetched here with
# `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# -d .whl ml-collections==1.1.0 tensorboardX==2.6.5`, the versions of our venv); they are
# installed into /tmp/site without touching the image's jax.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
} 2>&1 | tee "$OUT/machine.txt"

if [ -n "${GPU_CHECK_SMOKE:-}" ]; then
  TEST_PLATFORMS=cpu
  LENGTHS=256,1024; SOFTMAX_MAX=1024; CHUNK=256; REPEATS=1
  PA_ARGS="--n=64,256 --num_features=64 --lengths=32 --repeats=1"
  TESTS="tests/test_attention.py tests/test_pallas_attention.py"
  # The smoke checks the script, not its budget: a loaded CPU core is far slower.
  T_TEST=900; T_ATTENTION=900; T_PHASE_A=300; XDIST=""
else
  # Softmax stops at 16k: XLA's dot_product_attention materialises B·H·L² logits
  # (128 GiB in f32 at 64k) unless the cuDNN path is taken.
  # tests/conftest.py defaults to CPU: ask for the GPU (the 8-fake-device tests pin CPU).
  TEST_PLATFORMS=cuda,cpu
  # The target lengths first: rows stream out as they finish, so a timeout cuts
  # the short lengths, not 64k and 256k.
  LENGTHS=65536,262144,16384,4096,1024; SOFTMAX_MAX=16384; CHUNK=4096; REPEATS=5
  PA_ARGS="--repeats=3 --n=64,1024 --num_features=256"
  TESTS="tests/test_attention.py tests/test_pallas_attention.py tests/test_models.py tests/test_training.py tests/test_langevin.py"
  # Timeouts sum to 330 s, inside the 6-minute budget with the start-up. Four pytest
  # workers share the GPU (compilation is most of the tests' time; 16 cores there).
  T_TEST=120; T_ATTENTION=150; T_PHASE_A=60; XDIST="-n 4"
fi

status=0
# 1. The numerics on the GPU backend (data-dependent tests skip: ../shared does not travel).
JAX_PLATFORMS=$TEST_PLATFORMS $PY -c "import jax; print('tests run on', jax.devices())" \
    2>&1 | tee "$OUT/pytest_backend.txt"
# No test process may take 75% of the GPU's memory up front (they run side by side).
XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_PLATFORMS=$TEST_PLATFORMS timeout $T_TEST \
    $PY -m pytest -q -x -p no:cacheprovider $XDIST $TESTS 2>&1 | tee "$OUT/pytest.txt" \
    || status=1
# 2. Kernel attention vs XLA/cuDNN softmax attention in bf16 (the setting), fused vs
#    materialized; rows also stream to $OUT/attention_rows.jsonl in case of the timeout.
timeout $T_ATTENTION $PY -m benchmarks.attention --out="$OUT" --lengths=$LENGTHS \
    --softmax_max_len=$SOFTMAX_MAX --chunk_size=$CHUNK --repeats=$REPEATS \
    --dtypes=bfloat16 --feature_maps=favor,softmaxfeat --impls=materialized,fused,pallas,softmax 2>&1 | tail -n 30 || status=1
# 3. Phase A cost against Phase B.
timeout $T_PHASE_A $PY -m benchmarks.phase_a --out="$OUT" $PA_ARGS 2>&1 | tail -n 20 || status=1
ls -l "$OUT"
exit $status
