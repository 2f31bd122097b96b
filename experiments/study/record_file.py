"""The synthetic study's records file, ``<workdir>/records.jsonl``.

One JSON object per line: a record (one method on one (σ, seed) cell), and after
the records of a cell a marker ``{"cell_done": true, "noise_index": i, "seed": s}``.
A cell counts only once its marker is written, so a run killed in the middle of a
cell (or of a line) redoes that cell and nothing else. Both the study
(``experiments.synthetic``) and its report (``experiments.study.tables``)
read the file through this module.
"""

import json
import os

from experiments.common import provenance

FILENAME = 'records.jsonl'


def load_done(path: str):
  """``(records, done)``: the records of finished cells and the set of ``(noise_index, seed)``."""
  records, done = [], set()
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:     # a line cut by a kill: that cell is redone
          continue
        if row.get('cell_done'):
          done.add((row['noise_index'], row['seed']))
        else:
          records.append(row)
  records = [r for r in records if (r['noise_index'], r['seed']) in done]
  return records, done


def rewrite_complete(path: str, records, done) -> None:
  """Rewrites the file with the finished cells only, so a cut line never stays behind."""
  provenance.write_atomic(path, ''.join(
      [json.dumps(r) + '\n' for r in records]
      + [json.dumps({'cell_done': True, 'noise_index': i, 'seed': s}) + '\n'
         for i, s in sorted(done)]))


def append_cell(path: str, cell_records, noise_index: int, seed: int) -> None:
  """Appends one finished cell: its records, then its marker."""
  with open(path, 'a') as f:
    for r in cell_records:
      f.write(json.dumps(r) + '\n')
    f.write(json.dumps({'cell_done': True, 'noise_index': noise_index, 'seed': seed}) + '\n')
