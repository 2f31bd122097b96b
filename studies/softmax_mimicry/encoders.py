r"""The trained softmax encoders the mimicry study reads, and every head's (q, k, v).

A finished ``experiments.train`` run of the ``softmax`` variant holds its config
(``config.json``), its tokenizer and its kept (best-validation) parameters. The encoder's
attention is ``nn.MultiHeadDotProductAttention`` with W_q, W_k, W_v (the softmax model
always projects; ``model.qk_mode`` does not apply to it), so the queries and keys the
features must mimic are the projections ``q = x W_q``, ``k = x W_k`` of the layer's
LayerNorm'd input, ``[B, L, H, D_h]``, and softmax(q kᵀ/√D_h) is the head's attention.

``head_batches`` runs the encoder (no dropout) over rows of a split and returns, per
batch, every layer's and head's q, k, v stacked on one *group* axis ``G = layers × heads``
(group ``g = layer·H + head``), so every head is fitted and measured at once (vmapped);
the projections are read by ``coulomb_jax.conversion.attention_records``.
"""

import os
from typing import List, NamedTuple

import jax
import ml_collections
import numpy as np

from coulomb_jax import conversion
from coulomb_jax.layers import models
from coulomb_jax.tasks import data
from experiments.common import cli
from experiments.run import run_folder
from experiments.run import setup as run_setup
from experiments.run import train_config


class Encoder(NamedTuple):
  """One trained softmax encoder: its run, config, model, parameters and data."""
  run_dir: str
  config: ml_collections.ConfigDict
  model: models.EncoderClassifier
  params: dict
  encoded: dict            # {'train', 'validation', 'test'}: data.Encoded
  results: dict            # the run's results.json


def run_dir(runs: str, dataset: str, seed: int) -> str:
  return os.path.join(runs, dataset, 'softmax', f'seed{seed}')


def check_run(path: str) -> None:
  """A finished softmax run, or one ``cli.ConfigError`` naming the folder."""
  results = os.path.join(path, run_folder.RESULTS)
  if not os.path.isfile(results):
    raise cli.ConfigError(f'--runs: {path} has no {run_folder.RESULTS} (not a finished run); '
                          'train it first (docs/softmax_mimicry.md).')
  variant = run_folder.read_json(results).get('variant')
  if variant != 'softmax':
    raise cli.ConfigError(f'--runs: {path} is a {variant!r} run, not a softmax encoder.')


def _params(path):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.abspath(path), 'checkpoints')
  steps = sorted(int(s) for s in os.listdir(root) if s.isdigit())
  return ocp.StandardCheckpointer().restore(
      os.path.join(root, str(steps[-1]), 'default'))['best_params']


def _load_data(config, path):
  """The run's splits encoded with its own tokenizer (as ``experiments.train`` read them)."""
  d = config.data
  if d.max_train_examples or d.max_eval_examples:
    raise cli.ConfigError(f'{path}: a run on a subset (data.max_train_examples='
                          f'{d.max_train_examples}, data.max_eval_examples='
                          f'{d.max_eval_examples}); the study reads full-data runs.')
  tok = (data.load_vocab_tokenizer(d.vocab_file) if d.vocab_file
         else data.load_tokenizer(os.path.join(path, run_folder.TOKENIZER)))
  root = train_config.data_dir(config)
  encoded = {s: data.encode(tok, data.load_split(d.task, root, s,
                                                 validation_size=d.validation_size,
                                                 validation_rule=d.validation_rule),
                            d.max_length)
             for s in ('train', 'validation', 'test')}
  return encoded, tok.get_vocab_size()


def load_encoder(path: str) -> Encoder:
  """The finished softmax run at ``path``: its config, tokenizer, data and kept parameters."""
  check_run(path)
  config = ml_collections.ConfigDict(
      run_folder.with_added_fields(run_folder.read_json(os.path.join(path, 'config.json'))))
  encoded, vocab_size = _load_data(config, path)
  model = run_setup.make_model(config, vocab_size)
  return Encoder(path, config, model, _params(path), encoded,
                 run_folder.read_json(os.path.join(path, run_folder.RESULTS)))


def split_rows(encoder: Encoder, split: str, size: int, seed: int, skip: int = 0):
  """A fixed random ``size`` rows of ``split`` after the first ``skip`` of the same draw.

  Rows ``[skip, skip + size)`` of one permutation drawn from ``default_rng(seed)``: two
  calls with ``skip`` = 0 and ``skip`` = the first size are disjoint.
  """
  enc = encoder.encoded[split]
  n = len(enc.labels)
  if skip + size > n:
    raise cli.ConfigError(f'{split}: {skip + size} rows asked for, {encoder.run_dir} has {n}.')
  keep = np.sort(np.random.default_rng(seed).permutation(n)[skip:skip + size])
  return data.Encoded([enc.ids[i] for i in keep], [enc.segments[i] for i in keep],
                      np.asarray(enc.labels)[keep])


def _make_capture(model):
  """Jitted ``capture(params, batch) -> {q, k, v: [G, B, L, D_h]}``: every layer's heads on
  one group axis (``conversion.attention_records`` and ``stack_heads``)."""
  inputs = lambda b: (b['ids'], b['segments'], b['mask'])

  @jax.jit
  def capture(params, batch):
    records = conversion.attention_records(model, {'params': params}, batch, inputs=inputs)
    stacked, _ = conversion.stack_heads(records)
    return {n: stacked[n] for n in 'qkv'}
  return capture


def head_batches(encoder: Encoder, rows: data.Encoded, batch_size: int,
                 pad_multiple: int, seed=None) -> List[dict]:
  """Per batch ``{q, k, v: [G, B, L, D_h], mask: [B, L], labels: [B] (±1)}`` (numpy).

  Length-bucketed batches of ``rows`` (``seed``: shuffled as ``data.batches``; None: in
  order); padding rows are all-False in ``mask``.
  """
  if encoder.config.model.attention != 'softmax':
    raise cli.ConfigError(f'{encoder.run_dir}: model.attention is '
                          f'{encoder.config.model.attention!r}, not softmax.')
  capture = _make_capture(encoder.model)
  out = []
  for batch in data.batches(rows, batch_size, seed=seed, pad_multiple=pad_multiple):
    qkv = {n: np.asarray(a) for n, a in capture(encoder.params, batch).items()}
    out.append(dict(qkv, mask=batch['mask'],
                    labels=np.where(batch['weights'] > 0, 2.0 * batch['labels'] - 1.0, 0.0)
                    .astype(np.float32)))
  return out


def num_groups(encoder: Encoder) -> int:
  return encoder.config.model.num_layers * encoder.config.model.num_heads


def head_dim(encoder: Encoder) -> int:
  return encoder.config.model.width // encoder.config.model.num_heads

