"""docs/own_model.md runs as written: every python block, in order, in one namespace."""

import os
import re
import pytest

_PAGE = os.path.join(os.path.dirname(os.path.dirname(__file__)), '..', 'docs', 'own_model.md')


@pytest.mark.slow
def test_own_model_page_runs():
  with open(_PAGE, encoding='utf-8') as f:
    blocks = re.findall(r'```python\n(.*?)```', f.read(), re.S)
  assert len(blocks) >= 11
  namespace = {}
  for i, block in enumerate(blocks):
    code = compile(block, f'docs/own_model.md (block {i + 1})', 'exec')
    exec(code, namespace)  # pylint: disable=exec-used
