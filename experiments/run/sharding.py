r"""Devices and processes of a run: batches sharded over a ``data`` mesh, and a barrier.

``Sharder`` lays a 1-D ``data`` mesh over all devices (across hosts): a batch's
rows are split over it, parameters and the checkpointed state are replicated.
Every process holds the whole global batch and each device takes its rows of
it. ``sync(name)`` waits for every process (nothing with one process).
"""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def sync(name: str) -> None:
  """A barrier of all processes (nothing with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


class Sharder:
  """Puts host batches on a 1-D ``data`` mesh (rows split, the rest replicated).

  ``devices``: the mesh's devices (default: all of them, across hosts).
  """

  def __init__(self, devices=None):
    self.mesh = Mesh(np.array(devices or jax.devices()), ('data',))
    self.rows = NamedSharding(self.mesh, P('data'))
    self.replicated = NamedSharding(self.mesh, P())

  def batch(self, batch):
    """Every host holds the whole global batch; each device takes its rows of it."""
    put = lambda x: jax.make_array_from_callback(x.shape, self.rows, lambda index: x[index])
    return {k: put(v) for k, v in batch.items()}

  def replicate(self, tree):
    """``tree`` on every device. With several processes, a leaf that is not yet a global
    array is taken as this process's value (each process holds the same one)."""
    if jax.process_count() == 1:
      return jax.device_put(tree, self.replicated)

    def put(x):
      if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(x, self.replicated)
      host = np.asarray(x)
      return jax.make_array_from_callback(host.shape, self.replicated, lambda index: host[index])

    return jax.tree.map(put, tree)

  def abstract(self, tree):
    """The shapes and dtypes of ``tree``, replicated: a restore target for orbax."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=self.replicated), tree)

  @staticmethod
  def to_host(x):
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)
