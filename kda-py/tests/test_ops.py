"""kda.chunk_kda / kda.fused_recurrent_kda against fla-core 0.6.0's naive references."""

import itertools
import threading
import time
import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kda
from kda import _convert, _core
from conftest import naive_chunk_kda, naive_kda_gate, naive_kda_lowerbound_gate, naive_recurrent_kda, rel_rms

F32_TOL = 1e-5
BF16_TOL = 1e-2
FUNCS = {"chunk": kda.chunk_kda, "recurrent": kda.fused_recurrent_kda}


def l2norm(x):
    """fla's in-kernel l2norm: x / sqrt(sum(x^2) + 1e-6)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def make_inputs(seed, T, H, HV, K, V, N, gate_in_kernel, gate, l2norm_in_kernel, beta_sigmoid):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = {
        "q": r(1, T, H, K),
        "k": r(1, T, H, K),
        "v": r(1, T, HV, V),
        "A_log": r(HV) * 0.5,
        "dt_bias": r(HV * K) * 0.5,
        "h0": r(N, HV, K, V) * 0.5,
    }
    if not l2norm_in_kernel:
        x["q"], x["k"] = l2norm(x["q"]), l2norm(x["k"])
    raw = r(1, T, HV, K) * 2.0
    if gate == "softplus":
        g_ref = naive_kda_gate(raw, x["A_log"], x["dt_bias"])
    else:
        g_ref = naive_kda_lowerbound_gate(raw, x["A_log"], x["dt_bias"], lower_bound=-5.0)
    x["g_ref"] = g_ref
    x["g"] = raw if gate_in_kernel else g_ref
    braw = r(1, T, HV)
    x["beta_ref"] = torch.sigmoid(braw)
    x["beta"] = braw if beta_sigmoid else x["beta_ref"]
    return x


def reference(x, cu, l2norm_in_kernel, scale=None, with_h0=True, chunked=False):
    """Per-sequence fla naive reference; returns (o [1, T, HV, V], state [N, HV, K, V])."""
    q, k = x["q"], x["k"]
    if l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    fn = naive_chunk_kda if chunked else naive_recurrent_kda
    outs, states = [], []
    for n in range(len(cu) - 1):
        s = slice(cu[n], cu[n + 1])
        h0 = x["h0"][n : n + 1] if with_h0 else None
        o, st = fn(
            q[:, s], k[:, s], x["v"][:, s], x["g_ref"][:, s], x["beta_ref"][:, s],
            scale=scale, initial_state=h0, output_final_state=True,
        )
        outs.append(o)
        states.append(st)
    return torch.cat(outs, 1), torch.cat(states, 0)


CASES = list(
    itertools.product(
        ["chunk", "recurrent"],
        [64, 128],  # K
        ["softplus", "lower_bound"],
        [False, True],  # gate in kernel
        [False, True],  # l2norm in kernel
        [False, True],  # beta sigmoid in kernel
    )
)


@pytest.mark.parametrize("fn,K,gate,gik,l2,bsig", CASES)
def test_matches_fla_naive_f32(fn, K, gate, gik, l2, bsig):
    """Every flag combination, varlen with an empty sequence, GVA (HV = 2H), initial and final
    states, in float32."""
    H, HV, V = 2, 4, 32 if K == 64 else 64
    cu = [0, 37, 37, 100, 131]
    seed = hash((fn, K, gate, gik, l2, bsig)) % 10_000
    x = make_inputs(seed, 131, H, HV, K, V, len(cu) - 1, gik, gate, l2, bsig)
    want_o, want_s = reference(x, cu, l2)
    kw = dict(
        initial_state=x["h0"], output_final_state=True, use_qk_l2norm_in_kernel=l2,
        use_gate_in_kernel=gik, use_beta_sigmoid_in_kernel=bsig, A_log=x["A_log"], dt_bias=x["dt_bias"],
        lower_bound=-5.0 if gate == "lower_bound" else None, cu_seqlens=torch.tensor(cu),
    )
    o, s = FUNCS[fn](x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    assert o.dtype == torch.float32 and o.shape == want_o.shape
    assert s.dtype == torch.float32 and s.shape == want_s.shape
    assert rel_rms(o, want_o) <= F32_TOL
    assert rel_rms(s, want_s) <= F32_TOL


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
@pytest.mark.parametrize("K", [64, 128])
def test_matches_naive_chunk_and_batch(fn, K):
    """B = 2 equal-length sequences (no cu_seqlens), against fla's naive_chunk_kda, custom
    scale, no initial state."""
    x = make_inputs(7 + K, 128, 2, 2, K, K, 2, False, "softplus", False, False)
    want_o, want_s = reference(x, [0, 64, 128], False, scale=0.3, with_h0=False, chunked=True)
    b = lambda t: t.reshape(2, 64, *t.shape[2:])  # noqa: E731
    o, s = FUNCS[fn](b(x["q"]), b(x["k"]), b(x["v"]), b(x["g"]), b(x["beta"]), scale=0.3, output_final_state=True)
    assert o.shape == (2, 64, 2, K)
    assert rel_rms(o, b(want_o)) <= F32_TOL
    assert rel_rms(s, want_s) <= F32_TOL


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_state_v_first(fn):
    """V-first states in and out are the transposes of the K-first ones."""
    x = make_inputs(3, 50, 1, 2, 64, 32, 2, True, "lower_bound", True, True)
    cu = torch.tensor([0, 20, 50])
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0, cu_seqlens=cu)
    o_k, s_k = FUNCS[fn](x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], **kw)
    h0_v = x["h0"].transpose(-1, -2).contiguous()
    o_v, s_v = FUNCS[fn](x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0_v, state_v_first=True, **kw)
    assert s_v.shape == (2, 2, 32, 64)
    assert torch.equal(o_k, o_v)
    assert torch.equal(s_k, s_v.transpose(-1, -2))
    want_o, want_s = reference(x, [0, 20, 50], True)
    assert rel_rms(s_v.transpose(-1, -2), want_s) <= F32_TOL


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
@pytest.mark.parametrize("K", [64, 128])
def test_bf16(fn, K):
    """bfloat16 inputs: output in bfloat16 (q's dtype for chunk, v's for recurrent), state
    float32, close to the float32 reference of the same bf16 values."""
    x = make_inputs(11, 70, 2, 2, K, K, 1, True, "softplus", True, True)
    bf = {n: t.to(torch.bfloat16) for n, t in x.items()}
    ref_in = {n: t.float() for n, t in bf.items()}
    ref_in["g_ref"] = naive_kda_gate(ref_in["g"], ref_in["A_log"], ref_in["dt_bias"])
    ref_in["beta_ref"] = torch.sigmoid(ref_in["beta"])
    ref_in["h0"] = x["h0"]
    want_o, want_s = reference(ref_in, [0, 70], True)
    o, s = FUNCS[fn](
        bf["q"], bf["k"], bf["v"], bf["g"], bf["beta"], initial_state=x["h0"], output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        A_log=bf["A_log"], dt_bias=bf["dt_bias"],
    )
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert rel_rms(o.float(), want_o) <= BF16_TOL
    assert rel_rms(s, want_s) <= F32_TOL


def test_numpy_in_numpy_out():
    x = make_inputs(5, 40, 2, 2, 64, 64, 1, False, "softplus", False, False)
    n = {k: v.numpy() for k, v in x.items()}
    o, s = kda.chunk_kda(n["q"], n["k"], n["v"], n["g"], n["beta"], initial_state=n["h0"], output_final_state=True)
    assert isinstance(o, np.ndarray) and o.dtype == np.float32 and isinstance(s, np.ndarray)
    want_o, want_s = reference(x, [0, 40], False)
    assert rel_rms(o, want_o) <= F32_TOL and rel_rms(s, want_s) <= F32_TOL
    o2, s2 = kda.chunk_kda(n["q"], n["k"], n["v"], n["g"], n["beta"])
    assert s2 is None


def test_fused_recurrent_softplus_without_a_log_matches_fla_kernel():
    """fla's fused_recurrent kernel without A_log computes -exp(1)*softplus(g + dt_bias)."""
    x = make_inputs(9, 10, 1, 1, 64, 64, 1, True, "softplus", False, False)
    ones = torch.ones(1)
    x["g_ref"] = naive_kda_gate(x["g"], ones, x["dt_bias"])
    want_o, _ = reference(x, [0, 10], False)
    o, _ = kda.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], dt_bias=x["dt_bias"],
                                   initial_state=x["h0"], use_gate_in_kernel=True)
    assert rel_rms(o, want_o) <= F32_TOL


