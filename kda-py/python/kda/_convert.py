"""Argument conversion: torch CPU tensors and numpy arrays <-> contiguous float32 numpy arrays.

A C-contiguous float32 input is passed to the extension without a copy (a torch tensor
through ``Tensor.numpy()``, which shares its memory). Anything else (bf16 / fp16 tensors,
non-contiguous views, other float dtypes) is converted, which copies.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Tuple

from . import _core

_FLOAT_NAMES = ("float32", "bfloat16", "float16", "float64")


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def kind_of(x: Any) -> str:
    """``"torch"`` for a torch tensor, ``"numpy"`` otherwise."""
    return "torch" if _is_torch(x) else "numpy"


def _np():
    import numpy

    return numpy


def describe(x: Any) -> str:
    """Type, dtype and shape of ``x`` for messages."""
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None:
        return type(x).__name__
    return f"{type(x).__module__.split('.')[0]}.{type(x).__name__} dtype={dtype} shape={list(shape)}"


def shape_of(x: Any, name: str) -> Tuple[int, ...]:
    """The shape of an array argument, or a TypeError naming it."""
    if _is_torch(x):
        return tuple(x.shape)
    np = _np()
    if isinstance(x, np.ndarray):
        return x.shape
    raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def as_f32(x: Any, name: str):
    """A C-contiguous, aligned float32 numpy array with the data of ``x`` (no copy when ``x``
    already is one, or is a contiguous float32 CPU tensor)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        # Fast path (the decode step calls this for every argument): a contiguous float32
        # CPU tensor without autograd history is viewed as is.
        if x.dtype is torch.float32 and not x.requires_grad and x.is_contiguous() and x.device.type == "cpu":
            return x.numpy()
        if x.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor, got device {x.device}")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise TypeError(f"{name}: expected float32 or bfloat16, got {x.dtype}")
        x = x.detach()
        if x.dtype != torch.float32:
            x = x.to(torch.float32)
        if not x.is_contiguous():
            x = x.contiguous()
        return x.numpy()
    np = _np()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"{name}: expected float32 or bfloat16, got {x.dtype}")
    if x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned and x.dtype.isnative:
        return x
    return np.require(x, dtype=np.float32, requirements=["C", "A"])


def dtype_name(x: Any) -> str:
    """``"float32"``, ``"bfloat16"``, ... of an array argument."""
    return str(x.dtype).replace("torch.", "")


def offsets(cu_seqlens: Any, tokens: int, batch: int, name: str = "cu_seqlens") -> List[int]:
    """Sequence offsets as a list of ints: ``cu_seqlens`` checked, or ``B`` equal sequences."""
    if cu_seqlens is None:
        per = tokens // max(batch, 1)
        return [i * per for i in range(batch + 1)]
    if hasattr(cu_seqlens, "tolist"):
        if len(getattr(cu_seqlens, "shape", ())) != 1:
            raise ValueError(f"{name}: expected a 1-D integer tensor, got shape {list(cu_seqlens.shape)}")
        dt = str(cu_seqlens.dtype)
        if "int" not in dt:
            raise TypeError(f"{name}: expected an integer tensor, got {dt}")
        cu = cu_seqlens.tolist()
    elif isinstance(cu_seqlens, Sequence):
        cu = list(cu_seqlens)
    else:
        raise TypeError(f"{name}: expected a 1-D integer tensor, got {type(cu_seqlens).__name__}")
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != tokens:
        raise ValueError(
            f"{name}: expected N+1 offsets from 0 to the token count {tokens}, got {cu[:3]}...{cu[-2:]}"
            if len(cu) > 5
            else f"{name}: expected N+1 offsets from 0 to the token count {tokens}, got {cu}"
        )
    if any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{name}: offsets must be non-decreasing, got {cu}")
    return [int(c) for c in cu]


def new_f32(shape: Tuple[int, ...]):
    """An uninitialised float32 numpy array (large ones reuse the memory of freed outputs:
    see ``kda.empty_cache``)."""
    return _core.new_f32(list(shape))


def output(arr, like: Any, dtype: Optional[str]):
    """``arr`` (float32 numpy) as the kind of ``like``: a torch tensor of ``dtype`` (sharing
    memory when float32) or the numpy array itself (cast when ``dtype`` is not float32)."""
    if kind_of(like) == "torch":
        import torch

        t = torch.from_numpy(arr)
        if dtype is not None and dtype != "float32":
            t = t.to(getattr(torch, dtype))
        return t
    if dtype is not None and dtype != "float32" and dtype in _FLOAT_NAMES and dtype != "bfloat16":
        return arr.astype(dtype)
    return arr
