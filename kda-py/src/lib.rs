//! # kda-py
//!
//! The native part (`kda._core`) of the Python package `kda`: fla-compatible `chunk_kda` /
//! `fused_recurrent_kda` kernels and the KDA layer over kda-host. The common call (contiguous
//! float32 torch tensors or numpy arrays) is read, checked and run here in one native call
//! ([`fast`]; `fused_recurrent_kda` itself is native for that reason). For anything else the
//! Python package (`python/kda`) checks arguments, converts torch tensors and numpy arrays to
//! contiguous float32 arrays and calls `delta_rule`. Either way the arrays are read in place,
//! the GIL is released and the work runs on a rayon pool.
//!
//! Every call into kda-core / kda-host goes through [`core_api`].
#![deny(missing_docs)]

pub mod array;
pub mod compute;
pub mod core_api;
pub mod delta;
pub mod fast;
pub mod layer;
pub mod numpy_api;
pub mod pool;
pub mod threads;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};

use array::F32Array;
use compute::compute;
use core_api::GateForm;
use delta::{Dims, Flags, Inputs, Outputs};

/// A new uninitialised float32 numpy array of `shape`, for the outputs of the general path
/// ([`pool::empty`]: large ones reuse freed outputs' memory).
#[pyfunction]
fn new_f32<'py>(py: Python<'py>, shape: Vec<usize>) -> PyResult<Bound<'py, PyAny>> {
    pool::empty(py, numpy_api::numpy_api(py)?, &shape)
}

/// The fast path of `kda.chunk_kda` (`chunked` true) and `kda.fused_recurrent_kda`: then the
/// arguments of those functions in their order (`chunk_kda`'s own extra flags already handled
/// by its wrapper); returns `(o, final_state or None)`, or `None` when the call needs the
/// wrapper's general path (see [`fast`]).
#[pyfunction]
#[pyo3(signature = (chunked, q, k, v, g, beta, a_log, dt_bias, scale, initial_state,
    output_final_state, l2norm, gate_in_kernel, beta_sigmoid, allow_neg_eigval, lower_bound, v_first,
    cu_seqlens, threads))]
// The arguments of fla's chunk_kda / fused_recurrent_kda, all positional (the cheapest call).
#[allow(clippy::too_many_arguments)]
fn fla_forward<'py>(
    py: Python<'py>,
    chunked: bool,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    g: &Bound<'py, PyAny>,
    beta: &Bound<'py, PyAny>,
    a_log: &Bound<'py, PyAny>,
    dt_bias: &Bound<'py, PyAny>,
    scale: &Bound<'py, PyAny>,
    initial_state: &Bound<'py, PyAny>,
    output_final_state: &Bound<'py, PyAny>,
    l2norm: &Bound<'py, PyAny>,
    gate_in_kernel: &Bound<'py, PyAny>,
    beta_sigmoid: &Bound<'py, PyAny>,
    allow_neg_eigval: &Bound<'py, PyAny>,
    lower_bound: &Bound<'py, PyAny>,
    v_first: &Bound<'py, PyAny>,
    cu_seqlens: &Bound<'py, PyAny>,
    threads: &Bound<'py, PyAny>,
) -> PyResult<Option<fast::FlaResult<'py>>> {
    let args = fast::FlaArgs {
        a_log,
        dt_bias,
        scale,
        initial_state,
        output_final_state,
        l2norm,
        gate_in_kernel,
        beta_sigmoid,
        allow_neg_eigval,
        lower_bound,
        v_first,
        cu_seqlens,
        threads,
        chunked,
    };
    fast::fla_forward(py, [q, k, v, g, beta], &args)
}

/// Token-by-token KDA forward, a CPU drop-in for ``fla.ops.kda.fused_recurrent_kda``
/// (fla-core 0.6.0); the decode path.
///
/// Same arguments, shapes and results as :func:`chunk_kda` (``A_log`` / ``dt_bias`` are
/// positional here, as in fla), except: ``o`` has v's dtype and ``initial_state`` may be of
/// any float dtype. Without ``A_log`` the in-kernel softplus gate is
/// ``-exp(1)*softplus(g + dt_bias)``, as fla's kernel computes it. A per-value ``beta`` of
/// shape ``[B, T, HV, V]`` raises ``NotImplementedError``.
///
/// Native, so that a decode step costs little over its kernel: the common call goes straight
/// to the fast path (``_core.fla_forward``'s), anything else to the Python general path
/// (``kda._ops._fused_recurrent_kda``).
#[pyfunction]
#[pyo3(signature = (q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
    output_final_state=None, use_qk_l2norm_in_kernel=None, use_gate_in_kernel=None,
    use_beta_sigmoid_in_kernel=None, allow_neg_eigval=None, lower_bound=None, state_v_first=None,
    cu_seqlens=None, threads=None, **kwargs),
    text_signature = "(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, \
    initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False, \
    use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, \
    lower_bound=None, state_v_first=False, cu_seqlens=None, threads=None, **kwargs)")]