def test_allow_neg_eigval():
    x = make_inputs(13, 30, 1, 1, 64, 64, 1, False, "softplus", False, True)
    x["beta_ref"] = 2 * x["beta_ref"]
    want_o, _ = reference(x, [0, 30], False)
    for fn in FUNCS.values():
        o, _ = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                  use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
        assert rel_rms(o, want_o) <= F32_TOL


def test_threads_give_identical_results():
    x = make_inputs(17, 200, 4, 4, 64, 64, 1, False, "softplus", False, False)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o1, _ = kda.chunk_kda(*args, threads=1)
    o3, _ = kda.chunk_kda(*args, threads=3)
    assert torch.equal(o1, o3)
    old = kda.get_num_threads()
    try:
        kda.set_num_threads(2)
        assert kda.get_num_threads() == 2
        assert torch.equal(kda.chunk_kda(*args)[0], o1)
    finally:
        kda.set_num_threads(None)
    assert kda.get_num_threads() == old


# ---- the native fast path ----


def _strided_copy(t):
    """The same values in a non-contiguous tensor (which the fast path declines)."""
    wide = torch.zeros(*t.shape, 2)
    wide[..., 0] = t
    return wide[..., 0]


FAST_CASES = [
    c
    for c in itertools.product(
        ["chunk", "recurrent"],
        ["none", "softplus", "softplus_no_a", "lower_bound"],
        [False, True],  # state_v_first
        [False, True],  # l2norm + beta sigmoid (+ allow_neg_eigval) in kernel
    )
    if c[:2] != ("chunk", "softplus_no_a")  # chunk_kda requires A_log for the softplus gate
]


