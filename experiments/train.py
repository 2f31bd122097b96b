r"""Train and evaluate one kernel-attention text classifier (Phase A, then Phase B).

  python -m experiments.train --config=configs/sst2.py:kernel-favor --workdir=workdir/sst2/kernel-favor/seed0

or, from any folder, ``python path/to/experiments/train.py
--config=path/to/configs/sst2.py:kernel-favor,quick --workdir=...``. Every config
field with its value and comment: ``--config=configs/sst2.py --list_fields``; any
field can be overridden (``--config.phase_b.learning_rate=1e-3``). A misspelled
field, a wrong variant or a bad value ends in one line (``experiments.common.cli``).

``train_and_evaluate(config, workdir)`` is the one path from the command line to
the code:

1. checks the whole config (one ValueError naming the field) and the workdir
   before any compute or write: a workdir of another config, or whose data
   fingerprint (sha256 of every data file read and of its ``tokenizer.json``,
   ``fingerprint.json``) differs from the files now on disk, is refused with the
   changed files named; a workdir another process is using (``lock``, held with
   ``fcntl.flock`` for the run's lifetime, released by the OS if it is killed) too;
2. loads the task's splits (``coulomb_jax.tasks.data``) from ``data_dir(config)``
   (``config.data.data_dir``, else ``$COULOMB_JAX_DATA``, else ``../shared/data``
   next to the repository), trains (or reloads) the WordPiece tokenizer in
   ``workdir``, and encodes;
3. Phase A (Kernel-X only): Langevin moves of the particles on the alignment of
   per-head mean-pooled keys (``coulomb_jax.training``), until the largest move
   is below ``phase_a.tolerance`` or after ``phase_a.num_epochs``: all layers at
   once (``phase_a.schedule='joint'``), or one layer after the other on pooled
   keys computed once per layer (``'layerwise'``);
4. Phase B: AdamW on everything else, particles frozen; the epoch with the best
   validation accuracy (ties: lower log loss) is kept;
5. writes ``results.json``: validation and test metrics of the kept parameters,
   the time of each phase, the data folder and fingerprint, the config's digest
   (``config_sha256``, ``run_identity``), the command, commit and machine;
   TensorBoard scalars (flushed at every log line) and hparams go to
   ``<workdir>/tensorboard``.

Batches are sharded over all devices along a ``data`` mesh axis (parameters
replicated). ``--jax_distributed`` calls ``jax.distributed.initialize()`` first:
with ``--coordinator_address=HOST:PORT --num_processes=N --process_id=I`` on
each host, or without them on a cluster jax detects (CPU collectives: gloo).
Every process trains; process 0 alone writes the workdir's files. Orbax
checkpoints (every ``run.checkpoint_every`` steps and every epoch end; the last
two kept) make a killed run resume where it stopped, with the same result as an
uninterrupted one, on any number of processes; an unreadable latest checkpoint
is reported in one line and the previous one used; resuming with a different
config, or from a checkpoint or ``phase_a_stages.json`` written by a run of
another config (each carries the config's digest), is refused, and so is a
checkpoint holding a non-finite parameter, before any step. Ctrl-C (SIGINT) or
SIGTERM ends the run in one line on standard error: the step reached, the
checkpoint kept (its step and folder) and the command that resumes it (the same
one); exit status 130 or 143 (a checkpoint being saved is completed first). A
finished run given again is not run again: one line names its ``results.json``.
"""
# (The docstring is --help's text.) This module is the entry point and the run's
# assembly: data, model, optimisers, stages, results. The pieces live in experiments/run/:
# train_config (config checks, data folder), run_folder (RunFolder: the workdir, held here
# for the whole run; every file of it, preflight checks, lock, checkpoints through
# checkpoints, TensorBoard through summaries), sharding (the data mesh), train_flags (the
# command line), stages (what a stage shares, Ball-X), phase_a, phase_b and evaluation
# (what each stage does).

import json
import os
import signal
from typing import Optional


