r"""The command line of ``experiments/train.py``: its flags, their checks, ``--list_fields``.

``define_flags`` declares ``--config`` (a config file and variant, any field
overridable), ``--workdir``, ``--list_fields``, ``--stop_after_steps`` and the
``jax.distributed`` flags; ``check_flags`` refuses a bad combination of them in one
``cli.ConfigError``. ``describe_fields`` is what ``--list_fields`` prints: every
field with its value and the comment above it in the config files
(``field_comments``). ``init_distributed`` starts ``jax.distributed`` (gloo for
CPU collectives); ``QuietOrbax`` keeps orbax's per-save INFO lines (and jax's about
backends it did not find) out of the log.
"""

import logging as std_logging
import os
import re
import textwrap
import threading
from typing import Optional

import jax
import ml_collections
from absl import flags
from absl import logging

from experiments.common import cli
from experiments.run import train_config

# The flags ``define_flags`` declares belong to its caller (``python -m experiments.train
# --help`` lists them under train.py, as when they were defined there).
flags.disclaim_key_flags()


def define_flags(flag_values: Optional[flags.FlagValues] = None) -> None:
  """The flags of ``python -m experiments.train`` (on ``flag_values``, default absl's)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  fv = flag_values if flag_values is not None else flags.FLAGS
  config_flags.DEFINE_config_file(
      'config', None, 'A config file and variant, e.g. configs/sst2.py:kernel-favor,quick; '
      'override any field with --config.<field>=<value>; --list_fields prints them all.',
      lock_config=True, flag_values=fv)
  flags.DEFINE_string('workdir', None, 'The run folder: checkpoints, logs, results.',
                      flag_values=fv)
  flags.DEFINE_bool('list_fields', False, 'Print every field of --config with its value and '
                    'comment, then exit.', flag_values=fv)
  flags.DEFINE_bool('jax_distributed', False, 'Call jax.distributed.initialize() first '
                    '(multi-process or multi-host training).', flag_values=fv)
  flags.DEFINE_string('coordinator_address', None, 'With --jax_distributed: HOST:PORT of '
                      'process 0 (default: detected on a cluster).', flag_values=fv)
  flags.DEFINE_integer('num_processes', None, 'With --jax_distributed: how many processes.',
                       flag_values=fv)
  flags.DEFINE_integer('process_id', None, 'With --jax_distributed: this process, 0 .. '
                       'num_processes − 1.', flag_values=fv)
  flags.DEFINE_integer('distributed_timeout', 300, 'With --jax_distributed: seconds to wait '
                       'for the coordinator and every process to connect, then one error '
                       'line (exit status 2) instead of jaxlib aborting.', flag_values=fv)
  flags.DEFINE_integer('stop_after_steps', None, 'Checkpoint and exit after this many steps '
                       '(resumable).', flag_values=fv)
  flags.mark_flag_as_required('config', flag_values=fv)


def check_flags(fv) -> None:
  """The flags besides --config (the config itself is ``train_config.check_config``'s)."""
  given = [n for n in ('coordinator_address', 'num_processes', 'process_id')
           if fv[n].value is not None]
  if given and not fv.jax_distributed:
    raise cli.ConfigError(f'--{given[0]}={fv[given[0]].value}: needs --jax_distributed.')
  if given and len(given) < 3:
    missing = [f'--{n}' for n in ('coordinator_address', 'num_processes', 'process_id')
               if n not in given]
    raise cli.ConfigError(f'--{given[0]}={fv[given[0]].value}: give --coordinator_address, '
                          f'--num_processes and --process_id together (missing '
                          f'{", ".join(missing)}), or none of them on a cluster.')
  if given:
    if not re.fullmatch(r'\S+:\d+', fv.coordinator_address):
      raise cli.ConfigError(f'--coordinator_address: expected HOST:PORT, got '
                            f'{fv.coordinator_address!r}.')
    if fv.num_processes < 1:
      raise cli.ConfigError(f'--num_processes: expected an integer ≥ 1, got '
                            f'{fv.num_processes}.')
    if not 0 <= fv.process_id < fv.num_processes:
      raise cli.ConfigError(f'--process_id: expected 0 .. {fv.num_processes - 1} (for '
                            f'--num_processes={fv.num_processes}), got {fv.process_id}.')
  if fv.distributed_timeout < 1:
    raise cli.ConfigError(f'--distributed_timeout: expected an integer ≥ 1 (seconds), got '
                          f'{fv.distributed_timeout}.')
  if fv.stop_after_steps is not None and fv.stop_after_steps < 1:
    raise cli.ConfigError(f'--stop_after_steps: expected an integer ≥ 1, got '
                          f'{fv.stop_after_steps}.')


def init_distributed(coordinator_address: Optional[str] = None,
                     num_processes: Optional[int] = None,
                     process_id: Optional[int] = None, *, timeout: int = 300) -> None:
  """``jax.distributed.initialize``, with gloo for collectives between CPU processes.

  All three None: jax detects the cluster (SLURM, Open MPI, Cloud TPU, ...). If the
  processes have not all connected after ``timeout`` seconds, jaxlib would abort the
  interpreter (SIGABRT, a C++ stack trace, no Python exception), so a watchdog thread
  prints one error line naming the address and exits with status 2 first (nothing has
  been written by then). jax's own timeout is set a minute later, as a backstop.
  """
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  done = threading.Event()

  def watchdog():
    if done.wait(timeout):
      return
    where = coordinator_address or 'the detected coordinator'
    if process_id is None:
      who = 'this process: the processes of the detected cluster did not all connect'
    elif process_id == 0:
      who = (f'process 0 (the coordinator, at {where}): the other {num_processes - 1} '
             f'process(es) did not connect')
    else:
      who = f'process {process_id} of {num_processes}: no coordinator answered at {where}'
    cli.fail(f'--jax_distributed: {who} within --distributed_timeout={timeout} s (are all '
             f'{num_processes or "the"} processes started, with the same '
             f'--coordinator_address and --num_processes?)', exit_now=True)

  threading.Thread(target=watchdog, daemon=True, name='distributed-watchdog').start()
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=timeout + 60)
  finally:
    done.set()
  logging.info('jax.distributed: process %d of %d, %d of %d devices here.',
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())


