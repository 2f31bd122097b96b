#!/usr/bin/env bash
# The prepared check for a GPU machine (H200 image: Python 3.12, jax 0.11, flax, optax,
# chex, orbax preinstalled; no network; the copy of the tree there may carry a .git of
# another commit than its files, so every record takes COULOMB_JAX_COMMIT first).
# At most BUDGET_S = 470 s (under 8 minutes) by its own timeouts, most important first,
# every result written under $OUT as it finishes:
#
#   1. tests (170 s): the Pallas kernels compiled for the first time and checked against
#      XLA at precision='highest' (tests/library/test_pallas_attention.py: seven maps, both
#      kernels, logits up to ±60, bf16, padding, gradients), and the platform's choice of
#      kernel on a real GPU host (tests/library/test_lowering.py), on the GPU backend; one line per
#      test in $OUT/pytest.txt as it finishes.
#   2. attention (200 s): fwd and fwd+bwd, bf16, B=4 H=8 D=64 M=256, L = 64k, 256k,
#      16k, 4k, 1k (that order: a cut loses the short lengths): the Pallas kernels, the
#      chunked XLA path, cuDNN flash (jax.nn.dot_product_attention(implementation=
#      'cudnn')) and XLA softmax (implementation='xla', up to 16k: it materialises the
#      L × L logits); XLA temporary memory and the device's peak per row. One JSON row per
#      case in $OUT/attention_rows.jsonl as it finishes; attention.json/.md at the end.
#   3. phase_a (55 s): Phase A's cost against Phase B (rows on stdout, $OUT/phase_a.log).
#   Each step's exit code and seconds: $OUT/steps.tsv; machine and commit: machine.txt.
#
# The commit. On this (sending) side, print the exact command for the device tool:
#     bash benchmarks/gpu_check.sh --command
#   which runs `git rev-parse HEAD` here and prints
#     COULOMB_JAX_COMMIT=<sha> bash benchmarks/gpu_check.sh
#   Give that line to the device tool (carry=[".whl"], timeout_s 500). There every record
#   takes its commit from COULOMB_JAX_COMMIT (experiments.common.provenance); run where git
#   works, the script sets it itself; with neither, rows say 'unknown'.
# A rerun (device time is 15 minutes in all, a start costs minutes): one step, a smaller
#   budget, e.g. COULOMB_JAX_COMMIT=<sha> STEPS=attention BUDGET_S=200 bash ... (timeout_s
#   BUDGET_S + 30).
# Locally, tiny sizes on CPU, to check the script itself (not its budget):
#     GPU_CHECK_SMOKE=1 OUT=/tmp/gpu_check bash benchmarks/gpu_check.sh
#
# Wheels the image lacks (ml-collections, tensorboardX) travel in .whl/ (ignored by git;
# fetched here with `pip download --no-deps --only-binary=:all: --python-version 3.12
# --implementation cp -d .whl ml-collections==1.1.0 tensorboardX==2.6.5`, the versions of
# our venv); they are installed into /tmp/site without touching the image's jax.
#
# Environment: OUT, PYTHON, BUDGET_S, STEPS (comma list of tests,attention,phase_a),
# COULOMB_JAX_COMMIT, GPU_CHECK_SMOKE.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ "${1:-}" = "--command" ]; then
  sha=$(git rev-parse HEAD) || { echo "no git checkout here" >&2; exit 1; }
  git diff --quiet HEAD -- 2>/dev/null || sha="$sha-dirty"
  echo "COULOMB_JAX_COMMIT=$sha bash benchmarks/gpu_check.sh"
  exit 0
fi

OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if [ -z "${COULOMB_JAX_COMMIT:-}" ]; then
  # As provenance.git_commit would say it: -dirty when tracked files differ from HEAD.
  COULOMB_JAX_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  [ "$COULOMB_JAX_COMMIT" = unknown ] || git diff --quiet HEAD -- 2>/dev/null || \
      COULOMB_JAX_COMMIT="$COULOMB_JAX_COMMIT-dirty"
fi
export COULOMB_JAX_COMMIT
STEPS=${STEPS:-tests,attention,phase_a}

