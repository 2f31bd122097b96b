"""The house's import rules (issue 37): library ← tools ← studies, read from the source.

* ``coulomb_jax`` imports nothing from ``experiments``, ``studies``, ``configs`` or
  ``benchmarks``;
* ``configs`` import neither ``experiments`` nor ``studies``;
* outside the library, nothing imports the private ``coulomb_jax._checks`` (the public
  ``coulomb_jax.checks`` holds the same checks);
* no command module of ``experiments`` (a module with a ``__main__`` block) imports another
  command module; the ones that still do are listed in ``KNOWN`` and must shrink: a pair
  that no longer holds fails the test until it is taken off the list.
"""

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KNOWN = {
    ('experiments.mimicry.encoders', 'experiments.train'),
    ('experiments.phase_a_drift', 'experiments.grid'),
    ('experiments.phase_a_drift', 'experiments.train'),
    ('experiments.phase_a_pilot', 'experiments.grid'),
    ('experiments.phase_a_pilot', 'experiments.train'),
    ('experiments.phase_a_softmax', 'experiments.phase_a_repulsion'),
}
"""(importer, command) pairs that break the command rule today, to move into parts."""


def _module(path):
  name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
  return name[:-len('.__init__')] if name.endswith('.__init__') else name


def _imports(path):
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out.add(node.module)
      out.update(f'{node.module}.{a.name}' for a in node.names)
  return out


def _sources(*folders):
  for folder in folders:
    for path in sorted(glob.glob(os.path.join(ROOT, folder, '**', '*.py'), recursive=True)):
      yield _module(path), _imports(path)


def _top(name):
  return name.split('.')[0]


def test_the_library_imports_no_tool_study_config_or_benchmark():
  bad = [(m, i) for m, imports in _sources('coulomb_jax') for i in imports
         if _top(i) in ('experiments', 'studies', 'configs', 'benchmarks')]
  assert not bad


def test_configs_import_no_tool_or_study():
  bad = [(m, i) for m, imports in _sources('configs') for i in imports
         if _top(i) in ('experiments', 'studies')]
  assert not bad


def test_nothing_outside_the_library_imports_its_private_checks():
  bad = [m for m, imports in _sources('experiments', 'configs', 'benchmarks', 'studies')
         if any(i == 'coulomb_jax._checks' for i in imports)]
  assert not bad


def test_no_command_imports_another_command_beyond_the_known_ones():
  commands = {_module(p) for p in glob.glob(os.path.join(ROOT, 'experiments', '*.py'))
              if "__name__ == '__main__'" in open(p, encoding='utf-8').read()}
  found = {(m, i) for m, imports in _sources('experiments') for i in imports
           if i in commands and i != m}
  assert found - KNOWN == set(), 'new command-to-command imports'
  assert KNOWN - found == set(), 'fixed: take these off KNOWN'
