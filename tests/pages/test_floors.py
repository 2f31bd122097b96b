"""The house's import rules (issue 37): library ← tools ← studies, read from the source.

* ``coulomb_jax`` imports nothing from ``experiments``, ``studies``, ``configs`` or
  ``benchmarks``;
* ``configs`` import neither ``experiments`` nor ``studies``;
* outside the library, nothing imports the private ``coulomb_jax._checks`` (the public
  ``coulomb_jax.checks`` holds the same checks);
* ``experiments`` holds the tools: at most six command modules at its top level (a module
  with a ``__main__`` block), none importing another, none importing ``studies``;
* a study (``studies/<name>/``) imports the library and the tools' parts, never a tool's
  command module nor another study;
* the tests follow the floors: ``tests/library`` tests use the library alone,
  ``tests/tools`` no study, ``tests/studies`` anything (``tests/pages``: the README, the
  docs pages, the notebooks and these rules). A test's floor counts what it imports, the
  commands and config files it names, and the floor of any test module it imports.
"""

import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def test_the_library_is_grouped_by_job_and_its_packages_import_downwards():
  # Issue 37: the packages of the sketch, the particle model's modules at the top level.
  top = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, 'coulomb_jax', '*.py')))
  packages = sorted(os.path.basename(os.path.dirname(p)) for p in
                    glob.glob(os.path.join(ROOT, 'coulomb_jax', '*', '__init__.py')))
  assert packages == ['attention', 'baselines', 'conversion', 'features', 'layers', 'tasks',
                      'training']
  assert top == ['__init__', '_checks', 'alignment', 'checks', 'diagnostics',
                 'hamiltonian', 'langevin', 'langevin_diagnostics', 'metrics', 'mimicry',
                 'parallel', 'repulsion']
  # The particle model and the attention paths never import the Flax side, training or a
  # task; attention never imports layers (the layers are built on it).
  lower = ('coulomb_jax.features', 'coulomb_jax.attention', 'coulomb_jax.alignment',
           'coulomb_jax.repulsion', 'coulomb_jax.hamiltonian', 'coulomb_jax.langevin',
           'coulomb_jax.parallel')
  upper = ('coulomb_jax.layers', 'coulomb_jax.training', 'coulomb_jax.tasks',
           'coulomb_jax.conversion', 'coulomb_jax.baselines')
  bad = [(m, i) for m, imports in _sources('coulomb_jax') for i in imports
         if m.startswith(lower) and i.startswith(upper)]
  assert not bad
  # The layers are what training trains: training imports layers, never the reverse (the
  # causal LM's step lives in training.lm, beside the model's other steps).
  assert not [(m, i) for m, imports in _sources('coulomb_jax') for i in imports
              if m.startswith('coulomb_jax.layers') and i.startswith('coulomb_jax.training')]


def test_no_module_of_the_library_tools_or_studies_is_over_500_lines():
  long = []
  for folder in ('coulomb_jax', 'experiments', 'studies', 'configs'):
    for path in glob.glob(os.path.join(ROOT, folder, '**', '*.py'), recursive=True):
      with open(path, encoding='utf-8') as f:
        n = sum(1 for _ in f)
      if n > 500:
        long.append((os.path.relpath(path, ROOT), n))
  assert not long


def test_configs_import_no_tool_or_study():
  bad = [(m, i) for m, imports in _sources('configs') for i in imports
         if _top(i) in ('experiments', 'studies')]
  assert not bad


def test_nothing_outside_the_library_imports_its_private_checks():
  bad = [m for m, imports in _sources('experiments', 'configs', 'benchmarks', 'studies')
         if any(i == 'coulomb_jax._checks' for i in imports)]
  assert not bad


def _commands():
  return {_module(p) for p in glob.glob(os.path.join(ROOT, 'experiments', '*.py'))
          if "__name__ == '__main__'" in open(p, encoding='utf-8').read()}


def test_the_tools_are_at_most_six_commands_importing_no_command_and_no_study():
  commands = _commands()
  assert len(commands) <= 6, sorted(commands)
  found = {(m, i) for m, imports in _sources('experiments') for i in imports
           if (i in commands and i != m) or _top(i) == 'studies'}
  assert not found


def test_a_study_imports_no_tool_command_and_no_other_study():
  commands = _commands()
  bad = {(m, i) for m, imports in _sources('studies') for i in imports
         if i in commands or (_top(i) == 'studies' and len(i.split('.')) > 1
                              and i.split('.')[1] != m.split('.')[1])}
  assert not bad


_FLOORS = ('library', 'tools', 'studies')
_NAMED = re.compile(r"['\"/ -](experiments|studies|benchmarks|configs)[./]")


def test_each_test_sits_on_the_floor_of_what_it_uses():
  where = {os.path.basename(p)[:-3]: p.split(os.sep)[-2]
           for p in glob.glob(os.path.join(ROOT, 'tests', '*', 'test_*.py'))}
  assert set(where.values()) <= set(_FLOORS) | {'pages'}, sorted(set(where.values()))
  assert not glob.glob(os.path.join(ROOT, 'tests', 'test_*.py'))     # none left on top
  bad = []
  for name, floor in where.items():
    if floor == 'pages':
      continue
    path = os.path.join(ROOT, 'tests', floor, name + '.py')
    used = {_top(i) for i in _imports(path)}
    used |= set(_NAMED.findall(open(path, encoding='utf-8').read()))
    need = 'studies' if 'studies' in used else (
        'tools' if used & {'experiments', 'configs', 'benchmarks'} else 'library')
    for helper in used & set(where):
      if where[helper] in _FLOORS and _FLOORS.index(where[helper]) > _FLOORS.index(need):
        need = where[helper]
    if _FLOORS.index(need) > _FLOORS.index(floor):
      bad.append((f'tests/{floor}/{name}.py', need))
  assert not bad, bad
