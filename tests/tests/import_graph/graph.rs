//! The files of each crate and which of them each one uses, resolved from the module tree,
//! and the cycles among them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::tree::{Crate, Forest, PathRef};

/// What makes one file use another: the first path in it that resolves there, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The path.
    pub path: String,
    /// Its line.
    pub line: usize,
}

/// `(from, to)` → the first reference in `from` that resolves into `to`.
pub type Edges = BTreeMap<(String, String), Reference>;

/// The edges between the files of every crate in `forest`.
pub fn edges(forest: &Forest) -> Edges {
    let mut edges = Edges::new();
    for krate in &forest.crates {
        let resolver = Resolver { krate };
        for r in &krate.refs {
            if let Some(to) = resolver.target(r) {
                let first = Reference {
                    path: r.written(),
                    line: r.line,
                };
                edges.entry((r.file.clone(), to)).or_insert(first);
            }
        }
    }
    edges
}

/// How many bindings a resolution may follow (a guard against `use` loops).
const GUARD: usize = 32;

/// Where a walk down the module tree stopped: `exact` when the last segment was found there.
struct Found {
    module: usize,
    exact: bool,
}

struct Resolver<'c> {
    krate: &'c Crate,
}

impl Resolver<'_> {
    /// The other file of the crate `r` makes its file use, if any.
    fn target(&self, r: &PathRef) -> Option<String> {
        let relative = !matches!(r.segs[0].as_str(), "crate" | "$crate");
        if r.in_macro && relative {
            return None;
        }
        if r.name && !self.imports(r.scope, &r.segs[0]) {
            return None;
        }
        let path = self.absolute(r.scope, &r.segs, GUARD)?;
        let to = &self.krate.modules[self.walk(0, &path, GUARD).module].file;
        if *to == r.file || (r.public_use && self.inside(to, &r.file)) {
            return None;
        }
        Some(to.clone())
    }

    /// A `use` in module `scope` binds `name`, by name or through a glob (a plain name counts
    /// only then: a local variable, a field or a type parameter binds nothing).
    fn imports(&self, scope: usize, name: &str) -> bool {
        let m = &self.krate.modules[scope];
        let own = m.children.contains_key(name) || m.items.contains(name);
        !own && m
            .uses
            .iter()
            .any(|b| b.name.is_none() || b.name.as_deref() == Some(name))
    }

    /// `file`'s module lies inside `outer`'s (or is it).
    fn inside(&self, file: &str, outer: &str) -> bool {
        let path = |f: &str| &self.krate.modules[self.krate.files[f]].path;
        path(file).starts_with(path(outer))
    }

    /// `segs`, written in module `scope`, as a path from the crate root; `None` for a path
    /// into another crate (or a local name).
    fn absolute(&self, scope: usize, segs: &[String], guard: usize) -> Option<Vec<String>> {
        let guard = guard.checked_sub(1)?;
        let modules = &self.krate.modules;
        let (base, rest) = match segs.first()?.as_str() {
            "crate" | "$crate" => (Vec::new(), &segs[1..]),
            "self" => (modules[scope].path.clone(), &segs[1..]),
            "super" => {
                let supers = segs.iter().take_while(|s| *s == "super").count();
                let mut m = scope;
                for _ in 0..supers {
                    m = modules[m].parent?;
                }
                (modules[m].path.clone(), &segs[supers..])
            }
            name => (self.lookup(scope, name, guard)?, &segs[1..]),
        };
        Some([base, rest.to_vec()].concat())
    }

    /// The path from the crate root of the name `name` seen in module `scope`: a child
    /// module, an item, an import, or a name a glob import brings.
    fn lookup(&self, scope: usize, name: &str, guard: usize) -> Option<Vec<String>> {
        let m = &self.krate.modules[scope];
        if m.children.contains_key(name) || m.items.contains(name) {
            return Some([m.path.clone(), vec![name.to_string()]].concat());
        }
        if let Some(b) = m.uses.iter().find(|b| b.name.as_deref() == Some(name)) {
            return self.absolute(scope, &b.target, guard);
        }
        for glob in m.uses.iter().filter(|b| b.name.is_none()) {
            let Some(base) = self.absolute(scope, &glob.target, guard) else {
                continue;
            };
            let path = [base, vec![name.to_string()]].concat();
            if self.walk(0, &path, guard).exact {
                return Some(path);
            }
        }
        None
    }

    /// Follows `rest` down from module `m` as far as modules go: into child modules, and
    /// through imports to where the imported name is defined.
    fn walk(&self, m: usize, rest: &[String], guard: usize) -> Found {
        let stop = |exact| Found { module: m, exact };
        let (Some(guard), Some(seg)) = (guard.checked_sub(1), rest.first()) else {
            return stop(rest.is_empty());
        };
        let module = &self.krate.modules[m];
        if let Some(&child) = module.children.get(seg) {
            return self.walk(child, &rest[1..], guard);
        }
        if module.items.contains(seg) {
            return stop(true);
        }
        if let Some(b) = module.uses.iter().find(|b| b.name.as_ref() == Some(seg)) {
            return match self.absolute(m, &b.target, guard) {
                Some(target) => self.walk(0, &[target, rest[1..].to_vec()].concat(), guard),
                None => stop(true), // imported from another crate
            };
        }
        for glob in module.uses.iter().filter(|b| b.name.is_none()) {
            let Some(base) = self.absolute(m, &glob.target, guard) else {
                continue;
            };
            let found = self.walk(0, &[base, rest.to_vec()].concat(), guard);
            if found.exact {
                return found;
            }
        }
        stop(false)
    }
}

