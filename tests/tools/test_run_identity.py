"""experiments.run.run_identity: a run folder knows its run (issue 27 items 2 and 3).

Every checkpoint, ``phase_a_stages.json`` and ``results.json`` carries the digest of
the run's config; a checkpoint, stage file or Phase B prefix of another config is
refused naming both digests and the file, and ``experiments.grid`` refuses a finished
folder of another variant instead of saying "done already". Restored parameters are
checked finite before any step. A checkpoint written before digests still resumes.

One tiny Kernel-FAVOR+ run (64 generated rows, one layer, 4 Phase A and 4 Phase B
steps) trained to the end and one stopped in Phase B, shared by every test.
"""

import json
import os
import re
import shutil
import types

import jax
import numpy as np
import pytest
from absl import flags

from test_distributed import _mr_data
from experiments import grid
from experiments import train
from experiments.run import setup
from experiments.common import cli
from experiments.common import provenance
from experiments.run import checkpoints
from experiments.run import run_folder
from experiments.run import run_identity

DATASET = 'rotten_tomatoes'
TINY = ['--config.data.max_train_examples=64', '--config.data.max_eval_examples=32',
        '--config.data.vocab_size=120', '--config.data.max_length=32',
        '--config.data.pad_multiple=32', '--config.model.num_layers=1',
        '--config.model.width=16', '--config.model.num_features=8',
        '--config.model.ffn_dim=32', '--config.phase_a.num_epochs=1',
        '--config.phase_a.batch_size=16', '--config.phase_a.null_run=False',
        '--config.phase_a.calibration_rows=32', '--config.phase_a.heldout_rows=32',
        '--config.phase_b.num_epochs=1', '--config.phase_b.batch_size=16',
        '--config.run.eval_batch_size=32', '--config.run.checkpoint_every=2']


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('identity'))
  args = [f'--config.data.data_dir={_mr_data(os.path.join(root, "data"))}'] + TINY
  config = grid.load_config(DATASET, 'kernel-favor', args)
  finished = grid.run_dir(os.path.join(root, 'grid'), DATASET, 'kernel-favor', 0)
  results = train.train_and_evaluate(config, finished)
  stopped = os.path.join(root, 'stopped')
  assert train.train_and_evaluate(config, stopped, stop_after_steps=5) is None  # 1 B step
  return types.SimpleNamespace(root=root, args=args, config=config, finished=finished,
                               results=results, stopped=stopped,
                               digest=run_identity.digest_of(config))


def _copy(runs, name, config=None):
  """A copy of the stopped run's folder; ``config``: its config.json replaced by that one's."""
  out = os.path.join(runs.root, name)
  shutil.copytree(runs.stopped, out)
  if config is not None:
    provenance.write_json_atomic(os.path.join(out, 'config.json'),
                                 run_identity.saved_config(config), indent=1)
  return out


def _snapshot(path):
  return {os.path.join(d, f): open(os.path.join(d, f), 'rb').read()
          for d, _, files in os.walk(path) for f in files}


def _other(runs):
  return grid.load_config(DATASET, 'kernel-favor',
                          runs.args + ['--config.phase_b.learning_rate=0.01'])


def _resave(runs, workdir, change):
  """The folder's newest checkpoint, restored and passed through ``change(ckpt)`` (numpy
  leaves), saved again as the folder's only checkpoint; returns its step."""
  with run_folder.RunFolder(workdir) as folder:
    run, _ = setup.setup_run(runs.config, folder, provenance.run_metadata('test'))
    if run.writer is not None:
      run.writer.close()
    ckpt = change(jax.tree.map(np.array, run.ckpt))
  shutil.rmtree(os.path.join(workdir, 'checkpoints'))
  manager = checkpoints.checkpoint_manager(workdir)
  checkpoints.save(manager, ckpt)
  return manager.latest_step()


@pytest.mark.slow
def test_every_file_of_a_run_carries_its_config_digest(runs):
  assert runs.results['config_sha256'] == runs.digest
  assert json.load(open(os.path.join(runs.finished, 'results.json')))['config_sha256'] == (
      runs.digest)
  assert [s['config_sha256'] for s in runs.results['phase_a']['stages']] == [runs.digest]
  stages = json.load(open(os.path.join(runs.stopped, 'phase_a_stages.json')))
  assert [s['config_sha256'] for s in stages.values()] == [runs.digest]
  latest = checkpoints.read_latest(checkpoints.checkpoint_manager(runs.stopped))
  assert checkpoints.leaf_hex(latest[checkpoints.CONFIG_LEAF]) == runs.digest
  # The digest is preflight's notion of the same run: the data folder does not count.
  moved = grid.load_config(DATASET, 'kernel-favor', runs.args + ['--config.data.data_dir=/x'])
  assert run_identity.digest_of(moved) == runs.digest != run_identity.digest_of(_other(runs))


