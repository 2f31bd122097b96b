"""The Colab notebooks run top to bottom (on CPU) and are committed without outputs."""

import glob
import os

import nbclient
import nbformat
import pytest

_COLAB = os.path.join(os.path.dirname(__file__), '..', 'colab')
NOTEBOOKS = sorted(glob.glob(os.path.join(_COLAB, '*.ipynb')))


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_and_is_stripped(path):
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, 'commit notebooks stripped'
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                                   resources={'metadata': {'path': _COLAB}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
            if o.output_type == 'error']
  assert not errors
  images = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs
            if 'image/png' in o.get('data', {})]
  assert len(images) >= 4          # data, particles, curves, decision boundaries
