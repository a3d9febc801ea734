//! The fast path of `kda.chunk_kda` / `kda.fused_recurrent_kda`: the common call (every array
//! a C-contiguous float32 torch CPU tensor, or every one a numpy array, no `cu_seqlens`) read,
//! checked and allocated here in one native call, with no numpy conversion and no Python-level
//! checks: a decode step costs a few microseconds over its kernel.
//!
//! Anything else — another dtype or layout, mixed kinds, `cu_seqlens`, a shape or value the
//! Python wrapper would reject — is *declined* (`None`): the wrapper then takes its general
//! path, which converts what needs converting and raises its errors. So the fast path never
//! changes a result or an error; it only skips work for calls it fully understands.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::array::F32Array;
use crate::compute::compute;
use crate::core_api::{self, GateForm};
use crate::delta::{Dims, Flags, Inputs, Outputs};
use crate::numpy_api::{numpy_api, numpy_api_if_loaded, NumpyApi};

/// What the fast path needs of torch, looked up once.
struct TorchApi {
    tensor: Py<PyType>,
    float32: Py<PyAny>,
    /// `torch.utils.dlpack.to_dlpack`, if this torch has it: a tensor's dtype, device, shape,
    /// strides and data in one call.
    to_dlpack: Option<Py<PyAny>>,
    /// `torch.from_numpy`: outputs are numpy arrays seen as tensors, as the general path
    /// makes them (cheaper than `torch.empty`, and always on the CPU whatever the default
    /// device).
    from_numpy: Py<PyAny>,
}

static TORCH: PyOnceLock<TorchApi> = PyOnceLock::new();

fn torch_api(py: Python<'_>) -> PyResult<TorchApi> {
    let m = py.import("torch")?;
    Ok(TorchApi {
        tensor: m.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
        float32: m.getattr("float32")?.unbind(),
        from_numpy: m.getattr("from_numpy")?.unbind(),
        to_dlpack: py
            .import("torch.utils.dlpack")
            .and_then(|d| d.getattr("to_dlpack"))
            .ok()
            .map(Bound::unbind),
    })
}