/// Files that use each other, directly or through others: one strongly connected component
/// of the file graph, with the edges inside it.
#[derive(Debug)]
pub struct Cycle {
    /// The files, sorted.
    pub files: Vec<String>,
    /// `(from, to, first reference)` for every edge between them.
    pub edges: Vec<(String, String, Reference)>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "import cycle among {}:", self.files.join(", "))?;
        for (from, to, r) in &self.edges {
            writeln!(f, "  {from} uses {to}: `{}` (line {})", r.path, r.line)?;
        }
        Ok(())
    }
}

/// Every cycle of `edges` (strongly connected components of two files or more).
pub fn cycles(edges: &Edges) -> Vec<Cycle> {
    let mut adjacent: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        adjacent.entry(from).or_default().push(to);
        adjacent.entry(to).or_default();
    }
    let mut tarjan = Tarjan::new(&adjacent);
    for &node in adjacent.keys() {
        if !tarjan.index.contains_key(node) {
            tarjan.visit(node);
        }
    }
    let mut found: Vec<Cycle> = tarjan
        .components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|mut files| {
            files.sort();
            let inside: BTreeSet<&str> = files.iter().copied().collect();
            let edges = edges
                .iter()
                .filter(|((a, b), _)| inside.contains(a.as_str()) && inside.contains(b.as_str()))
                .map(|((a, b), r)| (a.clone(), b.clone(), r.clone()))
                .collect();
            Cycle {
                files: files.into_iter().map(str::to_string).collect(),
                edges,
            }
        })
        .collect();
    found.sort_by(|a, b| a.files.cmp(&b.files));
    found
}

/// Tarjan's strongly connected components.
struct Tarjan<'g> {
    adjacent: &'g BTreeMap<&'g str, Vec<&'g str>>,
    index: BTreeMap<&'g str, usize>,
    low: BTreeMap<&'g str, usize>,
    stack: Vec<&'g str>,
    on_stack: BTreeSet<&'g str>,
    components: Vec<Vec<&'g str>>,
}

impl<'g> Tarjan<'g> {
    fn new(adjacent: &'g BTreeMap<&'g str, Vec<&'g str>>) -> Self {
        Tarjan {
            adjacent,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            components: Vec::new(),
        }
    }

    fn visit(&mut self, node: &'g str) {
        let index = self.index.len();
        self.index.insert(node, index);
        self.low.insert(node, index);
        self.stack.push(node);
        self.on_stack.insert(node);
        for &next in &self.adjacent[node] {
            if !self.index.contains_key(next) {
                self.visit(next);
                let low = self.low[node].min(self.low[next]);
                self.low.insert(node, low);
            } else if self.on_stack.contains(next) {
                let low = self.low[node].min(self.index[next]);
                self.low.insert(node, low);
            }
        }
        if self.low[node] == index {
            let mut component = Vec::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack.remove(top);
                component.push(top);
                if top == node {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}