// fla's signature (its names included); a flag left out is None, false as fla's default is.
#[allow(clippy::too_many_arguments, non_snake_case)]
fn fused_recurrent_kda<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    g: &Bound<'py, PyAny>,
    beta: &Bound<'py, PyAny>,
    A_log: Option<&Bound<'py, PyAny>>,
    dt_bias: Option<&Bound<'py, PyAny>>,
    scale: Option<&Bound<'py, PyAny>>,
    initial_state: Option<&Bound<'py, PyAny>>,
    output_final_state: Option<&Bound<'py, PyAny>>,
    use_qk_l2norm_in_kernel: Option<&Bound<'py, PyAny>>,
    use_gate_in_kernel: Option<&Bound<'py, PyAny>>,
    use_beta_sigmoid_in_kernel: Option<&Bound<'py, PyAny>>,
    allow_neg_eigval: Option<&Bound<'py, PyAny>>,
    lower_bound: Option<&Bound<'py, PyAny>>,
    state_v_first: Option<&Bound<'py, PyAny>>,
    cu_seqlens: Option<&Bound<'py, PyAny>>,
    threads: Option<&Bound<'py, PyAny>>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let none = py.None().into_bound(py);
    let no = PyBool::new(py, false).to_owned().into_any();
    let or_none = |x: Option<&Bound<'py, PyAny>>| x.cloned().unwrap_or_else(|| none.clone());
    let or_false = |x: Option<&Bound<'py, PyAny>>| x.cloned().unwrap_or_else(|| no.clone());
    let args = [
        or_none(A_log),
        or_none(dt_bias),
        or_none(scale),
        or_none(initial_state),
        or_false(output_final_state),
        or_false(use_qk_l2norm_in_kernel),
        or_false(use_gate_in_kernel),
        or_false(use_beta_sigmoid_in_kernel),
        or_false(allow_neg_eigval),
        or_none(lower_bound),
        or_false(state_v_first),
        or_none(cu_seqlens),
        or_none(threads),
    ];
    if kwargs.is_none_or(|kw| kw.is_empty()) {
        let [a_log, dt_bias, scale, initial_state, output_final_state, l2norm, gate_in_kernel, beta_sigmoid, allow_neg_eigval, lower_bound, v_first, cu_seqlens, threads] =
            &args;
        let fla = fast::FlaArgs {
            a_log,
            dt_bias,
            scale,
            initial_state,
            output_final_state,
            l2norm,
            gate_in_kernel,
            beta_sigmoid,
            allow_neg_eigval,
            lower_bound,
            v_first,
            cu_seqlens,
            threads,
            chunked: false,
        };
        if let Some((o, ht)) = fast::fla_forward(py, [q, k, v, g, beta], &fla)? {
            return PyTuple::new(py, [o, ht.unwrap_or(none)]).map(Bound::into_any);
        }
    }
    let all: Vec<Bound<'py, PyAny>> = [q, k, v, g, beta]
        .into_iter()
        .cloned()
        .chain(args)
        .collect();
    py.import(intern!(py, "kda._ops"))?
        .getattr(intern!(py, "_fused_recurrent_kda"))?
        .call(PyTuple::new(py, all)?, kwargs)
}

fn dim3(a: &F32Array, name: &str) -> PyResult<[usize; 3]> {
    match a.shape[..] {
        [t, h, d] => Ok([t, h, d]),
        _ => Err(PyValueError::new_err(format!(
            "{name}: expected 3 dimensions [T, H, D], got shape {:?}",
            a.shape
        ))),
    }
}

fn opt_array(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<F32Array>> {
    obj.filter(|o| !o.is_none())
        .map(|o| F32Array::new(o, name))
        .transpose()
}

fn gate_form(gate: &str, lower_bound: Option<f32>) -> PyResult<Option<GateForm>> {
    match (gate, lower_bound) {
        ("none", _) => Ok(None),
        ("softplus", _) => Ok(Some(GateForm::Softplus)),
        ("lower_bound", Some(lb)) if lb.is_finite() && lb < 0.0 => {
            Ok(Some(GateForm::LowerBound(lb)))
        }
        ("lower_bound", lb) => Err(PyValueError::new_err(format!(
            "lower_bound: expected a finite negative number, got {lb:?}"
        ))),
        (other, _) => Err(PyValueError::new_err(format!(
            "gate: expected 'none', 'softplus' or 'lower_bound', got '{other}'"
        ))),
    }
}

/// The delta rule over packed sequences (the engine of `kda.chunk_kda` and
/// `kda.fused_recurrent_kda`; call those). All arrays are C-contiguous float32 numpy arrays:
/// `q`, `k` `[T, H, K]`, `v` `[T, HV, V]`, `g` `[T, HV, K]`, `beta` `[T, HV, 1]`, `a_log`
/// `[HV]`, `dt_bias` `[HV*K]`, states `[N, HV, K, V]` (`[N, HV, V, K]` with `v_first`), `o`
/// `[T, HV, V]` written; `chunked` picks the chunked form (the core's default chunk size, the
/// fastest: the chunk grid changes only rounding) over the token-by-token recurrence. Returns the
/// nanoseconds spent computing (GIL released).
#[pyfunction]
#[pyo3(signature = (q, k, v, g, beta, o, cu_seqlens, scale, *, a_log=None, dt_bias=None,
    initial_state=None, final_state=None, l2norm=false, gate="none", lower_bound=None,
    beta_factor=None, chunked=false, v_first=false, threads=None))]