/// The kind of array a call works on.
#[derive(Clone, Copy)]
enum Kind<'a> {
    Torch(&'a TorchApi),
    Numpy(&'a NumpyApi),
}

impl<'a> Kind<'a> {
    /// The kind of `x` (exactly a `torch.Tensor` or a `numpy.ndarray`, subclasses declined),
    /// looking torch or numpy up on first use (their module is loaded: `x` is one of theirs).
    fn of(x: &Bound<'_, PyAny>) -> Option<Kind<'static>> {
        let py = x.py();
        let ty = x.get_type();
        if let Some(t) = TORCH.get(py) {
            if ty.is(t.tensor.bind(py)) {
                return Some(Kind::Torch(t));
            }
        }
        if let Some(n) = numpy_api_if_loaded(py) {
            if ty.is(n.ndarray.bind(py)) {
                return Some(Kind::Numpy(n));
            }
        }
        let module = ty.module().ok()?;
        if module == *"torch" && TORCH.get(py).is_none() {
            TORCH.get_or_try_init(py, || torch_api(py)).ok()?;
            return Kind::of(x);
        }
        if module == *"numpy" && numpy_api_if_loaded(py).is_none() {
            numpy_api(py).ok()?;
            return Kind::of(x);
        }
        None
    }

    /// `x` seen in place, if it is of this kind and a C-contiguous float32 array (on the CPU,
    /// without torch's lazy negation); `None` otherwise. (A tensor of another layout than
    /// strided — sparse, mkldnn — raises in `is_contiguous`, and is declined.)
    fn view(self, x: &Bound<'_, PyAny>, name: &str) -> Option<F32Array> {
        let py = x.py();
        match self {
            Kind::Torch(t) => {
                // torch's lazy negation is not in the DLPack view: checked first.
                if !x.get_type().is(t.tensor.bind(py))
                    || x.call_method0(intern!(py, "is_neg"))
                        .ok()?
                        .is_truthy()
                        .ok()?
                {
                    return None;
                }
                if let Some(to_dlpack) = &t.to_dlpack {
                    let cap = to_dlpack.bind(py).call1((x,)).ok()?;
                    return F32Array::from_dlpack(&cap, name);
                }
                let ok = x.getattr(intern!(py, "dtype")).ok()?.is(t.float32.bind(py))
                    && x.getattr(intern!(py, "dtype")).ok()?.is(t.float32.bind(py))
                    && x.getattr(intern!(py, "is_cpu")).ok()?.is_truthy().ok()?
                    && x.call_method0(intern!(py, "is_contiguous"))
                        .ok()?
                        .is_truthy()
                        .ok()?;
                if !ok {
                    return None;
                }
                let shape: Vec<usize> = x.getattr(intern!(py, "shape")).ok()?.extract().ok()?;
                let addr: usize = x
                    .call_method0(intern!(py, "data_ptr"))
                    .ok()?
                    .extract()
                    .ok()?;
                F32Array::from_parts(addr, shape, true, name).ok()
            }
            Kind::Numpy(n) => {
                if !x.get_type().is(n.ndarray.bind(py)) {
                    return None;
                }
                F32Array::from_array_struct(x, name)
            }
        }
    }

    /// An optional argument: `Some(None)` for `None`, `Some(Some(view))` for a usable array,
    /// `None` (decline) otherwise.
    fn opt_view(self, x: &Bound<'_, PyAny>, name: &str) -> Option<Option<F32Array>> {
        if x.is_none() {
            Some(None)
        } else {
            self.view(x, name).map(Some)
        }
    }

    /// A new uninitialised float32 array of `shape`, of this kind, and its view: a numpy
    /// array ([`crate::pool::empty`]: large ones reuse freed outputs' memory), seen as a tensor
    /// for torch (as the general path makes its outputs).
    fn new_array<'py>(
        self,
        py: Python<'py>,
        shape: &[usize],
        name: &str,
    ) -> PyResult<(Bound<'py, PyAny>, F32Array)> {
        let arr = crate::pool::empty(py, numpy_api(py)?, shape)?;
        let view = F32Array::from_array_struct(&arr, name).ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(format!(
                "internal error in kda (please report): {name}: numpy.empty made no contiguous float32 array"
            ))
        })?;
        let arr = match self {
            Kind::Torch(t) => t.from_numpy.bind(py).call1((arr,))?,
            Kind::Numpy(_) => arr,
        };
        Ok((arr, view))
    }
}

/// `B, T, H, K, HV, V` of fla's `[B, T, H, K]` / `[B, T, HV, V]` layouts, when q, k, v, g and
/// beta agree as the Python wrapper requires (and nothing is empty).
fn fla_shape(a: &[F32Array; 5]) -> Option<[usize; 6]> {
    let [q, k, v, g, beta] = a;
    let &[b, t, h, kd] = &q.shape[..] else {
        return None;
    };
    let &[vb, vt, hv, vd] = &v.shape[..] else {
        return None;
    };
    let ok = k.shape == q.shape
        && (vb, vt) == (b, t)
        && h > 0
        && hv.is_multiple_of(h)
        && (1..=256).contains(&kd)
        && g.shape[..] == [b, t, hv, kd]
        && beta.shape[..] == [b, t, hv]
        && b * t * hv * vd > 0;
    ok.then_some([b, t, h, kd, hv, vd])
}

/// The flags of one call, as the Python functions receive them.
pub struct FlaArgs<'a, 'py> {
    /// `A_log`.
    pub a_log: &'a Bound<'py, PyAny>,
    /// `dt_bias`.
    pub dt_bias: &'a Bound<'py, PyAny>,
    /// `scale`.
    pub scale: &'a Bound<'py, PyAny>,
    /// `initial_state`.
    pub initial_state: &'a Bound<'py, PyAny>,
    /// `output_final_state`.
    pub output_final_state: &'a Bound<'py, PyAny>,
    /// `use_qk_l2norm_in_kernel`.
    pub l2norm: &'a Bound<'py, PyAny>,
    /// `use_gate_in_kernel`.
    pub gate_in_kernel: &'a Bound<'py, PyAny>,
    /// `use_beta_sigmoid_in_kernel`.
    pub beta_sigmoid: &'a Bound<'py, PyAny>,
    /// `allow_neg_eigval`.
    pub allow_neg_eigval: &'a Bound<'py, PyAny>,
    /// `lower_bound`.
    pub lower_bound: &'a Bound<'py, PyAny>,
    /// `state_v_first`.
    pub v_first: &'a Bound<'py, PyAny>,
    /// `cu_seqlens`.
    pub cu_seqlens: &'a Bound<'py, PyAny>,
    /// `threads`.
    pub threads: &'a Bound<'py, PyAny>,
    /// `chunk_kda` (else `fused_recurrent_kda`).
    pub chunked: bool,
}

