"""The Colab notebooks run top to bottom (on CPU) and are committed without outputs."""

import glob
import os

import nbclient
import nbformat
import pytest

_ROOT = os.path.join(os.path.dirname(__file__), '..')
_COLAB = os.path.join(_ROOT, 'colab')
NOTEBOOKS = sorted(glob.glob(os.path.join(_COLAB, '*.ipynb')))

# Least number of figures each notebook shows.
MIN_IMAGES = {
    'particles.ipynb': 4,          # data, particles, curves, decision boundaries
    'kernel_attention.ipynb': 3,   # Phase A curves, particle norms, Phase B curves
}
# Notebooks that read GLUE SST-2 (from COULOMB_DATA_DIR, else ../shared/data).
NEEDS_SST2 = {'kernel_attention.ipynb'}


def _sst2_present() -> bool:
  data_dir = os.environ.get('COULOMB_DATA_DIR', os.path.join(_ROOT, '..', 'shared', 'data'))
  return os.path.isfile(os.path.join(data_dir, 'glue', 'SST-2', 'train.tsv'))


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_and_is_stripped(path):
  name = os.path.basename(path)
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, 'commit notebooks stripped'
  if name in NEEDS_SST2 and not _sst2_present():
    pytest.skip('GLUE SST-2 not found (set COULOMB_DATA_DIR or provide ../shared/data)')
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                                   resources={'metadata': {'path': _COLAB}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
            if o.output_type == 'error']
  assert not errors
  images = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
            if 'image/png' in o.get('data', {})]
  assert len(images) >= MIN_IMAGES.get(name, 1)