@pytest.mark.slow
def test_a_checkpoint_of_another_config_is_refused_naming_both_digests(runs):
  other = _other(runs)
  ours = _copy(runs, 'copied_checkpoints', other)     # checkpoints: the first config's run
  os.remove(os.path.join(ours, 'phase_a_stages.json'))
  steps = sorted(checkpoints.checkpoint_manager(ours).all_steps())
  theirs, mine = runs.digest[:12], run_identity.digest_of(other)[:12]
  with pytest.raises(cli.ConfigError, match=(
      rf'^checkpoint step {steps[-1]} in .*copied_checkpoints/checkpoints: written by a run '
      rf"of another config \(config sha256 {theirs}…; this run's config hashes to {mine}…\); "
      r"use that run's workdir, or a new one for this config\.$")):
    train.train_and_evaluate(other, ours)
  assert sorted(checkpoints.checkpoint_manager(ours).all_steps()) == steps
  assert not os.path.exists(os.path.join(ours, 'results.json'))


@pytest.mark.slow
def test_a_stage_file_of_another_config_is_refused_before_any_write(runs):
  other = _other(runs)
  ours = _copy(runs, 'copied_stages', other)
  shutil.rmtree(os.path.join(ours, 'checkpoints'))  # a fresh run of `other`, but that file
  before = _snapshot(ours)
  with pytest.raises(cli.ConfigError, match=(
      r'^.*copied_stages/phase_a_stages\.json: stage 0 was written by a run of another config '
      rf"\(config sha256 {runs.digest[:12]}…; this run's is "
      rf"{run_identity.digest_of(other)[:12]}…\); remove the file or use that run's workdir\.$")):
    train.train_and_evaluate(other, ours)
  assert _snapshot(ours) == before


@pytest.mark.slow
def test_grid_refuses_a_folder_holding_another_variants_finished_run(runs):
  workdir = os.path.join(runs.root, 'grid')

  def commands(variant):
    fv = flags.FlagValues()
    grid.define_flags(fv)
    fv(['grid', f'--dataset={DATASET}', f'--variants={variant}', f'--workdir={workdir}'])
    return grid.commands(fv, runs.args)

  assert commands('kernel-favor') == []                          # done already: its own run
  ball = grid.run_dir(workdir, DATASET, 'ball-favor', 0)
  shutil.copytree(runs.finished, ball)
  what = (r"model\.init_radius: 0\.0 there, 1\.5 here, phase_a\.enabled: True there, False "
          r"here, variant: 'kernel-favor' there, 'ball-favor' here")
  with pytest.raises(cli.ConfigError, match=(
      rf'^{re.escape(ball)}: holds a finished run of another config \(config sha256 '
      rf'{runs.digest[:12]}… there, [0-9a-f]{{12}}… here \({what}\)\), not the run this grid '
      r'asks for; move it away or use another --workdir\.$')):
    commands('ball-favor')
  # A results.json written before digests: its folder's config.json is compared instead.
  path = os.path.join(ball, 'results.json')
  results = json.load(open(path))
  del results['config_sha256']
  json.dump(results, open(path, 'w'))
  with pytest.raises(cli.ConfigError, match=rf'^{re.escape(ball)}: holds a finished run of '
                     rf'another config \({what}\)'):
    commands('ball-favor')


@pytest.mark.slow
def test_a_nan_particle_in_a_checkpoint_is_refused_before_any_step(runs):
  ours = _copy(runs, 'nan_particle')
  leaf = []

  def poison(ckpt):
    flat = jax.tree_util.tree_flatten_with_path(ckpt['params'])[0]
    path, value = next((p, v) for p, v in flat if p[-1].key == 'particles')
    leaf.append('/'.join(k.key for k in path))
    value[0, 1, 2] = np.nan
    return ckpt

  step = _resave(runs, ours, poison)
  history = open(os.path.join(ours, 'history.jsonl')).read()
  with pytest.raises(cli.ConfigError, match=(
      rf'^checkpoint step {step} in .*nan_particle/checkpoints: params/{leaf[0]} holds 1 '
      r'non-finite value\(s\) \(first nan at index \(0, 1, 2\)\); the checkpoint is damaged')):
    train.train_and_evaluate(runs.config, ours)
  assert leaf[0] == 'attention_0/particles'
  assert open(os.path.join(ours, 'history.jsonl')).read() == history   # no step was taken
  assert checkpoints.checkpoint_manager(ours).all_steps() == [step]