@pytest.mark.parametrize("fn_name,gate,v_first,flags", FAST_CASES)
def test_fast_path_equals_general_path_bitwise(fn_name, gate, v_first, flags, monkeypatch):
    """Contiguous float32 tensors (and numpy arrays) take the fast path, which gives bit for bit
    what the general path gives for the same values (forced here by a non-contiguous beta);
    B = 2, HV = 2H, given scale, initial state in and final state out."""
    fn = FUNCS[fn_name]
    gen = torch.Generator().manual_seed(7)
    B, T, H, HV, K, V = 2, 37, 2, 4, 32, 16
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V)
    g = r(B, T, HV, K) if gate != "none" else -torch.rand(B, T, HV, K, generator=gen) * 0.2
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = r(B, HV, V, K) if v_first else r(B, HV, K, V)
    kw = dict(scale=0.3, initial_state=h0, output_final_state=True, state_v_first=v_first, threads=1)
    if gate != "none":
        kw.update(use_gate_in_kernel=True, dt_bias=r(HV * K) * 0.5)
        if gate != "softplus_no_a":
            kw["A_log"] = r(HV) * 0.5
        if gate == "lower_bound":
            kw["lower_bound"] = -3.0
    if flags:
        kw.update(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    calls = []
    real = _core.delta_rule
    monkeypatch.setattr(_core, "delta_rule", lambda *a, **k: calls.append(1) or real(*a, **k))
    o_fast, s_fast = fn(q, k, v, g, beta, **kw)
    assert not calls, "contiguous float32 tensors did not take the fast path"
    o_np, s_np = fn(*(t.numpy() for t in (q, k, v, g, beta)), **{
        n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()})
    assert not calls, "numpy float32 arrays did not take the fast path"
    o_gen, s_gen = fn(q, k, v, g, _strided_copy(beta), **kw)
    assert calls, "a non-contiguous beta took the fast path"
    assert isinstance(o_fast, torch.Tensor) and o_fast.dtype == torch.float32 and o_fast.shape == (B, T, HV, V)
    assert isinstance(o_np, np.ndarray) and o_np.dtype == np.float32 and o_np.shape == (B, T, HV, V)
    assert s_fast.shape == h0.shape and isinstance(s_np, np.ndarray)
    assert torch.equal(o_fast, o_gen) and torch.equal(s_fast, s_gen)
    assert np.array_equal(o_np, o_gen.numpy()) and np.array_equal(s_np, s_gen.numpy())
    # without a final state
    o2, s2 = fn(q, k, v, g, beta, **{**kw, "output_final_state": False})
    assert s2 is None and torch.equal(o2, o_fast)


def test_fast_path_declines_what_it_does_not_handle(monkeypatch):
    """Mixed kinds, bf16, a tensor subclass, cu_seqlens, torch's lazy negation: the general
    path runs (and the lazily negated tensor is read negated, or refused, never misread)."""
    x = make_inputs(3, 20, 2, 2, 32, 32, 1, False, "softplus", False, False)
    q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
    want, _ = kda.fused_recurrent_kda(q, k, v, g, beta)
    calls = []
    real = _core.delta_rule
    monkeypatch.setattr(_core, "delta_rule", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    variants = {
        "mixed kinds": (q.numpy(), k, v, g, beta),
        "bf16": (q.bfloat16(), k, v, g, beta),
        "subclass": (torch.nn.Parameter(q, requires_grad=False), k, v, g, beta),
    }
    for name, args in variants.items():
        n = len(calls)
        o, _ = kda.fused_recurrent_kda(*args)
        assert len(calls) == n + 1, name
        assert rel_rms(o.float() if isinstance(o, torch.Tensor) else torch.from_numpy(o), want) <= BF16_TOL, name
    n = len(calls)
    o, _ = kda.fused_recurrent_kda(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 20]))
    assert len(calls) == n + 1 and torch.equal(o, want)
    neg = torch._neg_view(-q)  # reads as q, stored as -q
    try:
        o, _ = kda.fused_recurrent_kda(neg, k, v, g, beta)
    except RuntimeError:
        pass  # the general path refuses it (Tensor.numpy() does)
    else:
        assert torch.equal(o, want)


