r"""``results/softmax_mimicry.json`` from the part files of a workdir (``study``).

Binding keys (issue 24):

* ``fidelity[source][method][N]``: ``{"kl": s, "output_error": s}``, each s =
  ``{"mean", "ci95", "n"}`` over encoder seeds (``fidelity.summary``), a seed's value
  being the mean over its layers and heads;
* ``conversion[dataset]``: ``softmax_accuracy`` (the trained encoders' mean test
  accuracy) and ``[method][N]`` = ``{"zero_shot": m, "finetuned": m, "recovery"}`` with
  m the seed means of accuracy, log loss and ECE and recovery = finetuned accuracy /
  softmax accuracy.

Beside them: ``headline[source][method]`` = the smallest N whose mean KL is at most
orthogonal FAVOR+'s at the largest N (None if none), ``conversion_details`` (per-seed
accuracies, zero-shot recovery, the softmax encoder fine-tuned the same way, the rows
counts), ``pilot``, ``settings``, ``parts`` (each part file's encoder, commits) and the
command, commit and machine of this write. A file is written only from at least one
complete part file; an existing results file is never replaced by an empty one.

Per-run files (``experiments.analysis.run_files``; a run is one part of one encoder):
``<runs_out>/<part>-<dataset>-seed<k>.json``. From the workdir (``run_records``) each holds
its whole part file (every metric per method, N, layer and head), with the encoder
folder's config digest where that folder is here. From a results file whose workdir is
gone (``summary_run_records``) only what the summary keeps per seed: a conversion part's
accuracies (softmax, and every method and N zero-shot and fine-tuned); a fidelity part's
per-seed values are not in it (seed means and intervals only), and its file says so.
"""

import json
import os

import numpy as np

from experiments.analysis import loading
from experiments.analysis import run_files
from experiments.common import cli
from experiments.common import provenance
from studies.softmax_mimicry import conversion
from studies.softmax_mimicry import fidelity
from studies.softmax_mimicry import fit

REFERENCE = 'favor_orthogonal'
STUDY = 'softmax_mimicry'
PART_NAMES = ('fidelity', 'conversion')
NOT_KEPT = ('the summary keeps only seed means and 95% intervals of the fidelity, no '
            'per-seed value')


def _parts(workdir, name):
  """``{(dataset, seed): part}`` of every ``<workdir>/<dataset>/seed<k>/<name>.json``."""
  out = {}
  if not os.path.isdir(workdir):
    return out
  for dataset in sorted(os.listdir(workdir)):
    folder = os.path.join(workdir, dataset)
    if not os.path.isdir(folder):
      continue
    for seed_dir in sorted(os.listdir(folder)):
      path = os.path.join(folder, seed_dir, f'{name}.json')
      if seed_dir.startswith('seed') and os.path.isfile(path):
        with open(path) as f:
          try:
            out[(dataset, int(seed_dir[4:]))] = json.load(f)
          except json.JSONDecodeError as e:
            raise cli.ConfigError(f'{path}: not valid JSON ({e}); delete it to redo the '
                                  'part.') from None
  return out


def fidelity_table(parts: dict) -> dict:
  """``{source: {method: {N: {"kl": s, "output_error": s}}}}`` (binding)."""
  table = {}
  for dataset in sorted({d for d, _ in parts}):
    seeds = [parts[k] for k in sorted(parts) if k[0] == dataset]
    table[dataset] = {}
    for method in fit.METHODS:
      ns = seeds[0]['methods'][method]
      table[dataset][method] = {
          n: {metric: fidelity.summary([np.mean(p['methods'][method][n][metric])
                                        for p in seeds])
              for metric in ('kl', 'output_error')}
          for n in sorted(ns, key=int)}
  return table


def headline(table: dict) -> dict:
  """``{source: {"reference_kl", "reference_n", method: smallest N (int) or None}}``."""
  out = {}
  for source, methods in table.items():
    ref_n = max(methods[REFERENCE], key=int)
    ref = methods[REFERENCE][ref_n]['kl']['mean']
    row = {'reference': f'{REFERENCE} at N={ref_n}', 'reference_kl': ref}
    for method, by_n in methods.items():
      hits = [int(n) for n, v in by_n.items() if v['kl']['mean'] <= ref]
      row[method] = min(hits) if hits else None
    out[source] = row
  return out


def _mean_metrics(rows):
  return {k: float(np.mean([r[k] for r in rows])) for k in conversion.METRICS}