// The arguments of fla's chunk_kda / fused_recurrent_kda (as the Python wrapper passes them).
#[allow(clippy::too_many_arguments)]
fn delta_rule(
    py: Python<'_>,
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    g: &Bound<'_, PyAny>,
    beta: &Bound<'_, PyAny>,
    o: &Bound<'_, PyAny>,
    cu_seqlens: Vec<usize>,
    scale: f32,
    a_log: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    initial_state: Option<&Bound<'_, PyAny>>,
    final_state: Option<&Bound<'_, PyAny>>,
    l2norm: bool,
    gate: &str,
    lower_bound: Option<f32>,
    beta_factor: Option<f32>,
    chunked: bool,
    v_first: bool,
    threads: Option<usize>,
) -> PyResult<u64> {
    let q = F32Array::new(q, "q")?;
    let k = F32Array::new(k, "k")?;
    let v = F32Array::new(v, "v")?;
    let g = F32Array::new(g, "g")?;
    let beta = F32Array::new(beta, "beta")?;
    let a_log = opt_array(a_log, "A_log")?;
    let dt_bias = opt_array(dt_bias, "dt_bias")?;
    let h0 = opt_array(initial_state, "initial_state")?;
    let o = F32Array::new(o, "o")?;
    let ht = opt_array(final_state, "final_state")?;
    let [tokens, heads, kd] = dim3(&q, "q")?;
    let [_, v_heads, vd] = dim3(&v, "v")?;
    let dims = Dims {
        tokens,
        heads,
        v_heads,
        k: kd,
        v: vd,
    };
    let flags = Flags {
        scale,
        l2norm,
        gate: gate_form(gate, lower_bound)?,
        beta_sigmoid: beta_factor,
        chunk: chunked.then_some(core_api::DEFAULT_CHUNK),
        v_first,
    };
    let reads = [&q, &k, &v, &g, &beta];
    let opt_reads = [&a_log, &dt_bias, &h0];
    let all_reads = reads
        .into_iter()
        .chain(opt_reads.into_iter().flatten())
        .collect::<Vec<_>>();
    for (w, wname) in [(Some(&o), "o"), (ht.as_ref(), "final_state")] {
        let Some(w) = w else { continue };
        if all_reads.iter().any(|r| r.overlaps(w))
            || (wname == "o" && ht.as_ref().is_some_and(|h| h.overlaps(w)))
        {
            return Err(PyValueError::new_err(format!(
                "{wname}: must not share memory with an input"
            )));
        }
    }
    let x = Inputs {
        q: q.as_slice(),
        k: k.as_slice(),
        v: v.as_slice(),
        g: g.as_slice(),
        beta: beta.as_slice(),
        a_log: a_log.as_ref().map(F32Array::as_slice),
        dt_bias: dt_bias.as_ref().map(F32Array::as_slice),
        initial_state: h0.as_ref().map(F32Array::as_slice),
        cu_seqlens: &cu_seqlens,
    };
    let out = Outputs {
        o: o.as_mut_slice("o")?,
        final_state: ht
            .as_ref()
            .map(|h| h.as_mut_slice("final_state"))
            .transpose()?,
    };
    let tasks = cu_seqlens.len().saturating_sub(1).saturating_mul(v_heads);
    // One task: run it on this thread rather than hand it to the pool.
    let threads = if tasks <= 1 {
        1
    } else {
        threads::resolve(threads)?
    };
    compute(py, &dims, &x, &flags, out, threads)
}

/// The native module `kda._core`.
#[pymodule]
#[pyo3(name = "_core")]
fn kda_core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(delta_rule, m)?)?;
    m.add_function(wrap_pyfunction!(fla_forward, m)?)?;
    m.add_function(wrap_pyfunction!(fused_recurrent_kda, m)?)?;
    m.add_function(wrap_pyfunction!(compute::last_compute_ns, m)?)?;
    m.add_function(wrap_pyfunction!(new_f32, m)?)?;
    m.add_function(wrap_pyfunction!(pool::empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(pool::cache_info, m)?)?;
    m.add_class::<pool::Buffer>()?;
    m.add_function(wrap_pyfunction!(threads::set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads::get_num_threads, m)?)?;
    m.add_class::<layer::KdaLayer>()?;
    m.add_class::<layer::KdaCache>()?;
    Ok(())
}
