r"""What a run folder knows of its run: the config's digest, and the files checked against it.

A run is named by ``config_digest(saved)``: the sha256 (hex) of the canonical JSON
(sorted keys, no spaces) of its saved config (``saved_config``, what ``config.json``
holds) with every field added since it was written (``with_added_fields``) and
without ``data.data_dir`` (the data fingerprint compares the data itself): two
configs have one digest iff ``RunFolder.preflight`` takes them for the same run.
The digest is written

* into ``results.json`` (``config_sha256``; ``finished_run_difference`` reads it);
* into every checkpoint and the Phase B prefix, beside ``data_sha256``
  (``checkpoints.CONFIG_LEAF``, uint8[32]; ``checkpoints.check_config``);
* into every stage of ``phase_a_stages.json`` (``config_sha256``; ``stamp_stages``
  adds it, ``check_stages`` compares it).

What was written before digests existed carries none: it is taken as the run's
when the folder's ``config.json`` is this config (``preflight`` checks that). Also
here: the JSON readers of a run folder (``read_json``, ``stored_files``) and the
check of a ``run.prefix_from`` source (``check_prefix_source``).
"""

import copy
import hashlib
import json
import os
from typing import Optional

from absl import logging

from coulomb_jax.tasks import data
from experiments.common import cli
from experiments.common import provenance
from experiments.run import checkpoints

CONFIG = 'config.json'
FINGERPRINT = 'fingerprint.json'
TOKENIZER = 'tokenizer.json'
RESULTS = 'results.json'
# Phase A stage summaries (``experiments.run.phase_a_report.STAGES_FILE``).
STAGES = 'phase_a_stages.json'
# The key of the config digest in results.json and in each stage of phase_a_stages.json.
DIGEST = 'config_sha256'


def read_json(path):
  """A JSON file of a run folder; one ``cli.ConfigError`` naming it if it is damaged."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise cli.ConfigError(f'{path} is not valid JSON ({e}): the file is damaged; restore it '
                          'or use a new workdir.') from None


def stored_files(path):
  """The ``{name: sha256}`` of a ``fingerprint.json``; one ``cli.ConfigError`` if malformed."""
  stored = read_json(path)
  if not isinstance(stored, dict) or not isinstance(stored.get('files'), dict):
    raise cli.ConfigError(f'{path}: expected {{"files": {{name: sha256}}}}, got '
                          f'{json.dumps(stored)[:80]}; restore it or use a new workdir.')
  return stored['files']


# ----------------------------------------------------------------------------- the config

# Config fields added after runs were started, with the value that reproduces what
# those runs did: a config.json without the field resumes as having this value.
_ADDED_FIELDS = {('data', 'validation_rule'): 'rows', ('phase_a', 'target'): 'labels'}


def saved_config(config):
  """``config`` as ``config.json`` holds it (a plain nested dict)."""
  return json.loads(config.to_json())


def with_added_fields(saved, added=None):
  """A saved config (``saved_config``) with every field added since it was written:
  ``added`` ``{(section, field): value}`` (default: the text study's, ``_ADDED_FIELDS``;
  the recall runs pass their own)."""
  for (section, field), value in (_ADDED_FIELDS if added is None else added).items():
    saved.setdefault(section, {}).setdefault(field, value)
  return saved


def without_data_dir(saved):
  """A saved config without ``data.data_dir`` (the data fingerprint compares the data)."""
  return {k: ({f: v for f, v in fields.items() if f != 'data_dir'} if k == 'data' else fields)
          for k, fields in saved.items()}


def identity(saved: dict) -> dict:
  """What names a run in a saved config: ``with_added_fields``, without ``data.data_dir``
  (``saved`` is not changed)."""
  return without_data_dir(with_added_fields(copy.deepcopy(saved)))


def config_digest(saved: dict) -> str:
  """sha256 (64 hex digits) of ``identity(saved)`` as canonical JSON."""
  text = json.dumps(identity(saved), sort_keys=True, separators=(',', ':'))
  return hashlib.sha256(text.encode()).hexdigest()


def digest_of(config) -> str:
  """``config_digest`` of an ``ml_collections.ConfigDict``."""
  return config_digest(saved_config(config))


def short(digest: str) -> str:
  """The first 12 hex digits of a digest, as messages name it."""
  return f'{digest[:12]}…'


def difference(theirs: dict, ours: dict, limit: int = 4) -> str:
  """The flat fields (``section.field``) in which two saved configs' ``identity`` differ,
  as ``field: <theirs> there, <ours> here`` (at most ``limit``, then a count)."""
  flat = lambda saved: {f'{s}.{k}' if isinstance(v, dict) else s: x
                        for s, v in identity(saved).items()
                        for k, x in (v.items() if isinstance(v, dict) else [(None, v)])}
  a, b = flat(theirs), flat(ours)
  fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
  text = ', '.join(f'{k}: {a.get(k)!r} there, {b.get(k)!r} here' for k in fields[:limit])
  return text + (f' and {len(fields) - limit} more field(s)' if len(fields) > limit else '')


# ----------------------------------------------------------------------------- results, stages

def finished_run_difference(workdir: str, config) -> Optional[str]:
  """None if ``<workdir>/results.json`` is a finished run of ``config``; else what differs.

  Its ``config_sha256`` is compared with ``digest_of(config)``; a results.json written
  before digests is compared by its folder's ``config.json`` (else its own ``config``).
  """
  results = read_json(os.path.join(workdir, RESULTS))
  results = results if isinstance(results, dict) else {}
  ours = saved_config(config)
  config_path = os.path.join(workdir, CONFIG)
  theirs = (read_json(config_path) if os.path.isfile(config_path) else results.get('config'))
  if DIGEST in results:
    if results[DIGEST] == config_digest(ours):
      return None
    what = difference(theirs, ours) if isinstance(theirs, dict) else 'its config'
    return (f'config sha256 {short(results[DIGEST])} there, {short(config_digest(ours))} '
            f'here ({what})')
  if not isinstance(theirs, dict):
    logging.warning('%s: no config digest and no config.json (written before either): '
                    'taken as this run.', workdir)
    return None
  return None if identity(theirs) == identity(ours) else difference(theirs, ours)


def check_results(workdir: str, digest: str) -> None:
  """One ``cli.ConfigError`` if ``<workdir>/results.json`` names another config's digest."""
  path = os.path.join(workdir, RESULTS)
  if not os.path.isfile(path):
    return
  theirs = read_json(path)
  theirs = theirs.get(DIGEST) if isinstance(theirs, dict) else None
  if theirs is not None and theirs != digest:
    raise cli.ConfigError(f'{path}: written by a run of another config (config sha256 '
                          f'{short(theirs)}; this run\'s is {short(digest)}); use a new '
                          'workdir.')


