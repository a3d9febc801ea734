//! The threaded executor: runs the core's layer tasks on the current rayon thread pool.
//!
//! The core splits every block into independent tasks (projection tiles, one task per
//! (sequence, head), `o_proj` tiles); each output element is computed by the same code whatever
//! thread runs it, so results are bitwise identical for any number of threads.

use kda_core::{Executor, Serial};
use rayon::prelude::*;

/// Runs tasks on the rayon pool the caller is in (`ThreadPool::install`), or the global pool.
#[derive(Debug, Default, Clone, Copy)]
pub struct RayonExec;

impl Executor for RayonExec {
    fn workers(&self) -> usize {
        rayon::current_num_threads().max(1)
    }

    fn run(&self, tasks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let workers = self.workers();
        (0..tasks).into_par_iter().for_each(|t| {
            // Pool threads have distinct indices below the pool size; a caller outside the
            // pool never runs tasks itself (it blocks while the pool works).
            let w = rayon::current_thread_index().unwrap_or(0).min(workers - 1);
            f(t, w)
        });
    }
}

/// The executor for the current context: serial with one thread, rayon otherwise.
pub fn current() -> &'static dyn Executor {
    if rayon::current_num_threads() > 1 {
        &RayonExec
    } else {
        &Serial
    }
}
