"""The benchmark pages from their JSON records (``--page_from_results``).

Each benchmark command writes a record (``<stem>.json``: command, date, commit, machine,
rows) and a page (``<stem>.md``) that is a pure function of that record, so a clone
rewrites the page from the committed JSON alone, byte for byte, with nothing measured:

  python -m benchmarks.attention --page_from_results --out=benchmarks/results
"""

import os
import shlex
from typing import Callable, Sequence

from experiments.analysis import loading
from experiments.common import cli
from experiments.common import provenance


def command_flags(command: str) -> dict[str, str]:
  """``{name: value}`` of the ``--name=value`` words of a record's ``command`` (the form
  every benchmark writes: each flag once, with ``=``)."""
  return dict(word[2:].split('=', 1) for word in shlex.split(command)
              if word.startswith('--') and '=' in word)


def rewrite_page(out: str, stem: str, markdown: Callable[[dict], str],
                 run_flags: Sequence[str]) -> str:
  """``--page_from_results``: reads ``<out>/<stem>.json`` alone and rewrites
  ``<out>/<stem>.md`` with ``markdown(record)`` (``loading.rewrite_page_beside``).

  Refused in one ``cli.ConfigError`` before any write: a flag of ``run_flags`` given on the
  command line, whatever its value (it would change what is measured); then
  ``loading.rewrite_page_beside``'s refusals. Returns the page's path."""
  cli.refuse_beside_page_from_results('--out', run_flags, any_value=True)
  return loading.rewrite_page_beside(out, stem, markdown)


def write_record(out: str, stem: str, record: dict, markdown: Callable[[dict], str]) -> str:
  """A measuring run's outputs: ``<out>/<stem>.json`` (the record, first: what was measured)
  then ``<out>/<stem>.md`` (``markdown(record)``, printed too), each written atomically.
  Returns the page's text."""
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, stem)
  provenance.write_json_atomic(path + '.json', record, indent=1)
  text = markdown(record)
  print(text)
  provenance.write_atomic(path + '.md', text)
  return text
