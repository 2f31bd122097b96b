"""The Colab notebooks run top to bottom (on CPU, with ``TEST_SIZES``' smaller data) and are
committed without outputs.

Here coulomb_jax is importable, so each notebook's install cell does nothing; the
install itself is for Colab (checked by reading the cell: one source variable, a
plain pip install, no editable install, no restart).
"""

import glob
import os
import re

import nbclient
import nbformat
import pytest

_ROOT = os.path.join(os.path.dirname(os.path.dirname(__file__)), '..')
_COLAB = os.path.join(_ROOT, 'colab')
NOTEBOOKS = sorted(glob.glob(os.path.join(_COLAB, '*.ipynb')))

# Least number of figures each notebook shows.
MIN_IMAGES = {
    'particles.ipynb': 4,          # data, particles, curves, decision boundaries
    'kernel_attention.ipynb': 3,   # Phase A curves, particle norms, Phase B curves
}
# Notebooks that read GLUE SST-2 (outside Colab from COULOMB_JAX_DATA, else ../shared/data).
NEEDS_SST2 = {'kernel_attention.ipynb'}
# The extras each notebook installs on Colab.
EXTRAS = {'particles.ipynb': 'experiments', 'kernel_attention.ipynb': 'experiments,tfds'}
# Smaller sizes for the test run, as (the committed line, the line run here): the same
# cells and code paths in less time (kernel_attention: 4 batches per epoch instead of 16,
# shorter sequences; the running mean of its Phase A plot still has 12 - 1 > 8 steps).
TEST_SIZES = {
    'kernel_attention.ipynb': [(
        'SEED, N_TRAIN, N_VAL, MAX_LENGTH, BATCH = 0, 512, 256, 64, 32',
        'SEED, N_TRAIN, N_VAL, MAX_LENGTH, BATCH = 0, 128, 64, 32, 32')],
}


def _sst2_present() -> bool:
  data_dir = os.environ.get('COULOMB_JAX_DATA') or os.path.join(_ROOT, '..', 'shared', 'data')
  return os.path.isfile(os.path.join(data_dir, 'glue', 'SST-2', 'train.tsv'))


def _with_test_sizes(nb, name):
  """``nb`` with each of ``TEST_SIZES[name]``'s committed lines replaced (each must be in
  exactly one code cell, so a changed notebook fails here instead of running full size)."""
  for old, new in TEST_SIZES.get(name, ()):
    cells = [c for c in nb.cells if c.cell_type == 'code' and old in c.source.splitlines()]
    assert len(cells) == 1, f'{name}: expected one cell with the line {old!r}'
    cells[0].source = '\n'.join(new if line == old else line
                                for line in cells[0].source.splitlines())
  return nb


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_install_cell_is_one_plain_pip_install_from_one_source(path):
  nb = nbformat.read(path, as_version=4)
  first = next(c for c in nb.cells if c.cell_type == 'code')
  src = first.source
  # One clearly named source, at the top, in the real form of a pip source.
  [source] = re.findall(r"^COULOMB_JAX_SOURCE = '([^']+)'$", src, flags=re.M)
  assert re.fullmatch(r'git\+https://github\.com/[\w.-]+/[\w.-]+\.git@[\w./-]+', source)
  code = '\n'.join(l for l in src.splitlines() if not l.lstrip().startswith('#'))
  assert code.count('COULOMB_JAX_SOURCE') == 2           # defined once, read once
  assert f"EXTRAS = '{EXTRAS[os.path.basename(path)]}'" in src
  # A plain install (no -e: nothing for the running kernel to pick up after a restart) ...
  assert "'-m', 'pip', 'install', '-q'," in src and "f'coulomb_jax[{EXTRAS}] @ {source}'" in src
  assert "'-e'" not in src and '--upgrade' not in src and '-U' not in src.split()
  # ... only on Colab and only when the package is missing: a no-op here and in CI.
  assert "if importlib.util.find_spec('coulomb_jax') is None:" in src
  assert "if 'google.colab' not in sys.modules:" in src
  # No other cell installs anything or asks for a restart.
  for cell in nb.cells[1:]:
    if cell is not first and cell.cell_type == 'code':
      assert 'pip' not in cell.source and 'restart' not in cell.source.lower()


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_and_is_stripped(path):
  name = os.path.basename(path)
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, 'commit notebooks stripped'
  if name in NEEDS_SST2 and not _sst2_present():
    pytest.skip('GLUE SST-2 not found (set COULOMB_JAX_DATA or provide ../shared/data)')
  nb = _with_test_sizes(nb, name)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                                   resources={'metadata': {'path': _COLAB}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
            if o.output_type == 'error']
  assert not errors
  images = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
            if 'image/png' in o.get('data', {})]
  assert len(images) >= MIN_IMAGES.get(name, 1)