/// The gate arrays of a call: `A_log` `[HV]` and `dt_bias` `[HV·K]`, each viewed in place,
/// `A_log` defaulting to ones (fla's recurrent kernel's `b_A = 1`).
struct GateArrays {
    a_log: Option<F32Array>,
    /// The default `A_log` when none was given.
    ones: Option<Vec<f32>>,
    dt_bias: Option<F32Array>,
}

/// The decay gate and its arrays, as `_gate_args` of the Python wrapper computes them, or
/// `None` (decline).
fn gate(
    kind: Kind<'_>,
    a: &FlaArgs<'_, '_>,
    hv: usize,
    kd: usize,
) -> Option<(Option<GateForm>, GateArrays)> {
    let none = GateArrays {
        a_log: None,
        ones: None,
        dt_bias: None,
    };
    if !a.gate_in_kernel.is_truthy().ok()? {
        return Some((None, none));
    }
    let form = if a.lower_bound.is_none() {
        GateForm::Softplus
    } else {
        // As the wrapper's check and then the extension's on the f32 value.
        let lb = a.lower_bound.extract::<f64>().ok()? as f32;
        if !(lb.is_finite() && lb < 0.0) {
            return None;
        }
        GateForm::LowerBound(lb)
    };
    let a_log = kind.opt_view(a.a_log, "A_log")?;
    if a_log.as_ref().is_some_and(|x| x.len != hv) {
        return None;
    }
    let ones = match (&a_log, form) {
        // chunk_kda requires A_log for the softplus gate (its wrapper has said so already).
        (None, GateForm::Softplus) if a.chunked => return None,
        (None, GateForm::Softplus) => Some(vec![1.0; hv]),
        _ => None,
    };
    let dt_bias = kind.opt_view(a.dt_bias, "dt_bias")?;
    if dt_bias.as_ref().is_some_and(|x| x.len != hv * kd) {
        return None;
    }
    Some((
        Some(form),
        GateArrays {
            a_log,
            ones,
            dt_bias,
        },
    ))
}

/// Flags of the call (all but the gate), or `None` (decline).
fn flags(a: &FlaArgs<'_, '_>, kd: usize, gate: Option<GateForm>) -> Option<Flags> {
    let beta_sigmoid = a.beta_sigmoid.is_truthy().ok()?;
    let neg = a.allow_neg_eigval.is_truthy().ok()?;
    if neg && !beta_sigmoid {
        return None;
    }
    let scale = if a.scale.is_none() {
        (kd as f64).powf(-0.5)
    } else {
        a.scale.extract::<f64>().ok()?
    };
    Some(Flags {
        scale: scale as f32,
        l2norm: a.l2norm.is_truthy().ok()?,
        gate,
        beta_sigmoid: beta_sigmoid.then_some(if neg { 2.0 } else { 1.0 }),
        chunk: a.chunked.then_some(core_api::DEFAULT_CHUNK),
        v_first: a.v_first.is_truthy().ok()?,
    })
}

/// The thread count of a call of `tasks` tasks, as `delta_rule` picks it, or `None` (decline:
/// the general path raises the error).
fn threads(a: &FlaArgs<'_, '_>, tasks: usize) -> Option<usize> {
    let threads = if a.threads.is_none() {
        None
    } else {
        Some(a.threads.extract::<usize>().ok()?)
    };
    if tasks <= 1 {
        Some(1)
    } else {
        crate::threads::resolve(threads).ok()
    }
}

