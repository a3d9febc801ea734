//! The `kda` command line: arbitrary arguments (NUL-separated in the input) are parsed as the
//! tool does, and the sizes and thread counts checked ([`kda_host::cli`]). Nothing may panic,
//! every error must render as text, and whatever passes the checks must be within bounds.
#![no_main]

use kda_host::bench::Preset;
use kda_host::cli::{self, Command, MAX_THREADS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let args = std::iter::once("kda".to_string()).chain(
        data.split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned()),
    );
    let parsed = match cli::parse(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let ok = parsed.check().is_ok();
    let threads = match &parsed.command {
        Command::Forward { threads, .. } | Command::Bench { threads, .. } => *threads,
        _ => None,
    };
    if let Some(t) = threads {
        assert!((1..=MAX_THREADS).contains(&t));
    }
    let (n, _) = cli::resolve_threads(threads);
    assert!((1..=MAX_THREADS).contains(&n));
    if ok {
        let fits = |tokens: usize, hidden: usize| {
            tokens
                .checked_mul(hidden * 4)
                .is_some_and(|b| b <= isize::MAX as usize)
        };
        match parsed.command {
            Command::Bench {
                preset,
                prompt,
                batch,
                ..
            } => {
                let hidden = Preset::from(preset).config().hidden;
                assert!(batch >= 1);
                assert!(prompt.checked_mul(batch).is_some_and(|t| fits(t, hidden)));
            }
            Command::Demo { prompt, .. } => assert!(fits(prompt, cli::DEMO_HIDDEN)),
            _ => {}
        }
    }
});