if __name__ == '__main__':
  # Ctrl-C or SIGTERM during the imports (seconds): one line, no traceback (nothing is
  # written before main); main's cli.stop_on_signals takes over for the run.
  from experiments.common import cli as _cli  # pylint: disable=g-import-not-at-top
  _cli.exit_on_signals()

import jax
import ml_collections
from absl import flags
from absl import logging

from experiments.common import cli
from experiments.common import provenance
from experiments.run import evaluation
from experiments.run import phase_a_report
from experiments.run import run_folder
from experiments.run import run_identity
from experiments.run import stages
from experiments.run import train_flags
from experiments.run.setup import run_stage, setup_run


# ----------------------------------------------------------------------------- main loop

def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: Optional[int] = None,
                       meta: Optional[dict] = None) -> Optional[dict]:
  """Runs (or resumes) one training run; returns the results dict, or None if stopped.

  ``workdir``: the run folder (``run_folder.RunFolder``: its layout and its life).
  ``stop_after_steps``: leave after this many optimisation steps in this call,
  with a checkpoint, as a preempted job would (for time-boxed sessions; tests
  use it to check that resuming changes nothing). The workdir's lock is released
  on return unless this process held it before the call.

  A finished run (``RunFolder.finished``: its complete ``results.json``, of this
  config, once ``preflight`` has passed) is not run again: one line on standard
  output names its results.json, and they are returned as read. A ``KeyboardInterrupt``
  (Ctrl-C; SIGTERM too under ``cli.stop_on_signals``) becomes ``cli.Stopped`` saying
  the step reached and the checkpoint kept; a checkpoint being saved is completed
  first (``cli.signals_deferred``), and no file is left half-written.
  """
  with run_folder.RunFolder(workdir) as folder:
    run = None
    try:
      fingerprint = folder.preflight(config)
      results = folder.finished(config)
      if results is not None:
        _report_finished(folder, results)
        return results
      meta = meta or provenance.run_metadata('experiments.train')
      run, sessions = setup_run(config, folder, meta, stop_after_steps=stop_after_steps,
                                fingerprint=fingerprint)
      for index in range(int(run.ckpt['stage']), len(run.stages)):
        if not run_stage(run, index) or (
            run.out_of_time() and index + 1 < len(run.stages)):
          return None
      return _finish(run, meta, sessions)
    except KeyboardInterrupt as e:
      signum = e.signum if isinstance(e, cli.Stopped) else signal.SIGINT
      raise cli.Stopped(signum, stop_message(signum, folder, run)) from None
    finally:   # Stopped, failed or finished: an event file left open makes tensorboardX's
      # exit hook print a traceback on Python 3.12 ("can't create new thread at shutdown").
      if run is not None and run.writer is not None:
        run.writer.close()


def _report_finished(folder: run_folder.RunFolder, results: dict) -> None:
  """The one line of a rerun finished run (standard output)."""
  accuracy = results['test'].get('accuracy')
  score = f' (test accuracy {accuracy:.4f})' if isinstance(accuracy, float) else ''
  print(f'{cli.program()}: this run is finished; its results are in '
        f'{folder.file(run_folder.RESULTS)}{score}. Nothing was run again.', flush=True)


def stop_message(signum: int, folder: run_folder.RunFolder,
                 run: Optional[stages.Run]) -> str:
  """What a stopped run says (``cli.Stopped``): the signal, the step reached (of how
  many), and the checkpoint kept (its step and folder) or that there is none yet."""
  name = signal.Signals(signum).name
  if run is None:
    where = 'while setting up, before its first step'
  elif run.finished_training():
    where = (f'after its last step ({run.global_step()}/{run.total_steps}), while scoring '
             'the kept parameters')
  else:
    where = f'at step {run.steps_reached()}/{run.total_steps}'
  kept = folder.kept_checkpoint()
  if kept is None:
    keep = 'no checkpoint yet (it starts again from step 0)'
  elif kept[1] is None:
    keep = f'the last checkpoint is kept in {kept[0]}'
  else:
    keep = f'the last checkpoint (step {kept[1]}) is kept in {kept[0]}'
  return f'stopped by {name} {where}; {keep}'


