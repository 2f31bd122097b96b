"""The library grouped by job (issue 37): each module's old flat name still imports, for one
release, as the very module of its new home with a DeprecationWarning naming it; no code,
page or notebook of this repository uses an old name."""

import os
import re
import subprocess
import sys

import coulomb_jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_old_name_is_its_new_module_with_a_warning_naming_it():
  code = '''
import importlib, sys, warnings
import coulomb_jax
for old, new in coulomb_jax._MOVED.items():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    module = getattr(coulomb_jax, old)          # what `from coulomb_jax import old` does
  assert module is importlib.import_module(new), old
  assert sys.modules[f'coulomb_jax.{old}'] is module, old      # the dotted name too
  [w] = [w for w in caught if w.category is DeprecationWarning]
  assert str(w.message).startswith(f'coulomb_jax.{old} moved to {new}; '), w.message
from coulomb_jax import pallas_attention
from coulomb_jax.pallas_attention import causal as old_causal      # a submodule, once aliased
from coulomb_jax.attention.pallas import causal
assert old_causal is causal
from coulomb_jax import models as old_models
from coulomb_jax.layers import models
assert old_models is models and old_models.KernelAttention is models.KernelAttention
print(len(coulomb_jax._MOVED))
'''
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == str(len(coulomb_jax._MOVED))


def test_an_unknown_name_is_still_an_attribute_error():
  try:
    coulomb_jax.no_such_module  # pylint: disable=pointless-statement
  except AttributeError as e:
    assert "has no attribute 'no_such_module'" in str(e)
  else:
    raise AssertionError('coulomb_jax.no_such_module did not raise')


def test_no_file_of_the_repository_uses_an_old_name():
  old = '|'.join(coulomb_jax._MOVED)
  pattern = re.compile(rf'from coulomb_jax import ({old})\b|coulomb_jax\.({old})\b'
                       rf'|coulomb_jax/({old})(\.py|/)')
  files = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard'],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  found = []
  for path in files:
    if (path.startswith(('results/', 'benchmarks/results/')) or path == 'coulomb_jax/__init__.py'
        or path == 'tests/pages/test_moved_modules.py'
        or not path.endswith(('.py', '.md', '.ipynb', '.sh', '.cfg', '.ini', '.toml'))):
      continue
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
      continue
    with open(full, encoding='utf-8') as f:
      for n, line in enumerate(f, 1):
        if pattern.search(line):
          found.append(f'{path}:{n}: {line.strip()}')
  assert not found, '\n'.join(found)


def test_the_lm_step_names_moved_to_training_still_resolve_from_layers_with_a_warning():
  # layers.lm keeps the model; its loss, optimiser and steps live in training.lm.
  code = '''
import warnings
from coulomb_jax.layers import lm
from coulomb_jax.training import lm as steps
for name in lm._MOVED_TO_TRAINING:
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    assert getattr(lm, name) is getattr(steps, name), name
  [w] = [w for w in caught if w.category is DeprecationWarning]
  assert str(w.message).startswith(f'coulomb_jax.layers.lm.{name} moved to '
                                   f'coulomb_jax.training.lm.{name}'), w.message
try:
  lm.no_such_name
except AttributeError as e:
  assert "has no attribute 'no_such_name'" in str(e)
else:
  raise AssertionError('lm.no_such_name did not raise')
print(len(lm._MOVED_TO_TRAINING))
'''
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == '12'
  moved = '|'.join(('train_step', 'train_step_fn', 'make_state', 'make_optimizer',
                    'MimicrySettings', 'mqar_loss_and_accuracy', 'force_terms', 'evaluate',
                    'mimicry_forces', 'mimicry_force_terms', 'check_feature_map',
                    'answer_positions'))
  pattern = re.compile(rf'(?<![.\w])lm\.({moved})\b|layers\.lm\.({moved})\b')
  files = subprocess.run(['git', 'ls-files', '*.py', '*.md', '*.ipynb'], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
  found = [f'{p}:{n}' for p in files
           if p not in ('coulomb_jax/layers/lm.py', 'tests/pages/test_moved_modules.py')
           and os.path.isfile(os.path.join(ROOT, p))
           for n, line in enumerate(open(os.path.join(ROOT, p), encoding='utf-8'), 1)
           if pattern.search(line)]
  assert not found, found
