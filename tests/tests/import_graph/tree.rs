//! Each crate's module tree, read from its sources: which file holds which module, what each
//! module defines and imports, and every path its files write.

use std::collections::{BTreeMap, BTreeSet};

use crate::lex::{tokens, Tok, Token};

/// Source texts by path (`/`-separated, relative to the workspace root).
pub type Sources = BTreeMap<String, String>;

/// One module: a file, or a `mod name { … }` block inside one.
#[derive(Debug)]
pub struct Module {
    /// Its path from the crate root (empty for the root).
    pub path: Vec<String>,
    /// The file its items are written in.
    pub file: String,
    /// The enclosing module (`None` for the root).
    pub parent: Option<usize>,
    /// Child modules by name.
    pub children: BTreeMap<String, usize>,
    /// Names of the items defined here (functions, types, constants, macros).
    pub items: BTreeSet<String>,
    /// Its `use` declarations.
    pub uses: Vec<Binding>,
}

/// What one leaf of a `use` declaration brings in (`as _` brings in nothing).
#[derive(Debug)]
pub struct Binding {
    /// The name it binds; `None` for a glob (`*`).
    pub name: Option<String>,
    /// The path as written (relative to the module that declares it).
    pub target: Vec<String>,
}

/// A path written in a file, or a plain name (one segment) used in its code.
#[derive(Debug)]
pub struct PathRef {
    /// The file it is written in.
    pub file: String,
    /// The module it is written in (an inline module counts).
    pub scope: usize,
    /// Its segments (`crate`, `super`, `self` and `$crate` included).
    pub segs: Vec<String>,
    /// Its line.
    pub line: usize,
    /// Written in a `pub` / `pub(…)` `use` declaration.
    pub public_use: bool,
    /// Written in a `macro_rules!` body, where `self` and `super` mean the caller's module.
    pub in_macro: bool,
    /// A `use` glob (`…::*`).
    pub glob: bool,
    /// A plain name in code (`KdaLayer`, `check(…)`): it counts only when an import of the
    /// scope binds it.
    pub name: bool,
}

impl PathRef {
    /// The path as written.
    pub fn written(&self) -> String {
        let path = self.segs.join("::");
        if self.glob {
            format!("{path}::*")
        } else {
            path
        }
    }
}

/// One crate: its modules (the root first) and the paths its files write.
#[derive(Debug, Default)]
pub struct Crate {
    /// Modules; index 0 is the crate root.
    pub modules: Vec<Module>,
    /// Every path written in the crate's files.
    pub refs: Vec<PathRef>,
    /// Each file's own module (not the inline ones inside it).
    pub files: BTreeMap<String, usize>,
}

/// Every crate found under the scanned folders, and what did not fit.
#[derive(Debug, Default)]
pub struct Forest {
    /// The crates.
    pub crates: Vec<Crate>,
    /// Files no crate root reaches and `mod` declarations without a file.
    pub problems: Vec<String>,
}

/// The crates of each folder in `dirs` (a crate's `src`): `lib.rs`, `main.rs`, `bin/*.rs`
/// and `bin/*/main.rs` are roots, and `mod` declarations lead from there to every other file.
pub fn crates(dirs: &[&str], sources: &Sources) -> Forest {
    let mut forest = Forest::default();
    for dir in dirs {
        for root in crate_roots(dir, sources) {
            let krate = read_crate(&root, sources, &mut forest.problems);
            forest.crates.push(krate);
        }
        let prefix = format!("{dir}/");
        for file in sources.keys().filter(|f| f.starts_with(&prefix)) {
            if !forest.crates.iter().any(|c| c.files.contains_key(file)) {
                forest
                    .problems
                    .push(format!("{file}: no crate root reaches it"));
            }
        }
    }
    forest
}