def test_native_fused_recurrent_passes_everything_to_the_general_path():
    """What the native fused_recurrent_kda declines reaches the Python general path with every
    argument: positional A_log / dt_bias, keyword-only extras (fla's deprecated
    ``transpose_state_layout``, with its warning)."""
    x = make_inputs(5, 9, 2, 2, 16, 16, 1, True, "softplus", False, False)
    q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
    h0 = x["h0"].transpose(-1, -2).contiguous()
    kw = dict(use_gate_in_kernel=True, initial_state=h0, output_final_state=True)
    want = kda.fused_recurrent_kda(q, k, v, g, beta, x["A_log"], x["dt_bias"], state_v_first=True, **kw)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        got = kda.fused_recurrent_kda(q, k, v, g, beta, x["A_log"], x["dt_bias"], transpose_state_layout=True, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="Cannot pass both"):
        kda.fused_recurrent_kda(q, k, v, g, beta, state_v_first=True, transpose_state_layout=True)


# ---- zero copy ----


def test_contiguous_f32_tensor_is_viewed_not_copied():
    t = torch.randn(3, 5, 2, 64)
    a = _convert.as_f32(t, "q")
    assert a.__array_interface__["data"][0] == t.data_ptr()
    # a bf16 tensor or a non-contiguous view needs a conversion (a copy)
    assert _convert.as_f32(t.bfloat16(), "q").__array_interface__["data"][0] != t.data_ptr()
    tt = t.transpose(1, 2)
    assert _convert.as_f32(tt, "q").__array_interface__["data"][0] != t.data_ptr()


