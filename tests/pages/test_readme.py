"""The README's code example runs as written."""

import os
import re

import numpy as np

_README = os.path.join(os.path.dirname(os.path.dirname(__file__)), '..', 'README.md')


def test_readme_example_runs(capsys):
  with open(_README, encoding='utf-8') as f:
    blocks = re.findall(r'```python\n(.*?)```', f.read(), re.S)
  assert len(blocks) == 1
  exec(compile(blocks[0], 'README.md', 'exec'), {})   # pylint: disable=exec-used
  energy, align = map(float, capsys.readouterr().out.split())
  assert np.isfinite(energy) and align > 0
