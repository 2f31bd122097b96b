#!/usr/bin/env bash
# The recall grid of issue 36 on one GPU: every (cell, width, method) of
# experiments/recall/batched.py:ZOOLOGY_BATCHED as one vmapped program (all learning rates ×
# seeds, × η for the Langevin methods; experiments/recall/batched.py), configs/mqar.py:zoology,
# JOBS worker processes sharing the GPU and claiming programs in order (most informative
# first), no program started after BUDGET_S − 60 s and none training past BUDGET_S.
#
# What comes back ($OUT, a device returns a few files, not one per run):
#   grid/runs.tar.gz   every finished run's result.json (those restored from the grid's
#                      committed results file included) and every failed program's
#                      programs/<name>/failed.json, rewritten after each program
#   grid/grid.log      the workers' lines;  grid/machine.txt  the machine and commit
# Here, unpack and write the results file and one file per run:
#   mkdir -p workdir/mqar_zoology_gpu && tar xzf <files_at>/grid/runs.tar.gz -C workdir/mqar_zoology_gpu
#   .venv/bin/python -m experiments.mqar --config=configs/mqar.py:zoology \
#       --grid=zoology_batched --workdir=workdir/mqar_zoology_gpu --collect_only
#   (results/mqar_zoology_gpu.json and results/runs/mqar_zoology_gpu/; with
#   GRID=zoology_batched_long, its own results file, batched.BATCHED_GRIDS).
#
# The commit: the copy there has no .git. On this side,
#     bash experiments/recall/gpu_grid.sh --command
# prints `COULOMB_JAX_COMMIT=<sha> bash experiments/recall/gpu_grid.sh`; give it to the
# device tool with carry=[".whl"] (ml-collections, which the image lacks: see
# benchmarks/gpu_check.sh) and timeout_s BUDGET_S + 40.
# Here, tiny, to check the script itself (CPU, configs/mqar.py:zoology,quick, tiny_batched):
#     GPU_GRID_SMOKE=1 OUT=/tmp/recall_gpu bash experiments/recall/gpu_grid.sh
#
# Environment: OUT, PYTHON, GRID (a name of experiments/recall/batched.py:BATCHED_GRIDS,
# default zoology_batched), BUDGET_S (default 420), JOBS (default 6), WORK (default
# workdir/recall_gpu; rows of 5a11465 ran with /tmp/recall_gpu_runs, recorded as $WORK),
# COULOMB_JAX_COMMIT, GPU_GRID_SMOKE.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if [ "${1:-}" = "--command" ]; then
  sha=$(git rev-parse HEAD) || { echo "no git checkout here" >&2; exit 1; }
  git diff --quiet HEAD -- 2>/dev/null || sha="$sha-dirty"
  echo "COULOMB_JAX_COMMIT=$sha bash experiments/recall/gpu_grid.sh"
  exit 0
fi
if [ -z "${COULOMB_JAX_COMMIT:-}" ]; then
  # As provenance.git_commit would say it: -dirty when tracked files differ from HEAD.
  COULOMB_JAX_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  [ "$COULOMB_JAX_COMMIT" = unknown ] || git diff --quiet HEAD -- 2>/dev/null || \
      COULOMB_JAX_COMMIT="$COULOMB_JAX_COMMIT-dirty"
fi
export COULOMB_JAX_COMMIT
OUT=${OUT:-/tmp/recall_gpu}
mkdir -p "$OUT/grid"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Several processes share the GPU: none may take 75% of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# Compile time, not run time, bounds this grid: at 36 runs a Langevin program had not
# compiled after 6-8 minutes (2026-12-04); with these flags 12 runs compiled and ran in
# 49 s (python -m benchmarks.recall_compile). They change how XLA compiles, not the math.
export XLA_FLAGS="${XLA_FLAGS:---xla_llvm_disable_expensive_passes=true --xla_gpu_autotune_level=0}"
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
# Paths inside the repository (git ignores workdir/), so that every run records a command
# with no machine-local path: $WORK and a link to $OUT/grid.
WORK=${WORK:-workdir/recall_gpu}
mkdir -p "$WORK" workdir
ln -sfn "$OUT/grid" workdir/recall_gpu_out
if [ -n "${GPU_GRID_SMOKE:-}" ]; then
  CONFIG=configs/mqar.py:zoology,quick; GRID=tiny_batched
  BUDGET_S=${BUDGET_S:-300}; JOBS=${JOBS:-2}
else
  CONFIG=configs/mqar.py:zoology; GRID=${GRID:-zoology_batched}
  BUDGET_S=${BUDGET_S:-420}; JOBS=${JOBS:-6}
fi
COMMITTED=$($PY -c "import sys; from experiments.recall import batched; \
print(batched.BATCHED_GRIDS[sys.argv[1]].get('results', ''))" "$GRID") || exit 1
{
  date -u; echo "commit: $COULOMB_JAX_COMMIT; budget $BUDGET_S s; jobs $JOBS; grid $GRID"
  timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  timeout 60 $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
} 2>&1 | tee "$OUT/grid/machine.txt"

# The committed rows: restored into $WORK by the workers (not run again) and kept.
[ -n "$COMMITTED" ] && [ -f "$COMMITTED" ] && cp "$COMMITTED" "$WORK/results.json"

# The workers' own clock starts after the setup above: what is left of BUDGET_S.
left=$((BUDGET_S - SECONDS))
pids=()
for i in $(seq 1 "$JOBS"); do
  timeout -k 5 "$((left + 10))" $PY -m experiments.mqar --config="$CONFIG" --grid="$GRID" \
      --workdir="$WORK" --results="$WORK/results.json" --runs_dir="$WORK/files" \
      --archive=workdir/recall_gpu_out/runs.tar.gz --budget_s="$left" 2>&1 | sed -u "s/^/[w$i] /" \
      >> "$OUT/grid/grid.log" &
  pids+=($!)
  sleep 2          # staggered: the workers claim different programs from the start
done
wait "${pids[@]}"
# Once more, after every worker: the archive holds every finished run.
$PY - "$WORK" "$OUT/grid/runs.tar.gz" <<'EOF'
import sys
from experiments import mqar
mqar.archive_runs(sys.argv[1], sys.argv[2])
EOF
grep -E "runs in|not started|deadline|Error|error" "$OUT/grid/grid.log" | tail -n 60
echo "finished runs: $(tar tzf "$OUT/grid/runs.tar.gz" | wc -l); ${SECONDS} s of $BUDGET_S"
ls -l "$OUT/grid"
