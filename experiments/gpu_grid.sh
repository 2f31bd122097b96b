#!/usr/bin/env bash
# The paper-length Transformer grid on the GPU machine, as much of it as fits what is left
# of one lease: the configs' defaults (Phase A 10 + Phase B 10 epochs, the paper's
# settings), every variant, JOBS runs at once on the one GPU (the paper-sized model is far
# too small to fill it), no run started after BUDGET_S − 150 s and the rest ended at
# BUDGET_S. The plan for a 15-minute lease after benchmarks/gpu_check.sh (a start of a few
# minutes + its 8): BUDGET_S = 240 by default, Rotten Tomatoes (8.5k training rows) seed 0
# only; widen with DATASETS / SEEDS when more time is left.
#
# Every finished run is kept in $OUT as it finishes: a background loop copies each run's
# results.json, history.jsonl and the end of its log into $OUT/runs/<run>/ every 15 s (and
# once more at the end, with the log tails of the unfinished runs in $OUT/unfinished/), so
# a command cut by the device tool's timeout still returns what finished. At the end
# $OUT/grid_runs.tar.gz packs $OUT/runs. Unpack it here into its own folder (e.g.
# workdir/grid_paper: experiments.report refuses to average runs whose configs differ,
# such as the CPU grid's reduced epochs) and run experiments.report --runs=<it>.
#
#   The commit: the copy there has no .git. On this side,
#     bash experiments/gpu_grid.sh --command
#   prints `COULOMB_JAX_COMMIT=<git rev-parse HEAD> BUDGET_S=240 bash experiments/gpu_grid.sh`;
#   give it to the device tool with carry=[".whl", ".data"] (wheels the image lacks, see
#   benchmarks/gpu_check.sh, and a copy of ../shared/data, which does not travel; both
#   ignored by git, never committed: mkdir -p .data && cp -r ../shared/data/. .data/) and
#   timeout_s BUDGET_S + 60. The runs record the commit given.
#   Here, tiny, to check the script itself:
#     GPU_GRID_SMOKE=1 OUT=/tmp/gpu_grid bash experiments/gpu_grid.sh
#
# SST-2 runs hold out whole sentences for validation (--config.data.validation_rule=sentences);
# the report takes the matching TF-IDF row, results/tfidf/sst2_sentences.json.
#
# Environment: DATASETS, SEEDS, VARIANTS (grid.py's lists), JOBS, BUDGET_S, DATA_DIR, WORK,
# COULOMB_JAX_COMMIT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--command" ]; then
  sha=$(git rev-parse HEAD) || { echo "no git checkout here" >&2; exit 1; }
  git diff --quiet HEAD -- 2>/dev/null || sha="$sha-dirty"
  echo "COULOMB_JAX_COMMIT=$sha BUDGET_S=240 bash experiments/gpu_grid.sh"
  exit 0
fi
if [ -z "${COULOMB_JAX_COMMIT:-}" ]; then
  # As provenance.git_commit would say it: -dirty when tracked files differ from HEAD.
  COULOMB_JAX_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  [ "$COULOMB_JAX_COMMIT" = unknown ] || git diff --quiet HEAD -- 2>/dev/null || \
      COULOMB_JAX_COMMIT="$COULOMB_JAX_COMMIT-dirty"
fi
export COULOMB_JAX_COMMIT
OUT=${OUT:-/tmp/gpu_grid}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Several processes share the GPU: no process may take 75% of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
DATA_DIR=${DATA_DIR:-.data}
[ -d "$DATA_DIR" ] || DATA_DIR=../shared/data
WORK=${WORK:-/tmp/gpu_grid_runs}
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
  echo "data: $DATA_DIR; commit: $COULOMB_JAX_COMMIT"
} 2>&1 | tee "$OUT/machine.txt"

EXTRA=()
if [ -n "${GPU_GRID_SMOKE:-}" ]; then
  DATASETS=${DATASETS:-rotten_tomatoes}; SEEDS=${SEEDS:-0}
  VARIANTS=${VARIANTS:-softmax,kernel-elu}; JOBS=${JOBS:-2}; BUDGET_S=${BUDGET_S:-400}
  EXTRA=(--config.data.max_train_examples=256 --config.data.max_eval_examples=128
         --config.data.vocab_size=1000 --config.model.width=32 --config.model.num_features=16
         --config.model.ffn_dim=64 --config.phase_a.num_epochs=1 --config.phase_b.num_epochs=1)
else
  # Rotten Tomatoes first: ~8.5k training rows against the QQP subset's 10k and SST-2's
  # 67k; what is left of a lease after gpu_check.sh finishes one seed of it at best.
  DATASETS=${DATASETS:-rotten_tomatoes}; SEEDS=${SEEDS:-0}
  VARIANTS=${VARIANTS:-all}; JOBS=${JOBS:-12}; BUDGET_S=${BUDGET_S:-240}
  # SST-2 selects its epoch on held-out whole sentences: the default held-out rows are
  # mostly phrases of training sentences and pick the most memorised epoch at 10 epochs
  # (docs/results_paper_length.md).
  EXTRA=(sst2:--config.data.validation_rule=sentences)
fi

# Every 15 s (and at the end): the finished runs' small files into $OUT/runs/<run>/.
keep_finished() {
  [ -d "$WORK" ] || return 0
  (cd "$WORK" && find . -name results.json -printf '%h\n' | sort) > "$OUT/finished.txt"
  while read -r run; do
    mkdir -p "$OUT/runs/$run"
    for f in results.json history.jsonl; do
      [ -f "$WORK/$run/$f" ] && cp -p "$WORK/$run/$f" "$OUT/runs/$run/"
    done
    [ -f "$WORK/$run/log.txt" ] && tail -n 40 "$WORK/$run/log.txt" > "$OUT/runs/$run/log.txt.tail"
  done < "$OUT/finished.txt"
}
( while sleep 15; do keep_finished; done ) &
KEEPER=$!

$PY -m experiments.grid --dataset="$DATASETS" --seeds="$SEEDS" --variants="$VARIANTS" \
    --workdir="$WORK" --jobs="$JOBS" --no_new_runs_after_s=$((BUDGET_S - 150)) \
    --kill_after_s="$BUDGET_S" -- --config.data.data_dir="$DATA_DIR" ${EXTRA[@]+"${EXTRA[@]}"} \
    2>&1 | tee "$OUT/grid.log" | grep -E "exit|not started|still running|failed"
status=${PIPESTATUS[0]}
kill "$KEEPER" 2>/dev/null
wait "$KEEPER" 2>/dev/null
keep_finished

# The unfinished runs' log tails (killed at BUDGET_S), then one archive of the finished.
if [ -d "$WORK" ]; then
  (cd "$WORK" && find . -name log.txt -printf '%h\n') | while read -r run; do
    [ -f "$WORK/$run/results.json" ] && continue
    mkdir -p "$OUT/unfinished/$run"
    tail -n 40 "$WORK/$run/log.txt" > "$OUT/unfinished/$run/log.txt.tail"
  done
fi
mkdir -p "$OUT/runs"
tar czf "$OUT/grid_runs.tar.gz" -C "$OUT/runs" .
echo "finished runs: $(wc -l < "$OUT/finished.txt")"
ls -l "$OUT"
exit "$status"