def test_readonly_numpy_inputs_are_read_in_place():
    """Read-only float32 arrays work, and the call allocates (numpy memory, traced by
    tracemalloc) no more than its outputs: no input was copied."""
    T, H, K = 2048, 4, 64
    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal((1, T, H, K), dtype=np.float32) for _ in range(4)]
    arrs[0] /= np.linalg.norm(arrs[0], axis=-1, keepdims=True)
    arrs[1] /= np.linalg.norm(arrs[1], axis=-1, keepdims=True)
    arrs[3] = -np.abs(arrs[3])
    beta = rng.random((1, T, H), dtype=np.float32)
    for a in (*arrs, beta):
        a.setflags(write=False)
    out_bytes = T * H * K * 4
    tracemalloc.start()
    try:
        o, _ = kda.chunk_kda(arrs[0], arrs[1], arrs[2], arrs[3], beta)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert o.shape == (1, T, H, K)
    assert peak < out_bytes + out_bytes // 2, f"peak {peak} B for an output of {out_bytes} B"


def test_gil_is_released_during_compute():
    """Another Python thread runs while long calls compute.

    The worker repeats the call until 0.25 s have passed, so the test means the same on a fast
    machine as on a slow one. Were the GIL held while computing, the main thread could tick only
    between calls (about once per call); released, it ticks about once per millisecond.
    """
    x = make_inputs(21, 4096, 12, 12, 128, 128, 1, False, "softplus", False, False)
    ticks = []
    calls = []
    done = threading.Event()

    def work():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.25:
            kda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], threads=1)
            calls.append(1)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    t.join()
    assert len(ticks) > 5 * len(calls) + 10, f"the main thread ran only {len(ticks)} times during {len(calls)} calls"


# ---- bad inputs ----


def _ok():
    x = make_inputs(1, 8, 2, 2, 64, 64, 1, False, "softplus", False, False)
    return x["q"], x["k"], x["v"], x["g"], x["beta"], x