fn crate_roots(dir: &str, sources: &Sources) -> Vec<String> {
    let prefix = format!("{dir}/");
    let is_root = |rel: &str| {
        let parts: Vec<&str> = rel.split('/').collect();
        match parts.as_slice() {
            ["lib.rs"] | ["main.rs"] => true,
            ["bin", name] => name.ends_with(".rs"),
            ["bin", _, "main.rs"] => true,
            _ => false,
        }
    };
    let rel = |f: &String| f.strip_prefix(&prefix).map(str::to_string);
    sources
        .keys()
        .filter(|f| rel(f).is_some_and(|r| is_root(&r)))
        .cloned()
        .collect()
}

fn read_crate(root: &str, sources: &Sources, problems: &mut Vec<String>) -> Crate {
    let mut krate = Crate::default();
    krate.modules.push(Module {
        path: Vec::new(),
        file: root.to_string(),
        parent: None,
        children: BTreeMap::new(),
        items: BTreeSet::new(),
        uses: Vec::new(),
    });
    let mut queue = vec![FileToRead {
        file: root.to_string(),
        module: 0,
        mod_rs: true,
    }];
    while let Some(next) = queue.pop() {
        if krate.files.insert(next.file.clone(), next.module).is_some() {
            problems.push(format!("{}: reached by two `mod` declarations", next.file));
            continue;
        }
        let toks = tokens(&sources[&next.file]);
        let mut walk = FileWalk::new(&next, &toks);
        walk.run(&mut krate, sources, problems);
        queue.extend(walk.found);
    }
    krate
}

/// A file a `mod name;` declaration leads to.
struct FileToRead {
    file: String,
    module: usize,
    /// `mod` declarations inside it look in its own folder (`lib.rs`, `main.rs`, `mod.rs`,
    /// a crate root, or a file named by `#[path]`), not in a folder named after it.
    mod_rs: bool,
}

/// A module whose items the walk is in: the brace depth of its body and the folder its
/// `mod name;` declarations look in.
struct Scope {
    module: usize,
    depth: usize,
    dir: String,
}

/// Path keywords, which alone (`pub(crate)`, `&self`) name no item.
const KEYWORDS: &[&str] = &["crate", "$crate", "self", "super"];

const ITEM_KEYWORDS: &[&str] = &["fn", "struct", "enum", "trait", "type", "const", "static"];

/// One pass over a file's tokens.
struct FileWalk<'t> {
    file: String,
    toks: &'t [Token],
    at: usize,
    depth: usize,
    scopes: Vec<Scope>,
    /// The inline module whose `{` comes next.
    next_scope: Option<Scope>,
    /// A `macro_rules!` body opens at the next `{`.
    next_macro: bool,
    /// The depth outside the `macro_rules!` body being read.
    macro_outside: Option<usize>,
    /// The files its `mod name;` declarations lead to.
    found: Vec<FileToRead>,
}

impl<'t> FileWalk<'t> {
    fn new(file: &FileToRead, toks: &'t [Token]) -> Self {
        let (parent, stem) = split_file(&file.file);
        let dir = if file.mod_rs {
            parent.to_string()
        } else {
            format!("{parent}/{stem}")
        };
        FileWalk {
            file: file.file.clone(),
            toks,
            at: 0,
            depth: 0,
            scopes: vec![Scope {
                module: file.module,
                depth: 0,
                dir,
            }],
            next_scope: None,
            next_macro: false,
            macro_outside: None,
            found: Vec::new(),
        }
    }

