"""fla-compatible ``chunk_kda`` and ``fused_recurrent_kda`` on the CPU."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

from . import _convert as cv
from . import _core

def _shapes(qs, ks, vs, gs, bs) -> Tuple[int, int, int, int, int, int]:
    """B, T, H, K, HV, V from the shapes of q, k, v, g, beta in fla's ``[B, T, H, K]`` /
    ``[B, T, HV, V]`` layouts, checked."""
    if len(qs) != 4:
        raise ValueError(f"q: expected shape [B, T, H, K], got {list(qs)}")
    B, T, H, K = qs
    if ks != qs:
        raise ValueError(f"k: expected shape {list(qs)} (as q), got {list(ks)}")
    if len(vs) != 4 or vs[:2] != (B, T):
        raise ValueError(f"v: expected shape [{B}, {T}, HV, V], got {list(vs)}")
    HV, V = vs[2], vs[3]
    if H == 0 or HV % H != 0:
        raise ValueError(f"v: value heads HV={HV} must be a positive multiple of the q/k heads H={H}")
    if K == 0 or K > 256:
        raise ValueError(f"q: head dim K={K} must be in 1..=256 (as fla)")
    if gs != (B, T, HV, K):
        raise ValueError(f"g: expected shape {[B, T, HV, K]}, got {list(gs)}")
    if bs == (B, T, HV, V) and len(bs) == len(vs):
        raise NotImplementedError(
            "beta: per-value beta of shape [B, T, HV, V] is not supported by kda (only [B, T, HV])"
        )
    if bs != (B, T, HV):
        raise ValueError(f"beta: expected shape {[B, T, HV]}, got {list(bs)}")
    return B, T, H, K, HV, V


def _gate_args(use_gate_in_kernel, lower_bound, A_log, dt_bias, HV, K, softplus_default_a):
    """gate kind, lower bound, A_log and dt_bias arrays for the extension."""
    if not use_gate_in_kernel:
        return "none", None, None, None
    if lower_bound is not None:
        lb = float(lower_bound)
        if not (lb < 0.0) or lb != lb or lb == float("-inf"):
            raise ValueError(f"lower_bound: expected a finite negative number, got {lower_bound}")
        gate = "lower_bound"
    else:
        lb, gate = None, "softplus"
    a = None
    if A_log is not None:
        n = _numel(A_log, "A_log")
        if n != HV:
            raise ValueError(f"A_log: expected {HV} elements (one per value head), got shape {list(cv.shape_of(A_log, 'A_log'))}")
        a = cv.as_f32(A_log, "A_log").reshape(HV)
    elif gate == "softplus":
        a = softplus_default_a(HV)
    b = None
    if dt_bias is not None:
        n = _numel(dt_bias, "dt_bias")
        if n != HV * K:
            raise ValueError(
                f"dt_bias: expected {HV * K} elements ([HV*K] = [{HV}*{K}]), got shape {list(cv.shape_of(dt_bias, 'dt_bias'))}"
            )
        b = cv.as_f32(dt_bias, "dt_bias").reshape(HV * K)
    return gate, lb, a, b


def _numel(x, name) -> int:
    n = 1
    for s in cv.shape_of(x, name):
        n *= s
    return n


def _state_in(initial_state, N, HV, K, V, v_first, require_f32):
    if initial_state is None:
        return None
    want = (N, HV, V, K) if v_first else (N, HV, K, V)
    s = cv.shape_of(initial_state, "initial_state")
    if s != want:
        layout = "[N, HV, V, K] (state_v_first=True)" if v_first else "[N, HV, K, V]"
        raise ValueError(f"initial_state: expected shape {list(want)} {layout}, got {list(s)}")
    if require_f32 and cv.dtype_name(initial_state) != "float32":
        raise TypeError(f"initial_state: expected float32 (as fla's chunk_kda), got {cv.dtype_name(initial_state)}")
    return cv.as_f32(initial_state, "initial_state")


def _state_v_first(state_v_first, kwargs):
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn(
            "`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning, stacklevel=3
        )
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    return state_v_first


# Each function first offers the call to the extension's fast path (`_core.fla_forward`), which
# runs the common case — every array a C-contiguous float32 torch CPU tensor, or every one a
# numpy array, no cu_seqlens — reading, checking and allocating natively, and declines (None)
# anything else. The general path below then converts, checks and raises as needed.


def _run(
    q, k, v, g, beta, *, scale, initial_state, output_final_state, l2norm, gate_in_kernel, beta_sigmoid,
    allow_neg_eigval, lower_bound, A_log, dt_bias, cu_seqlens, v_first, chunked, threads, out_dtype_of,
    h0_f32_only, softplus_default_a,
):
    # Converted first (a view for contiguous float32), then checked: one pass over each argument.
    qa, ka, va, ga, ba = (cv.as_f32(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta")))
    B, T, H, K, HV, V = _shapes(qa.shape, ka.shape, va.shape, ga.shape, ba.shape)
    if cu_seqlens is not None and B != 1:
        raise ValueError(
            f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`."
            "Please flatten variable-length inputs before processing."
        )
    cu = cv.offsets(cu_seqlens, B * T, B)
    N = len(cu) - 1
    if initial_state is not None and cv.shape_of(initial_state, "initial_state")[:1] != (N,):
        raise ValueError(
            "initial_state: the number of initial states is expected to be equal to the number of input "
            f"sequences, i.e., {N} rather than {cv.shape_of(initial_state, 'initial_state')[0]}."
        )
    if allow_neg_eigval and not beta_sigmoid:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    gate, lb, a, b = _gate_args(gate_in_kernel, lower_bound, A_log, dt_bias, HV, K, softplus_default_a)
    h0 = _state_in(initial_state, N, HV, K, V, v_first, h0_f32_only)
    if scale is None:
        scale = K ** -0.5
    qa, ka = qa.reshape(B * T, H, K), ka.reshape(B * T, H, K)
    va, ga, ba = va.reshape(B * T, HV, V), ga.reshape(B * T, HV, K), ba.reshape(B * T, HV, 1)
    o = cv.new_f32((B, T, HV, V))
    ht = cv.new_f32((N, HV, V, K) if v_first else (N, HV, K, V)) if output_final_state else None
    _core.delta_rule(
        qa, ka, va, ga, ba, o.reshape(B * T, HV, V), cu, float(scale),
        a_log=a, dt_bias=b, initial_state=h0, final_state=ht, l2norm=bool(l2norm), gate=gate,
        lower_bound=lb, beta_factor=(2.0 if allow_neg_eigval else 1.0) if beta_sigmoid else None,
        chunked=chunked, v_first=bool(v_first), threads=threads,
    )
    like = out_dtype_of
    o_out = cv.output(o, like, cv.dtype_name(like))
    ht_out = cv.output(ht, like, "float32") if ht is not None else None
    return o_out, ht_out


def chunk_kda(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: Optional[float] = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Any = None,
    cu_seqlens_cpu: Any = None,
    cp_context: Any = None,
    use_graph: bool = False,
    max_num_seqs: Optional[int] = None,
    A_log: Any = None,
    dt_bias: Any = None,
    threads: Optional[int] = None,
    **kwargs: Any,
):
    r"""Chunked KDA forward, a CPU drop-in for ``fla.ops.kda.chunk_kda`` (fla-core 0.6.0).

    Same arguments, shapes and results: ``q``, ``k`` ``[B, T, H, K]``, ``v`` ``[B, T, HV, V]``,
    ``g`` ``[B, T, HV, K]`` (log decay, or the raw gate input with ``use_gate_in_kernel``),
    ``beta`` ``[B, T, HV]``; returns ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V]
    float32 or None)``. With ``cu_seqlens`` (``B == 1``) the tokens are ``N`` packed sequences.
    ``A_log`` ``[HV]`` and ``dt_bias`` ``[HV*K]`` are used only with ``use_gate_in_kernel``; the
    gate is ``-exp(A_log)*softplus(g + dt_bias)``, or ``lower_bound*sigmoid(exp(A_log)*(g + dt_bias))``
    when ``lower_bound`` is set. ``state_v_first`` stores states as ``[N, HV, V, K]``.

    Inputs are torch CPU tensors (float32, bfloat16) or numpy arrays; outputs are of the same
    kind. Contiguous float32 inputs are read in place (no copy); the GIL is released while
    computing; ``threads`` (default: ``kda.set_num_threads``) sets the thread count.

    ``chunk_size`` (32 or 64, checked as fla does) is fla's GPU tiling: kda always runs the
    chunked form with the core's fastest chunk size, which changes only rounding.

    Not supported (raise ``NotImplementedError``): ``return_intermediate_states``,
    ``cp_context``, ``use_graph``. ``disable_recompute`` and ``safe_gate`` only matter to fla's
    GPU kernels and training; they are accepted (``safe_gate`` is validated as fla does).
    """
    state_v_first = _state_v_first(state_v_first, kwargs)
    if return_intermediate_states:
        raise NotImplementedError("return_intermediate_states: kda does not return per-chunk states")
    if cp_context is not None:
        raise NotImplementedError("cp_context: context parallelism is not supported by kda")
    if use_graph:
        raise NotImplementedError("use_graph: CUDA/NPU graph mode is not supported by kda")
    if use_gate_in_kernel and A_log is None and lower_bound is None:
        raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set.")
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (32, 64):
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    r = _core.fla_forward(
        True, q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, cu_seqlens,
        threads,
    )
    if r is not None:
        return r
    return _run(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        l2norm=use_qk_l2norm_in_kernel, gate_in_kernel=use_gate_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, A_log=A_log, dt_bias=dt_bias,
        cu_seqlens=cu_seqlens, v_first=state_v_first, chunked=True, threads=threads, out_dtype_of=q,
        h0_f32_only=True, softplus_default_a=None,
    )


def _fla_default_a(hv: int):
    # fla's fused_recurrent kernel without A_log uses b_A = 1.0 in -exp(b_A)*softplus(...),
    # i.e. A_log = 1 for every head.
    import numpy as np

    return np.ones(hv, dtype=np.float32)


def _fused_recurrent_kda(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    A_log: Any = None,
    dt_bias: Any = None,
    scale: Optional[float] = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Any = None,
    threads: Optional[int] = None,
    **kwargs: Any,
):
    """The general path of :func:`fused_recurrent_kda` (which is native: ``_core``'s), for the
    calls its fast path declines."""
    state_v_first = _state_v_first(state_v_first, kwargs)
    return _run(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        l2norm=use_qk_l2norm_in_kernel, gate_in_kernel=use_gate_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, A_log=A_log, dt_bias=dt_bias,
        cu_seqlens=cu_seqlens, v_first=state_v_first, chunked=False, threads=threads, out_dtype_of=v,
        h0_f32_only=False, softplus_default_a=_fla_default_a,
    )


fused_recurrent_kda = _core.fused_recurrent_kda


def last_compute_seconds() -> float:
    """Seconds the extension spent computing in the last ``chunk_kda`` / ``fused_recurrent_kda``
    call (the GIL-free part), for measuring call overhead."""
    return _core.last_compute_ns() * 1e-9

