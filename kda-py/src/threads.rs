//! The thread count: a module-wide setting (`kda.set_num_threads`) or a per-call `threads=`,
//! each count served by its own persistent rayon pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rayon::ThreadPool;

/// The module-wide thread count; 0 means one per CPU.
static SETTING: AtomicUsize = AtomicUsize::new(0);
/// Pools built so far, by size.
static POOLS: Mutex<Vec<(usize, Arc<ThreadPool>)>> = Mutex::new(Vec::new());
/// The most threads a call may ask for.
const MAX_THREADS: usize = 1024;

/// CPUs available to the process, read once (the query reads cgroup files).
fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn check(n: usize) -> PyResult<usize> {
    if (1..=MAX_THREADS).contains(&n) {
        Ok(n)
    } else {
        Err(PyValueError::new_err(format!(
            "threads: expected 1..={MAX_THREADS}, got {n}"
        )))
    }
}

/// The thread count of a call: `threads` if given, else the module setting.
pub fn resolve(threads: Option<usize>) -> PyResult<usize> {
    match threads {
        Some(n) => check(n),
        None => match SETTING.load(Ordering::Relaxed) {
            0 => Ok(cpus()),
            n => Ok(n),
        },
    }
}

/// Sets the number of threads kda's functions use when a call does not say (`None`: one per
/// CPU, the default).
#[pyfunction]
#[pyo3(signature = (threads=None))]
pub fn set_num_threads(threads: Option<usize>) -> PyResult<()> {
    let n = threads.map(check).transpose()?.unwrap_or(0);
    SETTING.store(n, Ordering::Relaxed);
    Ok(())
}

/// The number of threads kda's functions use when a call does not say.
#[pyfunction]
pub fn get_num_threads() -> usize {
    resolve(None).unwrap_or(1)
}

fn pool(n: usize) -> Result<Arc<ThreadPool>, String> {
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = pools.iter().find(|(size, _)| *size == n) {
        return Ok(p.clone());
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("kda-{i}"))
        .build()
        .map_err(|e| format!("cannot start {n} threads: {e}"))?;
    let p = Arc::new(p);
    pools.push((n, p.clone()));
    Ok(p)
}

/// Runs `f` on a pool of `n` threads (on the calling thread when `n == 1`).
pub fn install<T: Send>(
    n: usize,
    f: impl FnOnce() -> Result<T, String> + Send,
) -> Result<T, String> {
    if n <= 1 {
        return f();
    }
    pool(n)?.install(f)
}