@pytest.mark.slow
def test_a_checkpoint_and_stages_written_before_digests_still_resume(runs):
  ours = _copy(runs, 'old_style')
  step = _resave(runs, ours, lambda ckpt: {k: v for k, v in ckpt.items()
                                           if k != checkpoints.CONFIG_LEAF})
  stages_path = os.path.join(ours, 'phase_a_stages.json')
  stages = json.load(open(stages_path))
  json.dump({k: {f: v for f, v in s.items() if f != 'config_sha256'}
             for k, s in stages.items()}, open(stages_path, 'w'))
  saved = checkpoints.read_latest(checkpoints.checkpoint_manager(ours))
  assert checkpoints.CONFIG_LEAF not in saved and step
  results = train.train_and_evaluate(runs.config, ours)
  assert results['test'] == runs.results['test']         # as if never interrupted
  assert results['config_sha256'] == runs.digest
  latest = checkpoints.read_latest(checkpoints.checkpoint_manager(ours))
  assert checkpoints.leaf_hex(latest[checkpoints.CONFIG_LEAF]) == runs.digest
  assert [s['config_sha256'] for s in json.load(open(stages_path)).values()] == [runs.digest]


@pytest.mark.slow
def test_a_prefix_of_another_config_or_with_a_nan_is_refused(runs, tmp_path):
  i32 = lambda v: np.asarray(v, np.int32)
  other = run_identity.digest_of(_other(runs))
  state = lambda w, digest: {
      'stage': i32(1), 'step_a': i32(0), 'step_b': i32(4), 'params': {'w': w},
      'data_sha256': checkpoints.data_digest({'train.tsv': 'f' * 64}),
      checkpoints.CONFIG_LEAF: checkpoints.digest_leaf(digest)}
  source = run_folder.RunFolder(str(tmp_path / 'source'))
  os.makedirs(source.path)
  source.write_json('config.json', run_identity.saved_config(runs.config))
  source.save_prefix(state(np.arange(3, dtype=np.float32), other))   # not its own run's
  ours = run_folder.RunFolder(str(tmp_path / 'ours'))
  os.makedirs(ours.path)
  target = state(np.zeros(3, np.float32), other)
  with pytest.raises(cli.ConfigError, match=(
      rf'^config\.run\.prefix_from: .*source/prefix: written by a run of another config '
      rf'\(config sha256 {other[:12]}…; the config\.json of .*source hashes to '
      rf'{runs.digest[:12]}…\)')):
    ours.restore_prefix(source.path, target)
  shutil.rmtree(source.file('prefix'))
  source.save_prefix(state(np.array([0, np.inf, 1], np.float32), runs.digest))
  with pytest.raises(cli.ConfigError, match=(
      r'^config\.run\.prefix_from: .*source/prefix \(Phase B step 4\): params/w holds 1 '
      r'non-finite value\(s\) \(first inf at index \(1,\)\)')):
    ours.restore_prefix(source.path, target)
  # Its own run's, finite: restored, and from here on it carries this run's digest.
  shutil.rmtree(source.file('prefix'))
  source.save_prefix(state(np.arange(3, dtype=np.float32), runs.digest))
  restored = ours.restore_prefix(source.path, target)
  assert checkpoints.leaf_hex(restored[checkpoints.CONFIG_LEAF]) == other


@pytest.mark.slow
def test_phase_a_stops_at_the_first_non_finite_particle_naming_layer_and_head(
    runs, monkeypatch):
  from experiments.run import phase_a  # pylint: disable=g-import-not-at-top
  real = phase_a._stage_steps

  def poisoned(run, stage, batches, state, step_fn, n_steps, start, on_step):
    def step(state, batch):                 # the second step makes one head's particles NaN
      state, m = step_fn(state, batch)
      if int(state.step) == 2:
        poison = lambda p, v: v.at[1, 0].set(np.nan) if p[-1].key == 'particles' else v
        state = state._replace(params=jax.tree_util.tree_map_with_path(poison, state.params))
        m = dict(m, max_move=np.float32(np.nan))
      return state, m
    return real(run, stage, batches, state, step, n_steps, start, on_step)

  monkeypatch.setattr(phase_a, '_stage_steps', poisoned)
  workdir = os.path.join(runs.root, 'nan_in_phase_a')
  with pytest.raises(FloatingPointError, match=(
      r'^phase A \(stage 1/2, all layers\) step 2/4: attention_0/particles head 1 holds 8 '
      r'non-finite value\(s\); stopped before saving')):
    train.train_and_evaluate(runs.config, workdir)
  # Phase A runs first here and would have saved at its step 2 (checkpoint_every=2): the
  # NaN step raised before that save, so no checkpoint holds the NaN particles.
  assert checkpoints.checkpoint_manager(workdir).all_steps() == []


def test_non_finite_particles_names_the_first_bad_head():
  good = {'attention_0': {'particles': np.ones((2, 4, 3), np.float32)},
          'head': {'bias': np.full(2, np.nan, np.float32)}}   # not a particle: ignored
  assert checkpoints.non_finite_particles(good) is None
  good['attention_0']['particles'][1, 2, :2] = np.inf
  assert checkpoints.non_finite_particles(good) == ('attention_0/particles', 1, 2)