def conversion_tables(parts: dict):
  """``(conversion (binding), conversion_details)``."""
  table, details = {}, {}
  for dataset in sorted({d for d, _ in parts}):
    seeds = [parts[k] for k in sorted(parts) if k[0] == dataset]
    soft = [p['softmax']['zero_shot']['accuracy'] for p in seeds]
    soft_acc = float(np.mean(soft))
    entry = {'softmax_accuracy': soft_acc}
    det = {'seeds': [p['seed'] for p in seeds], 'softmax_accuracy_per_seed': soft,
           'softmax': {w: _mean_metrics([p['softmax'][w] for p in seeds])
                       for w in ('zero_shot', 'finetuned')},
           'test_rows': seeds[0]['test_rows'], 'finetune_rows': seeds[0]['finetune_rows'],
           'methods': {}}
    for method in fit.METHODS:
      entry[method], det['methods'][method] = {}, {}
      for n in sorted(seeds[0]['methods'][method], key=int):
        runs = [p['methods'][method][n] for p in seeds]
        zero = _mean_metrics([r['zero_shot'] for r in runs])
        tuned = _mean_metrics([r['finetuned'] for r in runs])
        entry[method][n] = {'zero_shot': zero, 'finetuned': tuned,
                            'recovery': tuned['accuracy'] / soft_acc}
        det['methods'][method][n] = {
            'zero_shot_recovery': zero['accuracy'] / soft_acc,
            'zero_shot_accuracy_per_seed': [r['zero_shot']['accuracy'] for r in runs],
            'finetuned_accuracy_per_seed': [r['finetuned']['accuracy'] for r in runs]}
    table[dataset], details[dataset] = entry, det
  return table, details


def write_results(config, workdir: str, path: str) -> dict:
  """Writes ``path`` from ``workdir``'s part files and returns it (see the module docstring)."""
  fid, conv = _parts(workdir, 'fidelity'), _parts(workdir, 'conversion')
  if not fid:
    raise cli.ConfigError(f'--workdir: {workdir} holds no finished fidelity part; nothing '
                          f'to write (an existing {path} is left as it is).')
  pilot_path = os.path.join(workdir, 'pilot.json')
  pilot = None
  if os.path.isfile(pilot_path):
    with open(pilot_path) as f:
      pilot = json.load(f)
  table = fidelity_table(fid)
  conv_table, details = conversion_tables(conv) if conv else ({}, {})
  parts = [{'part': name, 'dataset': d, 'seed': s, 'run_dir': p['run_dir'],
            'encoder_commit': p.get('encoder_commit'), 'commit': p.get('commit')}
           for name, group in (('fidelity', fid), ('conversion', conv))
           for (d, s), p in sorted(group.items())]
  out = dict(provenance.run_metadata('studies.softmax_mimicry'),
             fidelity=table, conversion=conv_table, headline=headline(table),
             conversion_details=details, pilot=pilot,
             settings=json.loads(config.to_json()), parts=parts)
  provenance.write_json_atomic(path, out, indent=1)
  print(f'{path}: fidelity of {len(fid)} encoders, conversion of {len(conv)}', flush=True)
  return out


def run_id(row: dict) -> str:
  """``<part>-<dataset>-seed<k>``."""
  return f'{row["part"]}-{row["dataset"]}-seed{int(row["seed"])}'


def _encoder_digest(run_dir: str):
  """``(config_sha256, from)`` of an encoder folder (relative to the repository root)."""
  folder = os.path.join(provenance.REPO_ROOT, run_dir)
  results_path = os.path.join(folder, 'results.json')
  if not (os.path.isfile(results_path) or os.path.isfile(os.path.join(folder, 'config.json'))):
    return None, f'none: the encoder folder {run_dir} is not here'
  results = loading.read_json(results_path) if os.path.isfile(results_path) else {}
  digest, where = run_files.config_sha256(folder, results)
  return digest, f'the encoder {run_dir}: {where}'


def run_records(workdir: str, command: str) -> list:
  """``run_files.study_record`` of every part file of ``workdir`` (``{part, dataset}`` and
  the file as it is)."""
  source = f'part files under {provenance.relative_path(workdir)}'
  out = []
  for name in PART_NAMES:
    for (dataset, seed), part in sorted(_parts(workdir, name).items()):
      row = dict({'part': name, 'dataset': dataset}, **part)
      digest, where = _encoder_digest(part['run_dir'])
      machine = row.pop('machine', None)
      out.append(run_files.study_record(
          STUDY, run_id(row), row, source, command, digest, where, machine=machine,
          machine_from='the part file' if machine else 'none: the part file has none'))
  return out


def _seed_values(table: dict, part: dict) -> dict:
  """What ``table`` (a results file) keeps of one part's seed: ``{}`` for fidelity, the
  accuracies for conversion (shaped as the part file: ``softmax.zero_shot.accuracy`` and
  ``methods[m][N].{zero_shot, finetuned}.accuracy``)."""
  if part['part'] != 'conversion':
    return {'not_kept': NOT_KEPT}
  det = table['conversion_details'][part['dataset']]
  i = det['seeds'].index(part['seed'])
  return {'test_rows': det['test_rows'], 'finetune_rows': det['finetune_rows'],
          'softmax': {'zero_shot': {'accuracy': det['softmax_accuracy_per_seed'][i]}},
          'methods': {m: {n: {'zero_shot': {'accuracy': v['zero_shot_accuracy_per_seed'][i]},
                              'finetuned': {'accuracy': v['finetuned_accuracy_per_seed'][i]}}
                          for n, v in by_n.items()}
                      for m, by_n in det['methods'].items()},
          'not_kept': 'log loss and ECE per seed (the summary keeps their seed means only)'}


def summary_run_records(table: dict, path: str, command: str) -> list:
  """``run_files.summary_records`` of every row of ``table['parts']`` (a results file read
  from ``path``, its workdir gone), each with what ``table`` keeps of that seed."""
  rows = [dict(p, **_seed_values(table, p)) for p in table['parts']]
  return run_files.summary_records(STUDY, path, rows, run_id, command, table.get('machine'))