/// The result of a call that the fast path ran: `(o, final_state or None)`.
pub type FlaResult<'py> = (Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);

/// A call the fast path takes: its arrays seen in place and everything checked.
struct Call {
    kind: Kind<'static>,
    /// q, k, v, g, beta.
    arrays: [F32Array; 5],
    /// `B, T, H, K, HV, V`.
    shape: [usize; 6],
    gates: GateArrays,
    flags: Flags,
    h0: Option<F32Array>,
    /// `[B, HV, K, V]` or `[B, HV, V, K]`.
    state_shape: [usize; 4],
    want_state: bool,
    threads: usize,
}

/// The call, if the fast path takes it (`None`: declined).
fn prepare(qkvgb: [&Bound<'_, PyAny>; 5], a: &FlaArgs<'_, '_>) -> Option<Call> {
    if !a.cu_seqlens.is_none() {
        return None;
    }
    let kind = Kind::of(qkvgb[0])?;
    let names = ["q", "k", "v", "g", "beta"];
    let views: Vec<F32Array> = qkvgb
        .iter()
        .zip(names)
        .map(|(x, n)| kind.view(x, n))
        .collect::<Option<_>>()?;
    let arrays = <[F32Array; 5]>::try_from(views).ok()?;
    let shape @ [b, _, _, kd, hv, vd] = fla_shape(&arrays)?;
    let (form, gates) = gate(kind, a, hv, kd)?;
    let flags = flags(a, kd, form)?;
    let h0 = kind.opt_view(a.initial_state, "initial_state")?;
    let state_shape = if flags.v_first {
        [b, hv, vd, kd]
    } else {
        [b, hv, kd, vd]
    };
    if h0.as_ref().is_some_and(|s| s.shape[..] != state_shape) {
        return None;
    }
    Some(Call {
        kind,
        arrays,
        shape,
        gates,
        flags,
        h0,
        state_shape,
        want_state: a.output_final_state.is_truthy().ok()?,
        threads: threads(a, b * hv)?,
    })
}

/// Allocates the outputs of `c` and runs it.
fn run<'py>(py: Python<'py>, c: &Call) -> PyResult<FlaResult<'py>> {
    let [b, t, h, kd, hv, vd] = c.shape;
    let (o, o_view) = c.kind.new_array(py, &[b, t, hv, vd], "o")?;
    let ht = c
        .want_state
        .then(|| c.kind.new_array(py, &c.state_shape, "final_state"))
        .transpose()?;
    let cu: Vec<usize> = (0..=b).map(|i| i * t).collect();
    let [q, k, v, g, beta] = &c.arrays;
    let x = Inputs {
        q: q.as_slice(),
        k: k.as_slice(),
        v: v.as_slice(),
        g: g.as_slice(),
        beta: beta.as_slice(),
        a_log: c
            .gates
            .a_log
            .as_ref()
            .map(F32Array::as_slice)
            .or(c.gates.ones.as_deref()),
        dt_bias: c.gates.dt_bias.as_ref().map(F32Array::as_slice),
        initial_state: c.h0.as_ref().map(F32Array::as_slice),
        cu_seqlens: &cu,
    };
    let out = Outputs {
        o: o_view.as_mut_slice("o")?,
        final_state: match &ht {
            Some((_, view)) => Some(view.as_mut_slice("final_state")?),
            None => None,
        },
    };
    let dims = Dims {
        tokens: b * t,
        heads: h,
        v_heads: hv,
        k: kd,
        v: vd,
    };
    compute(py, &dims, &x, &c.flags, out, c.threads)?;
    Ok((o, ht.map(|(arr, _)| arr)))
}

/// The whole fast path: `Ok(None)` declines the call. The Python objects behind the views
/// (`qkvgb` and `a`'s arrays) are the caller's arguments, alive for the whole call.
pub fn fla_forward<'py>(
    py: Python<'py>,
    qkvgb: [&Bound<'py, PyAny>; 5],
    a: &FlaArgs<'_, 'py>,
) -> PyResult<Option<FlaResult<'py>>> {
    match prepare(qkvgb, a) {
        Some(call) => run(py, &call).map(Some),
        None => Ok(None),
    }
}
