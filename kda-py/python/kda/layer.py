"""One KDA layer of a checkpoint, with prefill / decode over clonable, savable caches."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from . import _convert as cv
from . import _core

PathLike = Union[str, "os.PathLike[str]"]


class KdaCache:
    """The conv and recurrent states of ``N`` sequences for one :class:`KdaLayer`.

    Make one with :meth:`KdaLayer.new_cache`; :meth:`clone` forks it (e.g. a shared prompt
    prefix), :meth:`save` / :meth:`KdaLayer.load_cache` store and restore it.
    """

    def __init__(self, inner: Any, heads: int, head_dim: int) -> None:
        self._inner = inner
        self._heads = heads
        self._head_dim = head_dim

    @property
    def sequences(self) -> int:
        """Number of sequences."""
        return self._inner.sequences

    def clone(self) -> "KdaCache":
        """An independent copy."""
        return KdaCache(self._inner.clone(), self._heads, self._head_dim)

    def reset(self) -> None:
        """Zeroes every state (every sequence starts over)."""
        self._inner.reset()

    def save(self, path: PathLike) -> None:
        """Writes the cache to ``path`` (safetensors; the file is replaced atomically)."""
        self._inner.save(os.fspath(path))

    def to_bytes(self) -> bytes:
        """The cache as safetensors bytes (what :meth:`save` writes)."""
        return self._inner.to_bytes()

    def recurrent_state(self):
        """The recurrent states as a float32 numpy array ``[N, H, K, V]`` (K-first; a copy)."""
        import numpy as np

        flat = np.frombuffer(self._inner.recurrent_state_bytes(), dtype="<f4").copy()
        return flat.reshape(self.sequences, self._heads, self._head_dim, self._head_dim)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KdaCache) and self._inner == other._inner

    __hash__ = None  # type: ignore[assignment]


class KdaLayer:
    """One KDA layer of a Kimi Linear / Kimi K3 checkpoint, the whole layer (projections,
    short convolutions, gates, delta rule, gated norm, output projection) on the CPU.

    >>> layer = KdaLayer.from_pretrained("path/to/checkpoint", layer=0)   # doctest: +SKIP
    >>> cache = layer.new_cache(1)                                        # doctest: +SKIP
    >>> y = layer.prefill(x, cache)          # x [T, hidden]               # doctest: +SKIP
    >>> y1 = layer.decode(x1, cache)         # x1 [N, hidden], one token   # doctest: +SKIP
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @classmethod
    def from_pretrained(cls, path: PathLike, layer: int = 0, precision: str = "exact") -> "KdaLayer":
        """Loads model layer ``layer`` (0-based; must be a KDA layer) of the checkpoint folder
        ``path`` (``config.json`` + ``model.safetensors`` or shards; compressed-tensors
        ``pack-quantized`` folders too) or of the Kimi Linear GGUF file ``path`` (any file of a
        split set; Q8_0, Q4_K, … matrices used as stored). Weights are memory-mapped.

        ``precision``: ``"exact"`` (f32 activations, fla's fp32 arithmetic) or ``"bf16"``
        (each projection's input rounded to bf16, bf16 products summed in f32: the precision
        torch runs bf16 checkpoints at, with ``vdpbf16ps`` on CPUs with avx512_bf16; needs
        bf16 weights, which it repacks once into a second copy)."""
        if precision not in ("exact", "bf16"):
            raise ValueError(f"precision: expected 'exact' or 'bf16', got {precision!r}")
        return cls(_core.KdaLayer.from_pretrained(os.fspath(path), int(layer), precision))

    @property
    def layer(self) -> int:
        """Model layer number (0-based)."""
        return self._inner.layer

    @property
    def hidden(self) -> int:
        """Hidden size."""
        return self._inner.hidden

    @property
    def heads(self) -> int:
        """KDA heads."""
        return self._inner.heads

    @property
    def head_dim(self) -> int:
        """Head dimension."""
        return self._inner.head_dim

    @property
    def conv_width(self) -> int:
        """Short-convolution width."""
        return self._inner.conv_width

    def new_cache(self, sequences: int = 1) -> KdaCache:
        """A zeroed cache for ``sequences`` sequences."""
        return self._wrap(self._inner.new_cache(int(sequences)))

    def load_cache(self, path: PathLike) -> KdaCache:
        """Restores a cache written by :meth:`KdaCache.save`."""
        return self._wrap(self._inner.load_cache(os.fspath(path)))

    def cache_from_bytes(self, data: bytes) -> KdaCache:
        """Restores a cache from :meth:`KdaCache.to_bytes`."""
        return self._wrap(self._inner.cache_from_bytes(bytes(data)))

    def _wrap(self, inner: Any) -> KdaCache:
        return KdaCache(inner, self.heads, self.head_dim)

    def _check_cache(self, cache: Any) -> Any:
        if not isinstance(cache, KdaCache):
            raise TypeError(f"cache: expected a kda.KdaCache, got {type(cache).__name__}")
        return cache._inner

    def prefill(
        self, x: Any, cache: KdaCache, cu_seqlens: Optional[Sequence[int]] = None, threads: Optional[int] = None
    ):
        """Runs the layer over packed sequences ``x`` ``[T, hidden]`` (split by ``cu_seqlens``,
        default one sequence), continuing from and updating ``cache`` (which must hold
        ``len(cu_seqlens) - 1`` sequences). Returns ``[T, hidden]`` of x's kind and dtype."""
        inner = self._check_cache(cache)
        shape = cv.shape_of(x, "x")
        if len(shape) != 2 or shape[1] != self.hidden:
            raise ValueError(f"x: expected shape [T, {self.hidden}], got {list(shape)}")
        cu = cv.offsets(cu_seqlens, shape[0], 1)
        if len(cu) - 1 != cache.sequences:
            raise ValueError(f"cu_seqlens: {len(cu) - 1} sequences, but the cache holds {cache.sequences}")
        xa = cv.as_f32(x, "x")
        out = cv.new_f32(xa.shape)
        self._inner.prefill(xa, inner, out, cu, threads)
        return cv.output(out, x, cv.dtype_name(x))

    def decode(self, x: Any, cache: KdaCache, threads: Optional[int] = None):
        """One token for each of the cache's ``N`` sequences: ``x`` ``[N, hidden]`` → ``[N, hidden]``."""
        inner = self._check_cache(cache)
        shape = cv.shape_of(x, "x")
        if len(shape) != 2 or shape[1] != self.hidden:
            raise ValueError(f"x: expected shape [N, {self.hidden}], got {list(shape)}")
        xa = cv.as_f32(x, "x")
        out = cv.new_f32(xa.shape)
        self._inner.decode(xa, inner, out, threads)
        return cv.output(out, x, cv.dtype_name(x))