def _stages(path: str) -> dict:
  stages = read_json(path)
  if not isinstance(stages, dict) or not all(isinstance(s, dict) for s in stages.values()):
    raise cli.ConfigError(f'{path}: expected {{stage index: summary}}, got '
                          f'{json.dumps(stages)[:80]}; restore it or use a new workdir.')
  return stages


def check_stages(path: str, digest: str) -> None:
  """One ``cli.ConfigError`` if a stage of ``phase_a_stages.json`` at ``path`` was written
  by a run of another config (its ``config_sha256`` is not ``digest``); stages without
  one were written before digests (the folder's config.json is checked instead)."""
  if not os.path.isfile(path):
    return
  for index, stage in sorted(_stages(path).items()):
    theirs = stage.get(DIGEST)
    if theirs is not None and theirs != digest:
      raise cli.ConfigError(f'{path}: stage {index} was written by a run of another config '
                            f'(config sha256 {short(theirs)}; this run\'s is {short(digest)})'
                            '; remove the file or use that run\'s workdir.')


def stamp_stages(path: str, digest: str) -> None:
  """Adds ``config_sha256: digest`` to every stage of ``phase_a_stages.json`` without one
  (atomically; nothing if the file is missing or every stage has one)."""
  if not os.path.isfile(path):
    return
  stages = _stages(path)
  if all(DIGEST in s for s in stages.values()):
    return
  for stage in stages.values():
    stage.setdefault(DIGEST, digest)
  provenance.write_json_atomic(path, stages, indent=1)


# ----------------------------------------------------------------------------- prefix source

def prefix_source_digest(source: str) -> Optional[str]:
  """``config_digest`` of the ``config.json`` of a ``run.prefix_from`` run folder (None
  without one)."""
  path = os.path.join(source, CONFIG)
  return config_digest(read_json(path)) if os.path.isfile(path) else None


def check_prefix_source(config, ours: dict) -> None:
  """Refuses a ``run.prefix_from`` run whose config differs in a field the prefix depends
  on, or whose data fingerprint differs from ``ours`` (this run's, data now on disk)."""
  source = config.run.prefix_from
  config_path, fingerprint = (os.path.join(source, f) for f in (CONFIG, FINGERPRINT))
  if not os.path.isfile(config_path):
    raise cli.ConfigError(f'config.run.prefix_from: {source!r} is not a run folder (no '
                          'config.json).')
  their_fields = checkpoints.prefix_fields(with_added_fields(read_json(config_path)))
  mine = checkpoints.prefix_fields(saved_config(config))
  diff = sorted(k for k in set(their_fields) | set(mine)
                if their_fields.get(k) != mine.get(k))
  if diff:
    raise cli.ConfigError(f'config.run.prefix_from: {source!r} trained with other values of '
                          f'{diff}; its Phase B prefix is not this run\'s.')
  if not os.path.exists(fingerprint):
    logging.warning('config.run.prefix_from: %s has no %s (trained before data fingerprints): '
                    'its data is not compared with this run\'s.', source, FINGERPRINT)
    return
  stored = stored_files(fingerprint)
  if TOKENIZER not in ours:      # Ours is copied from theirs.
    stored = {k: v for k, v in stored.items() if k != TOKENIZER}
  try:
    data.check_fingerprint(stored, ours, what=f'config.run.prefix_from: the data {source!r} '
                           'trained on')
  except ValueError as e:
    raise cli.ConfigError(f'{e} Its Phase B prefix is not this run\'s.') from None
