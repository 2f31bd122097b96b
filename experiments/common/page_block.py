"""A generated block of a hand-written page: the text between two marker lines is
replaced, the rest (the answer, in words) kept as written."""

import os

from experiments.common import provenance


def write_block(page: str, begin: str, end: str, lines: list) -> None:
  """``page`` with ``begin``, ``lines``, ``end`` in place of its old block (appended if it
  has none; a new page if it does not exist), written atomically."""
  block = '\n'.join([begin] + list(lines) + [end])
  text = ''
  if os.path.exists(page):
    with open(page, encoding='utf-8') as f:
      text = f.read()
  if begin in text and end in text:
    head, rest = text.split(begin, 1)
    text = head + block + rest.split(end, 1)[1]
  else:
    text = text + ('\n' if text else '') + block + '\n'
  provenance.write_atomic(page, text)