    fn tok(&self, at: usize) -> Option<&'t Tok> {
        self.toks.get(at).map(|t| &t.tok)
    }

    fn ident(&self, at: usize) -> Option<&'t str> {
        match self.tok(at) {
            Some(Tok::Ident(s)) => Some(s),
            _ => None,
        }
    }

    fn scope(&self) -> &Scope {
        self.scopes
            .last()
            .expect("the file's own scope is never popped")
    }

    fn run(&mut self, krate: &mut Crate, sources: &Sources, problems: &mut Vec<String>) {
        while let Some(tok) = self.tok(self.at) {
            match tok {
                Tok::Punct('{') => self.open(),
                Tok::Punct('}') => self.close(),
                Tok::Ident(w) if w == "mod" && self.macro_outside.is_none() => {
                    self.module_decl(krate, sources, problems)
                }
                Tok::Ident(w) if w == "use" => self.use_decl(krate),
                Tok::Ident(w) if w == "macro_rules" => self.macro_decl(krate),
                Tok::Ident(w) if ITEM_KEYWORDS.contains(&w.as_str()) => self.item(krate),
                Tok::Ident(_) | Tok::Punct('$') => self.path(krate),
                _ => self.at += 1,
            }
        }
    }

    fn open(&mut self) {
        self.depth += 1;
        if let Some(mut scope) = self.next_scope.take() {
            scope.depth = self.depth;
            self.scopes.push(scope);
        }
        if self.next_macro {
            self.next_macro = false;
            self.macro_outside.get_or_insert(self.depth - 1);
        }
        self.at += 1;
    }

    fn close(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        while self.scopes.len() > 1 && self.scope().depth > self.depth {
            self.scopes.pop();
        }
        if self.macro_outside == Some(self.depth) {
            self.macro_outside = None;
        }
        self.at += 1;
    }

    /// `mod name;` (a file) or `mod name { … }` (inline).
    fn module_decl(&mut self, krate: &mut Crate, sources: &Sources, problems: &mut Vec<String>) {
        let (Some(name), Some(after)) = (self.ident(self.at + 1), self.tok(self.at + 2)) else {
            self.at += 1;
            return;
        };
        let parent = self.scope().module;
        match after {
            Tok::Punct(';') => {
                let attr = self.path_attribute();
                let line = self.toks[self.at].line;
                let candidates = match &attr {
                    Some(p) => vec![normalize(&format!("{}/{p}", self.attr_base()))],
                    None => {
                        let dir = &self.scope().dir;
                        vec![format!("{dir}/{name}.rs"), format!("{dir}/{name}/mod.rs")]
                    }
                };
                let file = candidates.iter().find(|c| sources.contains_key(*c));
                let id = add_module(krate, parent, name, file.unwrap_or(&self.file));
                match file {
                    Some(file) => self.found.push(FileToRead {
                        file: file.clone(),
                        module: id,
                        mod_rs: attr.is_some() || file.ends_with("/mod.rs"),
                    }),
                    None => problems.push(format!(
                        "{}:{line}: `mod {name};` has no file ({})",
                        self.file,
                        candidates.join(" or ")
                    )),
                }
            }
            Tok::Punct('{') => {
                let id = add_module(krate, parent, name, &self.file);
                let dir = format!("{}/{name}", self.scope().dir);
                self.next_scope = Some(Scope {
                    module: id,
                    depth: 0,
                    dir,
                });
            }
            _ => {}
        }
        self.at += 2;
    }

    /// The folder a `#[path]` on a `mod` here is relative to: the file's own folder, or the
    /// inline module's folder inside an inline module.
    fn attr_base(&self) -> String {
        if self.scopes.len() == 1 {
            split_file(&self.file).0.to_string()
        } else {
            self.scope().dir.clone()
        }
    }

    /// The value of a `#[path = "…"]` attribute on the `mod` at `self.at`.
    fn path_attribute(&self) -> Option<String> {
        let mut j = self.visibility_start(self.at);
        while j >= 2 && self.tok(j - 1) == Some(&Tok::Punct(']')) {
            let open = (0..j - 1)
                .rev()
                .find(|&k| self.tok(k) == Some(&Tok::Punct('[')))?;
            if let [Tok::Ident(key), Tok::Punct('='), Tok::Str(value)] = [
                self.tok(open + 1)?,
                self.tok(open + 2)?,
                self.tok(open + 3)?,
            ] {
                if key == "path" && open + 4 == j - 1 {
                    return Some(value.clone());
                }
            }
            j = open.checked_sub(1)?;
        }
        None
    }

    /// Where the visibility in front of the keyword at `at` starts (`at` when there is none).
    fn visibility_start(&self, at: usize) -> usize {
        match at.checked_sub(1).and_then(|p| self.tok(p)) {
            Some(Tok::Ident(w)) if w == "pub" => at - 1,
            Some(Tok::Punct(')')) => {
                let open = (0..at - 1)
                    .rev()
                    .find(|&k| self.tok(k) == Some(&Tok::Punct('(')));
                match open.and_then(|o| o.checked_sub(1)) {
                    Some(p) if self.ident(p) == Some("pub") => p,
                    _ => at,
                }
            }
            _ => at,
        }
    }

    /// `use …;`: one binding and one reference per leaf.
    fn use_decl(&mut self, krate: &mut Crate) {
        let public = self.visibility_start(self.at) < self.at;
        let start = self.at + 1;
        let end = (start..self.toks.len())
            .find(|&k| self.tok(k) == Some(&Tok::Punct(';')))
            .unwrap_or(self.toks.len());
        let mut leaves = Vec::new();
        use_tree(&self.toks[start..end], &mut 0, Vec::new(), &mut leaves);
        let scope = self.scope().module;
        for leaf in leaves {
            if leaf.glob || leaf.name.is_some() {
                let binding = Binding {
                    name: leaf.name,
                    target: leaf.segs.clone(),
                };
                krate.modules[scope].uses.push(binding);
            }
            krate.refs.push(PathRef {
                file: self.file.clone(),
                scope,
                segs: leaf.segs,
                line: leaf.line,
                public_use: public,
                in_macro: self.macro_outside.is_some(),
                glob: leaf.glob,
                name: false,
            });
        }
        self.at = end + 1;
    }

    /// `macro_rules! name { … }`: the name is an item; the body is read as written by a caller.
    fn macro_decl(&mut self, krate: &mut Crate) {
        self.at += 1;
        if self.tok(self.at) != Some(&Tok::Punct('!')) {
            return;
        }
        if let Some(name) = self.ident(self.at + 1) {
            let scope = self.scope().module;
            krate.modules[scope].items.insert(name.to_string());
            self.next_macro = self.tok(self.at + 2) == Some(&Tok::Punct('{'));
            self.at += 2;
        }
    }

    /// An item keyword: at the module's own depth, the next name is one of its items.
    fn item(&mut self, krate: &mut Crate) {
        self.at += 1;
        if self.depth != self.scope().depth {
            return;
        }
        let name = match self.ident(self.at) {
            Some("mut") => self.ident(self.at + 1),
            Some("fn" | "unsafe" | "async" | "extern") => None,
            name => name,
        };
        if let Some(name) = name {
            let scope = self.scope().module;
            krate.modules[scope].items.insert(name.to_string());
        }
    }

    /// A path starting here (`a::b`, `crate::a`, `$crate::a`), or a plain name.
    fn path(&mut self, krate: &mut Crate) {
        let start = self.at;
        let mut segs = Vec::new();
        let mut k = start;
        if self.tok(k) == Some(&Tok::Punct('$')) {
            if self.ident(k + 1) != Some("crate") {
                self.at += 1;
                return;
            }
            segs.push("$crate".to_string());
            k += 2;
        } else if let Some(first) = self.ident(k) {
            segs.push(first.to_string());
            k += 1;
        }
        while self.tok(k) == Some(&Tok::PathSep) {
            let Some(seg) = self.ident(k + 1) else { break };
            segs.push(seg.to_string());
            k += 2;
        }
        self.at = k.max(start + 1);
        let before = start.checked_sub(1).and_then(|b| self.tok(b));
        let after_dot_or_sep = matches!(before, Some(Tok::PathSep | Tok::Punct('.')));
        let keyword = matches!(segs.as_slice(), [one] if KEYWORDS.contains(&one.as_str()));
        if segs.is_empty() || after_dot_or_sep || segs[0] == "Self" || keyword {
            return;
        }
        if self.restricts_visibility(start) {
            return;
        }
        let segs_len = segs.len();
        krate.refs.push(PathRef {
            file: self.file.clone(),
            scope: self.scope().module,
            segs,
            line: self.toks[start].line,
            public_use: false,
            in_macro: self.macro_outside.is_some(),
            glob: false,
            name: segs_len == 1,
        });
    }

    /// The path at `at` is the module of a `pub(in path)`.
    fn restricts_visibility(&self, at: usize) -> bool {
        at >= 3
            && self.ident(at - 1) == Some("in")
            && self.tok(at - 2) == Some(&Tok::Punct('('))
            && self.ident(at - 3) == Some("pub")
    }
}

