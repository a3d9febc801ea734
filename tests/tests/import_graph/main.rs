//! Imports go one way: no two files of a crate use each other, directly or through others.
//!
//! The test reads every `.rs` file under [`DIRS`] and builds each crate's module tree from its
//! roots (`lib.rs`, `main.rs`, `bin/*.rs`, `bin/*/main.rs`) through its `mod` declarations:
//! `mod x;` in `lib.rs`, `main.rs`, `mod.rs` or a crate root is `x.rs` or `x/mod.rs` beside
//! it, in `a.rs` it is `a/x.rs` or `a/x/mod.rs`, `#[path = "…"]` overrides both, and
//! `mod x { … }` blocks are modules of their own inside their file. A file no root reaches,
//! or a `mod x;` without a file, fails the test.
//!
//! Then it collects the paths each file writes, with comments, doc comments and string
//! literals removed first: the leaves of its `use` declarations, the paths in its code
//! (`crate::x::y`, `super::X`, `self::x::f`, `$crate::x`, and `x::Y` where `x` is a child
//! module or an imported name), and the plain names in its code that one of its `use`
//! declarations binds. Each is resolved from the crate root down to the deepest module that
//! exists, through `use` declarations to the module that defines the name (a name `lib.rs`
//! re-exports counts as used from the file that defines it, not from `lib.rs`). If that
//! module lives in another file of the same crate, the file uses that file: one edge,
//! labelled with the first path or name that makes it.
//!
//! **A parent's table of contents is not an edge.** A module's `mod x;` declarations and its
//! `pub use` / `pub(crate) use` re-exports of items from inside it (its own submodules) say
//! what the module holds, not what it needs, so they make no edge; anything else a parent
//! writes (a private `use x::Y;`, a call `x::f()`, or a re-exported name it uses itself, as
//! in `pub use x::Y; impl Y { … }`) does. A `pub use` of a module outside the file's own
//! counts like any other import.
//!
//! Two more rules keep the graph honest: paths inside a `macro_rules!` body that start with
//! `self`, `super` or a plain name are skipped, since they resolve where the macro is
//! called, not where it is written (`crate` and `$crate` paths count); and references
//! between different crates (a binary's `kda_host::…`) are not file edges, since Cargo
//! already forbids circles between crates.
//!
//! The test fails naming every cycle: its files and, for each edge between them, the first
//! path that makes it and its line.

mod graph;
mod lex;
mod tree;

use std::path::Path;

use tree::Sources;

/// The source folders checked, relative to the workspace root.
const DIRS: &[&str] = &[
    "kda-core/src",
    "kda-host/src",
    "kda-cuda/src",
    "kda-capi/src",
    "kda-py/src",
    "tests/src",
];

/// What is wrong with the crates under `dirs`: unreachable files, missing module files and
/// import cycles, one message each.
fn problems(dirs: &[&str], sources: &Sources) -> Vec<String> {
    let forest = tree::crates(dirs, sources);
    let edges = graph::edges(&forest);
    let cycles = graph::cycles(&edges);
    let cycles = cycles.iter().map(ToString::to_string);
    forest.problems.into_iter().chain(cycles).collect()
}

/// Every `.rs` file under `dir` (relative to `root`), by its path from `root`.
fn read_dir(root: &Path, dir: &str, out: &mut Sources) {
    let entries = std::fs::read_dir(root.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("{dir}: {e}"));
        let name = entry
            .file_name()
            .into_string()
            .expect("file names are UTF-8");
        let rel = format!("{dir}/{name}");
        if entry.file_type().expect("file type").is_dir() {
            read_dir(root, &rel, out);
        } else if name.ends_with(".rs") {
            let text =
                std::fs::read_to_string(root.join(&rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
            out.insert(rel, text);
        }
    }
}

/// The sources under [`DIRS`].
fn workspace_sources() -> Sources {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = Sources::new();
    for dir in DIRS {
        read_dir(&root, dir, &mut sources);
    }
    assert!(
        sources.len() > 50,
        "only {} files found under {DIRS:?}",
        sources.len()
    );
    sources
}

#[test]
fn workspace_files_import_one_way() {
    let problems = problems(DIRS, &workspace_sources());
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// A synthetic crate `c/src` made of `(path under c/src, text)` pairs.
fn synthetic(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(path, text)| (format!("c/src/{path}"), text.to_string()))
        .collect()
}

fn synthetic_problems(files: &[(&str, &str)]) -> Vec<String> {
    problems(&["c/src"], &synthetic(files))
}

#[test]
fn a_cycle_is_found_with_its_first_references() {
    let problems = synthetic_problems(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n"),
        (
            "b.rs",
            "pub struct B;\nfn f() -> super::a::A { super::a::A }\n",
        ),
    ]);
    assert_eq!(
        problems,
        ["import cycle among c/src/a.rs, c/src/b.rs:\n  \
          c/src/a.rs uses c/src/b.rs: `crate::b::B` (line 1)\n  \
          c/src/b.rs uses c/src/a.rs: `super::a::A` (line 2)\n"]
    );
}

