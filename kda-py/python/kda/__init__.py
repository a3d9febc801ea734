"""kda: Kimi Delta Attention on the CPU.

* :func:`chunk_kda` and :func:`fused_recurrent_kda`: drop-ins for fla-core 0.6.0's
  ``fla.ops.kda`` functions (same signatures, shapes and results) on torch CPU tensors or
  numpy arrays.
* :class:`KdaLayer`: one KDA layer of a Kimi Linear / Kimi K3 checkpoint, with prefill and
  decode on caches that can be cloned, saved and restored.
* :mod:`kda.integrations`: ``patch_transformers()`` makes transformers' Kimi Linear use kda,
  ``install_fla_shim()`` makes ``from fla.ops.kda import chunk_kda`` work without fla.

Importing kda imports neither torch nor numpy; a call imports what its arguments need.

Outputs of 32 MiB or more reuse the memory of earlier outputs that are gone (so the system
does not zero-fill fresh pages inside every call); :func:`empty_cache` releases what is kept.
"""

from ._core import empty_cache, get_num_threads, set_num_threads
from ._ops import chunk_kda, fused_recurrent_kda, last_compute_seconds
from . import integrations
from .layer import KdaCache, KdaLayer

__all__ = [
    "chunk_kda",
    "fused_recurrent_kda",
    "KdaLayer",
    "KdaCache",
    "set_num_threads",
    "get_num_threads",
    "last_compute_seconds",
    "empty_cache",
    "integrations",
]