BAD = [
    ("q of 3 dims", lambda q, k, v, g, b, x: kda.chunk_kda(q[0], k, v, g, b), ValueError, "q: expected shape [B, T, H, K]"),
    ("k shape", lambda q, k, v, g, b, x: kda.chunk_kda(q, k[:, :4], v, g, b), ValueError, "k: expected shape [1, 8, 2, 64]"),
    ("g shape", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g[..., :32], b), ValueError, "g: expected shape [1, 8, 2, 64], got [1, 8, 2, 32]"),
    ("beta shape", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b[..., :1]), ValueError, "beta: expected shape [1, 8, 2]"),
    ("HV not a multiple", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, torch.zeros(1, 8, 3, 64), g, b), ValueError, "HV=3 must be a positive multiple"),
    ("int dtype", lambda q, k, v, g, b, x: kda.chunk_kda(q.long(), k, v, g, b), TypeError, "q: expected float32 or bfloat16, got torch.int64"),
    ("list", lambda q, k, v, g, b, x: kda.chunk_kda(q.tolist(), k, v, g, b), TypeError, "q: expected a torch.Tensor or numpy.ndarray, got list"),
    ("meta tensor", lambda q, k, v, g, b, x: kda.chunk_kda(q.to("meta"), k, v, g, b), ValueError, "q: expected a CPU tensor, got device meta"),
    ("cu_seqlens end", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, cu_seqlens=torch.tensor([0, 5])), ValueError, "cu_seqlens: expected N+1 offsets from 0 to the token count 8"),
    ("cu_seqlens order", lambda q, k, v, g, b, x: kda.fused_recurrent_kda(q, k, v, g, b, cu_seqlens=torch.tensor([0, 6, 3, 8])), ValueError, "cu_seqlens: offsets must be non-decreasing"),
    ("cu_seqlens float", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, cu_seqlens=torch.tensor([0.0, 8.0])), TypeError, "cu_seqlens: expected an integer tensor"),
    ("cu_seqlens with B=2", lambda q, k, v, g, b, x: kda.chunk_kda(*(t.reshape(2, 4, *t.shape[2:]) for t in (q, k, v, g, b)), cu_seqlens=torch.tensor([0, 8])), ValueError, "batch size is expected to be 1 rather than 2"),
    ("h0 count", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, initial_state=torch.zeros(2, 2, 64, 64), cu_seqlens=torch.tensor([0, 8])), ValueError, "i.e., 1 rather than 2"),
    ("h0 shape", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, initial_state=torch.zeros(1, 2, 64, 32)), ValueError, "initial_state: expected shape [1, 2, 64, 64] [N, HV, K, V], got [1, 2, 64, 32]"),
    ("h0 bf16 in chunk", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, initial_state=torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)), TypeError, "initial_state: expected float32"),
    ("A_log numel", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, use_gate_in_kernel=True, A_log=torch.zeros(3)), ValueError, "A_log: expected 2 elements"),
    ("dt_bias numel", lambda q, k, v, g, b, x: kda.fused_recurrent_kda(q, k, v, g, b, use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(64)), ValueError, "dt_bias: expected 128 elements"),
    ("no A_log", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, use_gate_in_kernel=True), ValueError, "`A_log` must be provided"),
    ("lower_bound > 0", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, use_gate_in_kernel=True, lower_bound=1.0), ValueError, "lower_bound: expected a finite negative number, got 1.0"),
    ("safe_gate range", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, use_gate_in_kernel=True, safe_gate=True, lower_bound=-7.0), ValueError, "`lower_bound` must be in the safe range"),
    ("neg eigval", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, allow_neg_eigval=True), ValueError, "`allow_neg_eigval=True` requires"),
    ("chunk_size", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, chunk_size=16), ValueError, "`chunk_size` must be either 32 or 64"),
    ("threads 0", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, threads=0), ValueError, "threads: expected 1..=1024, got 0"),
    ("intermediate states", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, return_intermediate_states=True), NotImplementedError, "return_intermediate_states"),
    ("use_graph", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, use_graph=True), NotImplementedError, "use_graph"),
    ("cp_context", lambda q, k, v, g, b, x: kda.chunk_kda(q, k, v, g, b, cp_context=object()), NotImplementedError, "cp_context"),
    ("per-value beta", lambda q, k, v, g, b, x: kda.fused_recurrent_kda(q, k, v, g, torch.rand(1, 8, 2, 64)), NotImplementedError, "beta: per-value beta"),
]


@pytest.mark.parametrize("name,call,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(name, call, exc, msg):
    q, k, v, g, b, x = _ok()
    with pytest.raises(exc) as e:
        call(q, k, v, g, b, x)
    assert msg in str(e.value)


def test_extension_rejects_unsafe_arrays():
    """The native entry point checks what the Python layer guarantees: dtype, contiguity,
    writable outputs that share no memory with inputs."""
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    q, v, beta = z(4, 1, 8), z(4, 1, 8), z(4, 1, 1)
    o = z(4, 1, 8)
    with pytest.raises(ValueError, match="o: must not share memory with an input"):
        _core.delta_rule(q, q, v, q, beta, v, [0, 4], 1.0)
    ro = z(4, 1, 8)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="o: array is read-only"):
        _core.delta_rule(q, q, v, q, beta, ro, [0, 4], 1.0)
    with pytest.raises(TypeError, match=r"q: expected float32 \('<f4'\), got '<f8'"):
        _core.delta_rule(q.astype(np.float64), q, v, q, beta, o, [0, 4], 1.0)
    with pytest.raises(ValueError, match="k: expected a C-contiguous array"):
        _core.delta_rule(q, z(8, 1, 4).T, v, q, beta, o, [0, 4], 1.0)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0 and end at the token count 4"):
        _core.delta_rule(q, q, v, q, beta, o, [0, 3], 1.0)
    with pytest.raises(TypeError, match="q: expected a numpy array"):
        _core.delta_rule([1.0], q, v, q, beta, o, [0, 4], 1.0)


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_lower_bound_gate_without_a_log(fn):
    """With lower_bound and no A_log the gate is lower_bound * sigmoid(g + dt_bias)."""
    x = make_inputs(23, 40, 2, 2, 64, 64, 1, True, "lower_bound", False, False)
    x["g_ref"] = naive_kda_lowerbound_gate(x["g"], None, x["dt_bias"], lower_bound=-3.0)
    want_o, want_s = reference(x, [0, 40], False)
    o, s = FUNCS[fn](x["q"], x["k"], x["v"], x["g"], x["beta"], dt_bias=x["dt_bias"], initial_state=x["h0"],
                     output_final_state=True, use_gate_in_kernel=True, lower_bound=-3.0)
    assert rel_rms(o, want_o) <= F32_TOL and rel_rms(s, want_s) <= F32_TOL


