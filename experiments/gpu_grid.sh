#!/usr/bin/env bash
# The paper-length Transformer grid on the GPU machine, as much of it as fits one lease:
# the configs' defaults (Phase A 10 + Phase B 10 epochs, the paper's settings), seeds in
# order (all of seed 0 first), every variant, JOBS runs at once on the one GPU (the
# paper-sized model is far too small to fill it), no run started after BUDGET_S − 150 s
# and the rest ended at BUDGET_S. Then the finished runs (results.json, history.jsonl,
# the end of log.txt) are packed into $OUT/grid_runs.tar.gz. Unpack it here into its own
# folder (e.g. workdir/grid_paper: experiments.report refuses to average runs whose configs
# differ, such as the CPU grid's reduced epochs) and run experiments.report --runs=<it>.
# Unfinished runs are lost with the machine.
#
#   Device tool, carrying .whl (wheels the image lacks, see benchmarks/gpu_check.sh) and
#   .data (a copy of ../shared/data, which does not travel; ignored by git, never
#   committed: mkdir -p .data && cp -r ../shared/data/. .data/), timeout_s 600:
#     COULOMB_JAX_COMMIT=$(git rev-parse HEAD) bash experiments/gpu_grid.sh
#   (the copy there has no .git: the runs record the commit given).
#   Here, tiny, to check the script itself:
#     GPU_GRID_SMOKE=1 OUT=/tmp/gpu_grid bash experiments/gpu_grid.sh
#
# SST-2 runs hold out whole sentences for validation (--config.data.validation_rule=sentences);
# the report takes the matching TF-IDF row, results/tfidf/sst2_sentences.json.
#
# Environment: DATASETS, SEEDS, VARIANTS (grid.py's lists), JOBS, BUDGET_S, DATA_DIR, WORK.
set -uo pipefail
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
  echo "data: $DATA_DIR; commit: ${COULOMB_JAX_COMMIT:-(git)}"
} 2>&1 | tee "$OUT/machine.txt"

EXTRA=()
if [ -n "${GPU_GRID_SMOKE:-}" ]; then
  DATASETS=${DATASETS:-rotten_tomatoes}; SEEDS=${SEEDS:-0}
  VARIANTS=${VARIANTS:-softmax,kernel-elu}; JOBS=${JOBS:-2}; BUDGET_S=${BUDGET_S:-400}
  EXTRA=(--config.data.max_train_examples=256 --config.data.max_eval_examples=128
         --config.data.vocab_size=1000 --config.model.width=32 --config.model.num_features=16
         --config.model.ffn_dim=64 --config.phase_a.num_epochs=1 --config.phase_b.num_epochs=1)
else
  # Rotten Tomatoes and the QQP subset first: ~8.5k and 10k training rows against SST-2's
  # 67k, so a lease finishes many of them.
  DATASETS=${DATASETS:-rotten_tomatoes,qqp_subset,sst2}; SEEDS=${SEEDS:-0,1,2}
  VARIANTS=${VARIANTS:-all}; JOBS=${JOBS:-12}; BUDGET_S=${BUDGET_S:-480}
  # SST-2 selects its epoch on held-out whole sentences: the default held-out rows are
  # mostly phrases of training sentences and pick the most memorised epoch at 10 epochs
  # (docs/results_paper_length.md).
  EXTRA=(sst2:--config.data.validation_rule=sentences)
fi

$PY -m experiments.grid --dataset="$DATASETS" --seeds="$SEEDS" --variants="$VARIANTS" \
    --workdir="$WORK" --jobs="$JOBS" --no_new_runs_after_s=$((BUDGET_S - 150)) \
    --kill_after_s="$BUDGET_S" -- --config.data.data_dir="$DATA_DIR" ${EXTRA[@]+"${EXTRA[@]}"} \
    2>&1 | tee "$OUT/grid.log" | grep -E "exit|not started|still running|failed"
status=${PIPESTATUS[0]}

# The finished runs, with the end of each log (the whole logs of killed runs too).
cd "$WORK" || exit 1
find . -name results.json -printf '%h\n' | sort > "$OUT/finished.txt"
find . -name log.txt | while read -r log; do tail -n 40 "$log" > "$log.tail"; done
find . \( -name results.json -o -name history.jsonl -o -name log.txt.tail \) -print0 \
    | tar czf "$OUT/grid_runs.tar.gz" --null -T -
echo "finished runs: $(wc -l < "$OUT/finished.txt")"
ls -l "$OUT"
exit "$status"