if [ -n "${GPU_CHECK_SMOKE:-}" ]; then
  BUDGET_S=${BUDGET_S:-900}
  TEST_PLATFORMS=cpu
  TESTS=(tests/library/test_lowering.py -k "precision or refused")
  BENCH=(--lengths=64,32 --softmax_max_len=64 --batch=1 --heads=2 --head_dim=16
         --num_features=64 --chunk_size=16 --repeats=1)
  PA_ARGS=(--n=64 --num_features=64 --lengths=32 --repeats=1)
  T_TESTS=300; T_ATTENTION=300; T_PHASE_A=200
else
  BUDGET_S=${BUDGET_S:-470}
  # tests/conftest.py defaults to CPU: ask for the GPU (the 8-fake-device tests pin CPU).
  TEST_PLATFORMS=cuda,cpu
  TESTS=(tests/library/test_pallas_attention.py tests/library/test_lowering.py)
  BENCH=(--lengths=65536,262144,16384,4096,1024 --softmax_max_len=16384 --chunk_size=4096
         --repeats=3)
  PA_ARGS=(--repeats=3 --n=64,1024 --num_features=256)
  T_TESTS=170; T_ATTENTION=200; T_PHASE_A=55
fi

printf 'step\trc\tseconds\ttimeout_s\n' > "$OUT/steps.tsv"
status=0
# step NAME SECONDS CMD...: CMD under `timeout`, clamped to what is left of BUDGET_S (a
# 5 s kill grace and 5 s of slack kept); skipped when under 10 s are left or not in STEPS.
step() {
  local name=$1 limit=$2 left rc t0
  shift 2
  case ",$STEPS," in *",$name,"*) ;; *) [ "$name" = setup ] || return 0 ;; esac
  left=$((BUDGET_S - SECONDS - 10))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    printf '%s\tskipped\t0\t%s\n' "$name" "$limit" >> "$OUT/steps.tsv"; status=1; return 0
  fi
  t0=$SECONDS
  timeout -k 5 "$limit" "$@"
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$OUT/steps.tsv"
  [ "$rc" -eq 0 ] || status=1
}

# Setup: the wheels, then what the machine is (both inside the budget).
if compgen -G ".whl/*.whl" > /dev/null; then
  step setup 30 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:.:${PYTHONPATH:-}
{
  date -u; echo "commit: $COULOMB_JAX_COMMIT"; echo "budget: $BUDGET_S s; steps: $STEPS"
  timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  timeout 30 $PY -c "import sys, jax; print('python', sys.version.split()[0], 'jax',
                     jax.__version__, jax.devices())"
} 2>&1 | tee "$OUT/machine.txt"

# 1. The kernels and the attention paths' exactness on the GPU backend. One line per test
#    as it finishes (-v through tee); no process takes 75% of the GPU up front.
XDIST=()
$PY -c "import xdist" 2>/dev/null && [ -z "${GPU_CHECK_SMOKE:-}" ] && XDIST=(-n 4)
step tests $T_TESTS env XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_PLATFORMS=$TEST_PLATFORMS \
    $PY -m pytest -v -p no:cacheprovider --maxfail=20 ${XDIST[@]+"${XDIST[@]}"} "${TESTS[@]}" \
    > >(tee "$OUT/pytest.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -n 40) 2>&1

# 2. Kernel attention vs cuDNN flash and XLA softmax, bf16; --max_seconds leaves time for
#    the summary inside the timeout.
step attention $T_ATTENTION $PY -m benchmarks.attention --out="$OUT" "${BENCH[@]}" \
    --max_seconds=$((T_ATTENTION - 40)) --dtypes=bfloat16 --feature_maps=favor \
    --learned=false --impls=pallas,cudnn,fused,softmax \
    > >(tee "$OUT/attention.log" | grep -v '^{' | tail -n 30) 2>&1

# 3. Phase A cost against Phase B.
step phase_a $T_PHASE_A $PY -m benchmarks.phase_a --out="$OUT" "${PA_ARGS[@]}" \
    > >(tee "$OUT/phase_a.log" | tail -n 20) 2>&1

sleep 1   # let the tees above flush
cat "$OUT/steps.tsv"
echo "total ${SECONDS} s of a ${BUDGET_S} s budget"
ls -l "$OUT"
exit $status