def _finish(run, meta, sessions) -> dict:
  """Evaluates the kept parameters; writes ``results.json`` and the test predictions."""
  ck, config = run.ckpt, run.config
  best = ck['best_params']
  digest = run_identity.digest_of(config)
  results = dict(meta, dataset=config.data.task, variant=config.variant, seed=config.seed,
                 config=config.to_dict(), config_sha256=digest,
                 split={'validation': 'validation', 'test': 'test'},
                 schedule=[s._asdict() for s in run.stages],
                 selected_from_epoch=run.select_from,
                 best_epoch=int(ck['best_epoch']),
                 phase_a_steps=int(ck['step_a']),
                 phase_a_stopped_early=bool(int(ck['stopped_early_a'])),
                 phase_a_seconds=float(ck['seconds_a']),
                 phase_b_seconds=float(ck['seconds_b']),
                 train_seconds=float(ck['seconds_a'] + ck['seconds_b']),
                 num_devices=jax.device_count(),
                 sessions=sessions,
                 num_params=int(sum(x.size for x in jax.tree.leaves(best))))
  # The data folder (relative to the repository) and the digests of what the run read.
  stored = run.folder.stored_fingerprint()
  results.update(data_dir=stored['data_dir'], fingerprint=stored['files'])
  prefix = run.folder.prefix_record()
  if prefix is not None:
    results['prefix'] = prefix   # Where the Phase B prefix was trained, and when.
  run.folder.check_stages(digest)      # Copied in since preflight: refused, not reported.
  phase_a_summary = phase_a_report.phase_a_report(run.workdir) if run.kind == 'kernel' else None
  if phase_a_summary is not None:
    results['phase_a'] = phase_a_summary
  for split in ('validation', 'test'):
    results[split], probs = evaluation.evaluate(run.predict, best, run.encoded[split],
                                                config.run.eval_batch_size, run.sharder, config,
                                                with_probs=True)
    run.folder.write_predictions(split, run.encoded[split].labels, probs)
  if run.writer is not None:
    if hasattr(run.writer, 'add_hparams'):
      run.writer.add_hparams(config, results)
  run.folder.write_json(run_folder.RESULTS, results)
  logging.info('test: %s', json.dumps(results['test']))
  return results


# ----------------------------------------------------------------------------- command line

def main(argv, flag_values: Optional[flags.FlagValues] = None) -> None:
  """The command line (``train_flags.define_flags``); mistakes raise ``cli.ConfigError``."""
  from configs import text  # pylint: disable=g-import-not-at-top
  fv = flag_values if flag_values is not None else flags.FLAGS
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected argument(s) {" ".join(argv[1:])} (flags are '
                          '--name=value).')
  config = fv.config
  if fv.list_fields:
    paths = [text.__file__, train_flags.config_file(fv['config'])]
    comments = train_flags.field_comments(*[p for p in paths if os.path.isfile(p)])
    print(train_flags.describe_fields(config, comments))
    return
  if not fv.workdir:
    raise cli.ConfigError('--workdir: required (the run folder: checkpoints, logs, results).')
  train_flags.check_flags(fv)
  handler = logging.get_absl_handler()
  if not any(isinstance(f, train_flags.QuietOrbax) for f in handler.filters):
    handler.addFilter(train_flags.QuietOrbax())
  if fv.jax_distributed:
    try:
      train_flags.init_distributed(fv.coordinator_address, fv.num_processes, fv.process_id,
                                   timeout=fv.distributed_timeout)
    except ValueError as e:    # e.g. no cluster detected and no --coordinator_address
      raise cli.ConfigError(f'--jax_distributed: {" ".join(str(e).split())} (no cluster '
                            'detected? give --coordinator_address=HOST:PORT --num_processes=N '
                            '--process_id=I)') from None
  with cli.stop_on_signals():   # SIGINT, SIGTERM: one line (cli.run), exit status 130, 143.
    train_and_evaluate(config, fv.workdir, stop_after_steps=fv.stop_after_steps)


if __name__ == '__main__':
  train_flags.define_flags()
  cli.run(main)
