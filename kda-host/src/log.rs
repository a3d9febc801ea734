//! Debug logging to stderr, switched on with the environment variable `KDA_LOG=debug`.
//!
//! No logging framework: one flag read once, and [`debug`] writes one line per call.

use std::fmt::Arguments;
use std::sync::OnceLock;

/// True when `KDA_LOG` is `debug` (or `trace`).
pub fn debug_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("KDA_LOG")
            .map(|v| {
                let v = v.to_ascii_lowercase();
                v == "debug" || v == "trace"
            })
            .unwrap_or(false)
    })
}

/// Writes `kda debug: <message>` to stderr when debug logging is on.
pub fn debug(args: Arguments<'_>) {
    if debug_enabled() {
        eprintln!("kda debug: {args}");
    }
}
