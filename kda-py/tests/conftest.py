"""Shared helpers: fla-core 0.6.0's torch references and the error measure."""

import warnings

import pytest

torch = pytest.importorskip("torch")

with warnings.catch_warnings():
    # fla warns that Triton has no CPU backend; its naive references are plain torch.
    warnings.simplefilter("ignore")
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate  # noqa: F401
    from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda  # noqa: F401


def rel_rms(a, b) -> float:
    """||a - b|| / ||b|| over all elements, in float64."""
    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    return ((a - b).pow(2).mean() / b.pow(2).mean().clamp_min(1e-300)).sqrt().item()