def test_large_outputs_reuse_freed_memory():
    """Outputs of 32 MiB or more come from kda's free list: a freed one's memory is reused
    for the next (no fresh pages to zero-fill), never while an array still refers to it,
    and `kda.empty_cache()` releases it."""
    kda.empty_cache()
    n = (32 << 20) // 4  # exactly the threshold
    a = _core.new_f32([2, n // 2])
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (2, n // 2)
    assert a.flags.c_contiguous and a.flags.writeable
    b = _core.new_f32([n])
    assert a.ctypes.data != b.ctypes.data
    a[...] = 1.0
    b[...] = 2.0
    assert (a == 1.0).all() and (b == 2.0).all(), "two live outputs share memory"
    addr = a.ctypes.data
    t = torch.from_numpy(a)  # torch outputs are tensors over these arrays
    del a
    assert _core.cache_info() == (0, 0), "memory reused while a tensor refers to it"
    del t
    assert _core.cache_info() == (1, n * 4)
    c = _core.new_f32([n])
    assert c.ctypes.data == addr, "the freed buffer was not reused"
    assert _core.cache_info() == (0, 0)
    # A request less than half a held buffer's size does not take it, nor a larger one.
    del c
    small = _core.new_f32([n // 2 - 1])
    big = _core.new_f32([n + 1])
    assert _core.cache_info() == (1, n * 4)
    assert small.nbytes < (32 << 20) and small.base is None, "small outputs are plain numpy.empty"
    kda.empty_cache()
    assert _core.cache_info() == (0, 0)
    del b, big, small
    kda.empty_cache()


def test_chunk_kda_large_output_from_the_free_list_is_exact():
    """A call whose output reuses a freed output's memory gives the same bits as one on
    fresh memory (the memory is written in full: nothing of the old output shows through)."""
    kda.empty_cache()
    T, H, K = 2048, 32, 128  # o: 32 MiB
    g0 = torch.Generator().manual_seed(3)
    q = F.normalize(torch.randn(1, T, H, K, generator=g0), dim=-1)
    k = F.normalize(torch.randn(1, T, H, K, generator=g0), dim=-1)
    v = torch.randn(1, T, H, K, generator=g0)
    g = -torch.rand(1, T, H, K, generator=g0) * 0.1
    beta = torch.rand(1, T, H, generator=g0)
    o1, s1 = kda.chunk_kda(q, k, v, g, beta, output_final_state=True)
    o1 = o1.clone()
    junk, _ = kda.chunk_kda(q, k, -v * 7.0, g, beta)
    junk_addr = junk.data_ptr()
    del junk
    assert _core.cache_info()[0] == 1
    o2, s2 = kda.chunk_kda(q, k, v, g, beta, output_final_state=True)
    assert o2.data_ptr() == junk_addr, "the output did not reuse the freed one's memory"
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    del o2
    kda.empty_cache()


def test_large_output_allocation_failure_is_a_memory_error():
    """A large output the system cannot give is numpy's MemoryError, not an abort."""
    kda.empty_cache()
    with pytest.raises(MemoryError):
        _core.new_f32([1 << 40])
    assert _core.cache_info() == (0, 0)