fn add_module(krate: &mut Crate, parent: usize, name: &str, file: &str) -> usize {
    let id = krate.modules.len();
    let mut path = krate.modules[parent].path.clone();
    path.push(name.to_string());
    krate.modules.push(Module {
        path,
        file: file.to_string(),
        parent: Some(parent),
        children: BTreeMap::new(),
        items: BTreeSet::new(),
        uses: Vec::new(),
    });
    krate.modules[parent].children.insert(name.to_string(), id);
    id
}

/// One leaf of a `use` tree.
struct Leaf {
    segs: Vec<String>,
    /// The name bound: the last segment, the `as` name, `None` for `as _` or a glob.
    name: Option<String>,
    glob: bool,
    line: usize,
}

/// Reads one `use` tree from `toks[*i..]`, below `prefix`.
fn use_tree(toks: &[Token], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Leaf>) {
    let mut segs = prefix;
    while let Some(t) = toks.get(*i) {
        let line = t.line;
        match &t.tok {
            Tok::PathSep => {
                if segs.is_empty() {
                    segs.push("::".to_string()); // `::name`: another crate
                }
                *i += 1;
            }
            Tok::Punct('$') => *i += 1,
            Tok::Ident(s) => {
                let dollar = *i > 0 && toks[*i - 1].tok == Tok::Punct('$');
                segs.push(if dollar { format!("${s}") } else { s.clone() });
                *i += 1;
                if toks.get(*i).map(|t| &t.tok) != Some(&Tok::PathSep) {
                    return out.push(leaf_end(toks, i, segs, line));
                }
            }
            Tok::Punct('*') => {
                *i += 1;
                return out.push(Leaf {
                    segs,
                    name: None,
                    glob: true,
                    line,
                });
            }
            Tok::Punct('{') => {
                *i += 1;
                while let Some(t) = toks.get(*i) {
                    match t.tok {
                        Tok::Punct('}') => {
                            *i += 1;
                            return;
                        }
                        Tok::Punct(',') => *i += 1,
                        _ => use_tree(toks, i, segs.clone(), out),
                    }
                }
                return;
            }
            _ => {
                *i += 1;
                return;
            }
        }
    }
}

/// The end of a leaf: `self` refers to the prefix; `as name` renames.
fn leaf_end(toks: &[Token], i: &mut usize, mut segs: Vec<String>, line: usize) -> Leaf {
    if segs.last().is_some_and(|s| s == "self") && segs.len() > 1 {
        segs.pop();
    }
    let mut name = segs.last().cloned();
    if matches!(toks.get(*i).map(|t| &t.tok), Some(Tok::Ident(w)) if w == "as") {
        name = match toks.get(*i + 1).map(|t| &t.tok) {
            Some(Tok::Ident(n)) if n != "_" => Some(n.clone()),
            _ => None,
        };
        *i += 2;
    }
    Leaf {
        segs,
        name,
        glob: false,
        line,
    }
}

/// `(folder, stem)` of `a/b/c.rs`: `("a/b", "c")`.
fn split_file(file: &str) -> (&str, &str) {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    (dir, name.strip_suffix(".rs").unwrap_or(name))
}

/// `a/./b/../c` as `a/c`.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}