def config_file(holder) -> str:
  """The file of a ``config_flags`` flag: ``configs/sst2.py:kernel-elu`` → ``configs/sst2.py``."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  name = config_flags.get_config_filename(holder)
  return name if os.path.isfile(name) else name.rsplit(':', 1)[0]


_FIELD_LINE = re.compile(r'(?:config|c)\.[\w.]+\s*=')
_SECTION_DEF = re.compile(r'def _(\w+)\(')
_BUILDER_CALL = re.compile(r'common\.(add_\w+)\((config\.[\w.]+|c)\b')


def _builder_comments(path: str) -> dict:
  """``{'add_langevin': {'step_size': comment, ...}}`` of a ``configs/common.py``."""
  out, builder, block = {}, None, []
  with open(path, encoding='utf-8') as f:
    for line in f:
      text = line.strip()
      match = re.match(r'def (add_\w+)\(', text)
      if match:
        builder, block = match.group(1), []
        out[builder] = {}
        continue
      if text.startswith('#'):
        block.append(text.lstrip('#').strip())
        continue
      match = re.match(r'section\.(\w+)\s*=', text)
      if builder and match and block:
        out[builder].setdefault(match.group(1), ' '.join(block))
      block = []
  return out


def field_comments(*paths: str) -> dict:
  """``{'data.task': 'Task name from ...'}``: the comment above each field's first
  assignment in these config files: ``config.<field> = ...``; ``c.<field> = ...`` inside
  a section builder ``def _<section>()`` (configs/text.py); and the fields a
  ``common.add_<block>(<section>, ...)`` call sets, with configs/common.py's comments."""
  comments = {}

  def add(field, comment):
    if comment and field not in comments:
      comments[field] = comment

  for path in paths:
    block, section, builders, note, after_call = [], '', None, '', False
    with open(path, encoding='utf-8') as f:
      for line in f:
        text = line.strip()
        if text.startswith('#'):
          block.append(text.lstrip('#').strip())
          continue
        match = _SECTION_DEF.match(text)
        if match:
          section = match.group(1)
        elif not line.startswith((' ', '\t')) and text:
          section = ''
        match = _BUILDER_CALL.search(text)
        # The comment above a run of builder calls (and their continuation lines) is the
        # config's note on all their fields.
        note = ' '.join(block) if block else (note if match and after_call else '')
        continued = after_call and text.endswith(')') and not _FIELD_LINE.match(text)
        after_call = bool(match) or continued
        if match:
          target = match.group(2)
          prefix = target[len('config.'):] if target.startswith('config.') else section
          if builders is None:
            common = os.path.join(os.path.dirname(os.path.abspath(path)), 'common.py')
            builders = _builder_comments(common) if os.path.isfile(common) else {}
          for field, comment in builders.get(match.group(1), {}).items():
            add(f'{prefix}.{field}' if prefix else field, f'{comment} {note}'.strip())
        match = re.match(r'config\.([\w.]+)\s*=', text)
        if match and block:
          add(match.group(1), ' '.join(block))
        match = re.match(r'c\.([\w.]+)\s*=', text)
        if match and block and section:
          add(f'{section}.{match.group(1)}', ' '.join(block))
        block = []
  return comments


def describe_fields(config: ml_collections.ConfigDict, comments: dict) -> str:
  """Every field as ``--config.<field>=<value>`` with its comment below it."""
  lines = []
  for key, value in train_config.flat(config).items():
    lines.append(f'--config.{key}={value!r}')
    lines += textwrap.wrap(comments.get(key, ''), 88, initial_indent='    ',
                           subsequent_indent='    ')
  return '\n'.join(lines)


class QuietOrbax(std_logging.Filter):
  """Drops orbax's per-save INFO lines, and jax's INFO line about each accelerator backend
  it did not find ("Unable to initialize backend 'tpu'", on every machine without one);
  warnings and errors still pass."""

  def filter(self, record):
    if record.levelno >= std_logging.WARNING:
      return True
    if record.pathname.endswith('xla_bridge.py'):
      return not str(record.msg).startswith('Unable to initialize backend')
    return '/orbax/' not in record.pathname