#[test]
fn a_cycle_through_three_files_is_one_cycle() {
    let problems = synthetic_problems(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "pub fn a() { crate::b::b() }\n"),
        ("b.rs", "pub fn b() { crate::c::c() }\n"),
        ("c.rs", "pub fn c() { crate::a::a() }\n"),
    ]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("import cycle among c/src/a.rs, c/src/b.rs, c/src/c.rs:"));
}

#[test]
fn an_acyclic_tree_passes() {
    let problems = synthetic_problems(&[
        ("lib.rs", "pub mod low;\npub mod high;\npub use high::H;\n"),
        ("low.rs", "pub struct L;\n"),
        (
            "high/mod.rs",
            "mod part;\npub use part::H;\nuse crate::low::L;\n",
        ),
        (
            "high/part.rs",
            "pub struct H(pub crate::low::L);\nuse super::super::low;\n",
        ),
        ("bin/tool.rs", "mod helper;\nfn main() { helper::run() }\n"),
        ("bin/helper.rs", "pub fn run() { let _ = c::H; }\n"),
    ]);
    assert_eq!(problems, Vec::<String>::new());
}

#[test]
fn a_parents_reexports_and_mod_declarations_are_not_edges() {
    // `lib.rs` and `layer/mod.rs` re-export what their children define, and the children
    // use names through those re-exports: no cycle, and the edges go to the defining files.
    let sources = synthetic(&[
        ("lib.rs", "pub mod error;\npub mod layer;\npub use error::Error;\n"),
        ("error.rs", "pub struct Error;\n"),
        (
            "layer/mod.rs",
            "mod task;\nmod views;\npub use task::Task;\npub(crate) use views::{View, Pair as P};\n",
        ),
        ("layer/task.rs", "use super::View;\nuse crate::Error;\npub struct Task(View);\n"),
        ("layer/views.rs", "pub struct View;\npub struct Pair;\n"),
    ]);
    let forest = tree::crates(&["c/src"], &sources);
    assert_eq!(forest.problems, Vec::<String>::new());
    let edges: Vec<(String, String)> = graph::edges(&forest).into_keys().collect();
    let edge = |a: &str, b: &str| (format!("c/src/{a}"), format!("c/src/{b}"));
    assert_eq!(
        edges,
        [
            edge("layer/task.rs", "error.rs"),
            edge("layer/task.rs", "layer/views.rs")
        ]
    );
}

#[test]
fn a_parent_that_uses_what_it_reexports_has_an_edge() {
    let problems = synthetic_problems(&[
        ("lib.rs", "mod layer;\n"),
        (
            "layer/mod.rs",
            "mod spec;\npub use spec::Layer;\npub struct Batch;\nimpl Layer {}\n",
        ),
        ("layer/spec.rs", "pub struct Layer(super::Batch);\n"),
    ]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("c/src/layer/mod.rs uses c/src/layer/spec.rs: `Layer` (line 4)"));
}

#[test]
fn a_parent_that_uses_its_child_privately_has_an_edge() {
    let problems = synthetic_problems(&[
        ("lib.rs", "mod layer;\n"),
        (
            "layer/mod.rs",
            "mod task;\nuse task::run;\npub struct Views;\n",
        ),
        (
            "layer/task.rs",
            "use super::Views;\npub fn run(_: Views) {}\n",
        ),
    ]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("c/src/layer/mod.rs uses c/src/layer/task.rs: `task::run`"));
    assert!(problems[0].contains("c/src/layer/task.rs uses c/src/layer/mod.rs: `super::Views`"));
}

#[test]
fn comments_strings_inline_modules_and_macros_make_no_edges() {
    let problems = synthetic_problems(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn a() { crate::b::b() }\n"),
        (
            "b.rs",
            r#"pub fn b() {}
// crate::a::a()
/** [`crate::a::a`] */
const S: &str = "crate::a::a";
#[cfg(test)]
mod tests {
    use super::*;
    fn t() { super::b() }
}
macro_rules! m { () => { super::a::a() } }
"#,
        ),
    ]);
    assert_eq!(problems, Vec::<String>::new());
}

#[test]
fn path_attributes_and_unreached_files_are_followed_and_reported() {
    let problems = synthetic_problems(&[
        (
            "lib.rs",
            "#[path = \"other/named.rs\"]\nmod a;\nmod gone;\n",
        ),
        ("other/named.rs", "mod inner;\npub fn f() { inner::g() }\n"),
        ("other/inner.rs", "pub fn g() { crate::a::f() }\n"),
        ("orphan.rs", "pub fn h() {}\n"),
    ]);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0].contains("`mod gone;` has no file"),
        "{problems:?}"
    );
    assert_eq!(problems[1], "c/src/orphan.rs: no crate root reaches it");
    assert!(
        problems[2].starts_with("import cycle among c/src/other/inner.rs, c/src/other/named.rs:")
    );
}
