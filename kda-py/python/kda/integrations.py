"""Plugging kda into code written for fla / transformers.

* :func:`patch_transformers` makes transformers' native Kimi Linear (``kimi_linear``, 5.x) run
  its KDA recurrences with :func:`kda.chunk_kda` / :func:`kda.fused_recurrent_kda` on CPU
  tensors, instead of the token-by-token torch fallback used when fla is absent.
* :func:`install_fla_shim` makes ``from fla.ops.kda import chunk_kda, fused_recurrent_kda``
  work without fla installed (as the model repository's own ``modeling_kimi_linear.py`` does).
  It never shadows a real fla.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from typing import Any, Callable, Dict, Optional

from . import _ops

_MODELING = "transformers.models.kimi_linear.modeling_kimi_linear"
# transformers' function name -> (kda function, its keyword parameters)
_TARGETS = {
    "chunk_kimi_delta_attention": _ops.chunk_kda,
    "recurrent_kimi_delta_attention": _ops.fused_recurrent_kda,
}
_originals: Dict[str, Callable[..., Any]] = {}


def _params(fn: Callable[..., Any]) -> frozenset:
    return frozenset(
        n for n, p in inspect.signature(fn).parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD
    )


def _uses_kda(*tensors: Any) -> bool:
    """CPU tensors and no autograd graph to build (kda has no backward pass)."""
    import torch

    ts = [t for t in tensors if isinstance(t, torch.Tensor)]
    if any(t.device.type != "cpu" for t in ts):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in ts))


def _make_replacement(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    kda_fn = _TARGETS[name]
    accepted = _params(kda_fn)

    def kda_delta_attention(query, key, value, g, beta, *args, **kwargs):
        if args or not _uses_kda(query, key, value, g, beta, kwargs.get("initial_state")):
            return original(query, key, value, g, beta, *args, **kwargs)
        kw = {k: v for k, v in kwargs.items() if k in accepted}
        return kda_fn(query, key, value, g, beta, **kw)

    kda_delta_attention.__name__ = name
    kda_delta_attention.__doc__ = f"kda's {kda_fn.__name__} on CPU tensors, else transformers' {name}."
    kda_delta_attention._kda_original = original  # type: ignore[attr-defined]
    return kda_delta_attention


def patch_transformers() -> bool:
    """Makes transformers' Kimi Linear use kda for its KDA recurrences on CPU tensors
    (inference; a call that needs gradients, or on another device, keeps transformers' own
    path). Idempotent; returns False when transformers has no ``kimi_linear`` model.
    Undo with :func:`unpatch_transformers`."""
    try:
        m = importlib.import_module(_MODELING)
    except ImportError:
        return False
    for name in _TARGETS:
        current = getattr(m, name)
        if getattr(current, "_kda_original", None) is not None:
            continue
        _originals[name] = current
        setattr(m, name, _make_replacement(name, current))
    return True


def unpatch_transformers() -> None:
    """Restores what :func:`patch_transformers` replaced."""
    m = sys.modules.get(_MODELING)
    if m is None:
        return
    for name, fn in list(_originals.items()):
        setattr(m, name, fn)
        del _originals[name]


def is_transformers_patched() -> bool:
    """Whether transformers' Kimi Linear currently runs on kda."""
    m = sys.modules.get(_MODELING)
    return m is not None and all(getattr(getattr(m, n), "_kda_original", None) is not None for n in _TARGETS)


def install_fla_shim(force: bool = False) -> bool:
    """Registers modules ``fla``, ``fla.ops``, ``fla.ops.kda`` (with ``chunk_kda`` and
    ``fused_recurrent_kda`` from kda), ``fla.ops.kda.chunk`` and ``fla.ops.kda.fused_recurrent``,
    so code importing them runs on kda. Does nothing (returns False) when a real fla is
    importable or already imported, unless ``force``. Only these two functions are provided
    (not ``fla.modules`` or the gate kernels)."""
    existing: Optional[types.ModuleType] = sys.modules.get("fla")
    if existing is not None and not getattr(existing, "__kda_shim__", False) and not force:
        return False
    if existing is None and not force:
        try:
            if importlib.util.find_spec("fla") is not None:
                return False
        except (ImportError, ValueError):
            pass

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name, f"kda's stand-in for {name} (see kda.integrations.install_fla_shim)")
        mod.__kda_shim__ = True  # type: ignore[attr-defined]
        mod.__path__ = []  # type: ignore[attr-defined]  # a package, so submodules resolve
        for k, v in attrs.items():
            setattr(mod, k, v)
        sys.modules[name] = mod
        return mod

    fns = {"chunk_kda": _ops.chunk_kda, "fused_recurrent_kda": _ops.fused_recurrent_kda}
    chunk = module("fla.ops.kda.chunk", chunk_kda=_ops.chunk_kda)
    fused = module("fla.ops.kda.fused_recurrent", fused_recurrent_kda=_ops.fused_recurrent_kda)
    kda_mod = module("fla.ops.kda", chunk=chunk, fused_recurrent=fused, __all__=list(fns), **fns)
    ops = module("fla.ops", kda=kda_mod, **fns)
    module("fla", ops=ops, __version__="0.6.0+kda")
    return True


def uninstall_fla_shim() -> None:
    """Removes the modules :func:`install_fla_shim` registered."""
    for name in [n for n, m in sys.modules.items() if (n == "fla" or n.startswith("fla.")) and getattr(m, "__kda_shim__", False)]:
        del sys.modules[name]
