//! The module graph of `src/` runs one way, at every level: between the top-level
//! modules (the layers of ARCHITECTURE.md, each importing only from the layers below
//! it) and between the files of each folder. Read from the sources, so a new cycle or a
//! layer climbed back up fails here rather than in review.
//!
//! The checker reads `use` declarations, grouped ones included (`use crate::{a, b::{c,
//! d}}`), and paths in code, whether they start at `crate::`, `super::`, `self::` or a
//! child module's name, resolving each relative to the file's own module path and
//! following `pub use` re-exports to the file that defines the item. A folder's own
//! file (`mod.rs`) is a node of its folder's graph, named `mod`. Unit tests
//! (`#[cfg(test)]` items), comments and string literals are left out: the graph is
//! about the shipped code. Standalone: it reads files and imports nothing of the crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first, and the layers below each that it may import from: the
/// table of ARCHITECTURE.md ("Layers"). A top-level module not listed here fails.
const LAYERS: &[(&str, &[&str])] = &[
    ("base", &[]),
    ("kernel", &["base"]),
    ("config", &["base"]),
    ("exposition", &["base"]),
    ("history", &["base", "kernel"]),
    ("stall", &["base", "kernel", "exposition"]),
    (
        "probe",
        &["base", "kernel", "config", "exposition", "history", "stall"],
    ),
    (
        "sampler",
        &["base", "kernel", "exposition", "history", "stall", "probe"],
    ),
    (
        "http",
        &[
            "base",
            "kernel",
            "exposition",
            "history",
            "stall",
            "probe",
            "sampler",
        ],
    ),
    (
        "agent",
        &[
            "base",
            "kernel",
            "config",
            "exposition",
            "history",
            "stall",
            "probe",
            "sampler",
            "http",
        ],
    ),
    ("cli", &["base", "config", "probe"]),
];

/// A module's path from the crate root: `["probe", "watchdog"]`; the root is `[]`.
type ModPath = Vec<String>;

/// One folder's graph: node → the nodes it imports from.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The modules of the tree under `src` (one per file; `main.rs` is the binary and is
/// left out) and their shipped code: comments, strings and test items removed.
fn modules(src: &Path) -> BTreeMap<ModPath, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let mut segs: ModPath = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_str().unwrap().to_owned())
                .collect();
            match segs.last().map(String::as_str) {
                Some("main") if segs.len() == 1 => continue,
                Some("lib") if segs.len() == 1 => segs.clear(),
                Some("mod") => {
                    segs.pop();
                }
                _ => {}
            }
            let text = std::fs::read_to_string(&path).unwrap();
            out.insert(segs, shipped_code(&text));
        }
    }
    out
}

/// `text` without comments, with every string and char literal emptied, and without
/// the items under `#[cfg(test)]` and the paths of `pub(in …)`.
fn shipped_code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if let Some(hashes) = raw_string_start(rest).filter(|_| !after_ident(&out)) {
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += body
                + rest[body..]
                    .find(&close)
                    .map_or(rest.len(), |e| e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'); otherwise a lifetime ('a), kept.
            let mut body = rest[1..].chars();
            let len = match body.next() {
                Some('\\') => rest.get(3..).and_then(|r| r.find('\'')).map(|e| e + 4),
                Some(c) if body.next() == Some('\'') => Some(c.len_utf8() + 2),
                _ => None,
            };
            match len {
                Some(n) => {
                    i += n;
                    out.push_str("' '");
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    let mut code = remove_test_items(&out);
    while let Some(s) = code.find("pub(in ") {
        let e = s + code[s..].find(')').unwrap() + 1;
        code.replace_range(s..e, "pub");
    }
    code
}

fn after_ident(out: &str) -> bool {
    out.ends_with(|c: char| c.is_alphanumeric() || c == '_')
}

/// `r"`, `r#"`, `br"`…: the number of `#`, None when `s` does not start a raw string.
fn raw_string_start(s: &str) -> Option<usize> {
    let s = s.strip_prefix('b').unwrap_or(s);
    let s = s.strip_prefix('r')?;
    let hashes = s.len() - s.trim_start_matches('#').len();
    s[hashes..].starts_with('"').then_some(hashes)
}

/// Removes each item marked `#[cfg(test)]`: through the end of its `{ … }` block, or
/// through its `;` when that comes first.
fn remove_test_items(code: &str) -> String {
    let mut code = code.to_owned();
    while let Some(s) = code.find("#[cfg(test)]") {
        let after = s + "#[cfg(test)]".len();
        let semi = code[after..].find(';').map(|e| after + e);
        let open = code[after..].find('{').map(|e| after + e);
        let end = match (open, semi) {
            (Some(o), Some(sc)) if sc < o => sc + 1,
            (Some(o), _) => {
                let mut depth = 0;
                let mut end = code.len();
                for (k, c) in code[o..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(sc)) => sc + 1,
            (None, None) => code.len(),
        };
        code.replace_range(s..end, "");
    }
    code
}

/// A path as written in `module`'s code: its segments, and whether it is a `pub use`.
#[derive(Debug)]
struct Written {
    /// The inline modules (`mod defaults { … }`) it is written in, outermost first.
    inner: Vec<String>,
    segs: Vec<String>,
    /// The name a `pub use` gives it in `module` (its last segment or its alias).
    reexport_as: Option<String>,
    /// The name any `use` gives it in `module`; None for a path written in code.
    imported_as: Option<String>,
}

/// The paths `code` names: every path of every `use` declaration (groups expanded)
/// and every other path of two segments or more.
fn written_paths(code: &str) -> Vec<Written> {
    let tokens = tokenize(code);
    let mut out = Vec::new();
    // The inline modules open at this point, each with the brace depth it opened at.
    let mut inner: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].as_str() {
            "{" => {
                if i >= 2 && tokens[i - 2] == "mod" {
                    inner.push((tokens[i - 1].clone(), depth));
                }
                depth += 1;
            }
            "}" => {
                depth -= 1;
                if inner.last().is_some_and(|m| m.1 == depth) {
                    inner.pop();
                }
            }
            _ => {}
        }
        let nesting = || inner.iter().map(|m| m.0.clone()).collect::<Vec<_>>();
        if tokens[i] == "use" {
            let public = i > 0 && (tokens[i - 1] == "pub" || tokens[i - 1] == ")");
            let end = (i..tokens.len())
                .find(|&k| tokens[k] == ";")
                .unwrap_or(tokens.len());
            let mut leaves = Vec::new();
            expand(&tokens[i + 1..end], Vec::new(), &mut leaves);
            for (segs, alias) in leaves {
                let name = alias.or_else(|| segs.last().cloned());
                out.push(Written {
                    inner: nesting(),
                    reexport_as: if public { name.clone() } else { None },
                    imported_as: name,
                    segs,
                });
            }
            i = end + 1;
            continue;
        }
        let starts = is_ident(&tokens[i])
            && (i == 0 || tokens[i - 1] != "::")
            && tokens.get(i + 1).is_some_and(|t| t == "::");
        if starts {
            let mut segs = vec![tokens[i].clone()];
            let mut k = i + 1;
            while k + 1 < tokens.len() && tokens[k] == "::" && is_ident(&tokens[k + 1]) {
                segs.push(tokens[k + 1].clone());
                k += 2;
            }
            out.push(Written {
                inner: nesting(),
                segs,
                reexport_as: None,
                imported_as: None,
            });
            i = k;
            continue;
        }
        i += 1;
    }
    out
}

/// Identifiers, `::`, and every other character as a token of its own.
fn tokenize(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((s, c)) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut e = s + c.len_utf8();
            while let Some(&(k, d)) = chars.peek() {
                if !(d.is_alphanumeric() || d == '_') {
                    break;
                }
                e = k + d.len_utf8();
                chars.next();
            }
            out.push(code[s..e].to_owned());
        } else if c == ':' && chars.peek().is_some_and(|&(_, d)| d == ':') {
            chars.next();
            out.push("::".into());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// Expands a use tree (`a::b::{c, d::{e as f, self}}`) under `prefix` into its leaves
/// and their aliases.
fn expand(tokens: &[String], prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut segs = prefix;
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        match t {
            "::" => i += 1,
            "{" => {
                // The group's items, split at top-level commas.
                let mut depth = 0;
                let mut start = i + 1;
                for k in i..tokens.len() {
                    match tokens[k].as_str() {
                        "{" => depth += 1,
                        "}" => {
                            depth -= 1;
                            if depth == 0 {
                                expand(&tokens[start..k], segs.clone(), out);
                                return;
                            }
                        }
                        "," if depth == 1 => {
                            expand(&tokens[start..k], segs.clone(), out);
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            "as" => {
                let alias = tokens.get(i + 1).cloned().filter(|a| a != "_");
                out.push((segs, alias));
                return;
            }
            "*" => {
                out.push((segs, None));
                return;
            }
            "self" if !segs.is_empty() => {
                // `a::{self}` names `a`.
                i += 1;
            }
            _ => {
                segs.push(t.to_owned());
                i += 1;
            }
        }
    }
    if !segs.is_empty() {
        out.push((segs, None));
    }
}

/// The absolute path `w` names from `module`, None when it is outside the crate
/// (another crate, a local item, an enum's variants).
fn absolute(
    module: &ModPath,
    segs: &[String],
    mods: &BTreeMap<ModPath, String>,
) -> Option<Vec<String>> {
    let (mut base, mut rest): (Vec<String>, &[String]) = match segs[0].as_str() {
        "crate" => (Vec::new(), &segs[1..]),
        "self" => (module.clone(), &segs[1..]),
        "super" => (module.clone(), segs),
        first => {
            let mut child = module.clone();
            child.push(first.to_owned());
            if !mods.contains_key(&child) {
                return None;
            }
            (module.clone(), segs)
        }
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The module that defines what `path` names: its longest prefix that is a module,
/// through that module's `pub use` re-exports of the next segment.
fn defining_module(
    path: &[String],
    mods: &BTreeMap<ModPath, String>,
    reexports: &BTreeMap<(ModPath, String), Vec<String>>,
    depth: usize,
) -> ModPath {
    let n = (0..=path.len())
        .rev()
        .find(|&n| mods.contains_key(&path[..n].to_vec()))
        .unwrap_or(0);
    let module = path[..n].to_vec();
    if depth < 8 {
        if let Some(name) = path.get(n) {
            if let Some(target) = reexports.get(&(module.clone(), name.clone())) {
                let mut next = target.clone();
                next.extend(path[n + 1..].iter().cloned());
                return defining_module(&next, mods, reexports, depth + 1);
            }
        }
    }
    module
}

/// Every folder's graph, keyed by the folder's module path (`[]`: the top level).
fn graphs(src: &Path) -> BTreeMap<ModPath, Graph> {
    let mods = modules(src);
    let mut reexports = BTreeMap::new();
    let mut named = Vec::new();
    for (module, code) in &mods {
        let written = written_paths(code);
        // What each `use` brings into scope by name: a path written in code whose head is
        // such a name (`use crate::http::server as web; web::tls::X`) is that path.
        let mut in_scope: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
        for w in &written {
            let mut within = module.clone();
            within.extend(w.inner.iter().cloned());
            if let (Some(name), Some(abs)) = (&w.imported_as, absolute(&within, &w.segs, &mods)) {
                in_scope.insert((w.inner.clone(), name.clone()), abs);
            }
        }
        for w in written {
            let mut within = module.clone();
            within.extend(w.inner.iter().cloned());
            let through_use = w
                .imported_as
                .is_none()
                .then(|| in_scope.get(&(w.inner.clone(), w.segs[0].clone())))
                .flatten();
            let abs = match through_use {
                Some(head) => {
                    let mut abs = head.clone();
                    abs.extend(w.segs[1..].iter().cloned());
                    abs
                }
                None => match absolute(&within, &w.segs, &mods) {
                    Some(abs) => abs,
                    None => continue,
                },
            };
            if let Some(name) = &w.reexport_as {
                reexports.insert((module.clone(), name.clone()), abs.clone());
            }
            named.push((module.clone(), abs));
        }
    }
    let mut out: BTreeMap<ModPath, Graph> = BTreeMap::new();
    for module in mods.keys().filter(|m| m.len() > 1) {
        let folder = module[..module.len() - 1].to_vec();
        out.entry(folder).or_default();
    }
    for module in mods.keys() {
        if !module.is_empty() {
            let folder = module[..module.len() - 1].to_vec();
            out.entry(folder)
                .or_default()
                .entry(module.last().unwrap().clone())
                .or_default();
        }
    }
    for (from, path) in named {
        let to = defining_module(&path, &mods, &reexports, 0);
        let k = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if from.len() == to.len() && k == from.len() {
            continue;
        }
        let node = |m: &ModPath| m.get(k).cloned().unwrap_or_else(|| "mod".into());
        // Edges from the crate root (lib.rs) are its `mod` declarations, not imports.
        if from.is_empty() {
            continue;
        }
        out.entry(from[..k].to_vec())
            .or_default()
            .entry(node(&from))
            .or_default()
            .insert(node(&to));
    }
    out
}

fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The cycles of every folder, as `folder: a -> b -> a`.
fn cycles(graphs: &BTreeMap<ModPath, Graph>) -> Vec<String> {
    graphs
        .iter()
        .filter_map(|(folder, g)| {
            let name = if folder.is_empty() {
                "src".to_owned()
            } else {
                format!("src/{}", folder.join("/"))
            };
            find_cycle(g).map(|c| format!("{name}: {}", c.join(" -> ")))
        })
        .collect()
}

fn real_graphs() -> BTreeMap<ModPath, Graph> {
    graphs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn no_import_cycle_at_any_level() {
    let g = real_graphs();
    let top = &g[&Vec::new()];
    assert!(top.len() >= 8, "top-level modules found: {:?}", top.keys());
    assert!(g.len() > 8, "folders found: {:?}", g.keys());
    for (folder, graph) in &g {
        eprintln!("src/{}:", folder.join("/"));
        for (node, deps) in graph {
            eprintln!("  {node} -> {deps:?}");
        }
    }
    // The checker sees imports of each kind: `crate::` (probe -> stall), `super::`
    // (accept -> limits), a folder's re-export (agent's `probe::ProbeMetrics` is
    // probe/metrics.rs).
    assert!(top["probe"].contains("stall"), "{top:?}");
    let server = &g[&vec!["http".to_owned(), "server".to_owned()]];
    assert!(server["accept"].contains("limits"), "{server:?}");
    assert!(server["config"].contains("file"), "{server:?}");
    let found = cycles(&g);
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// Each import of `top` (the top-level graph) that `layers` does not allow, and each
/// module in no layer.
fn layer_problems(top: &Graph, layers: &[(&str, &[&str])]) -> Vec<String> {
    let mut problems = Vec::new();
    for (module, deps) in top {
        let Some((_, allowed)) = layers.iter().find(|l| l.0 == module) else {
            problems.push(format!(
                "{module} is in no layer: add it to LAYERS and ARCHITECTURE.md"
            ));
            continue;
        };
        for d in deps {
            if !allowed.contains(&d.as_str()) {
                problems.push(format!("{module} imports {d}"));
            }
        }
    }
    problems
}

#[test]
fn each_layer_imports_only_from_the_layers_below_it() {
    let g = real_graphs();
    let top = &g[&Vec::new()];
    let order: Vec<&str> = LAYERS.iter().map(|l| l.0).collect();
    for (i, (layer, below)) in LAYERS.iter().enumerate() {
        for b in *below {
            let j = order.iter().position(|o| o == b).expect("a listed layer");
            assert!(
                j < i,
                "the table lets {layer} import {b}, which is not below it"
            );
        }
    }
    let problems = layer_problems(top, LAYERS);
    assert!(
        problems.is_empty(),
        "layer order broken:\n{}",
        problems.join("\n")
    );
}

/// Writes `files` (path under src, text) into a fresh directory.
fn planted(files: &[(&str, &str)]) -> (tempfile::TempDir, BTreeMap<ModPath, Graph>) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let g = graphs(dir.path());
    (dir, g)
}

#[test]
fn a_planted_upward_import_is_a_broken_layer() {
    let layers: &[(&str, &[&str])] = &[("low", &[]), ("mid", &["low"]), ("high", &["mid"])];
    let (_dir, g) = planted(&[
        (
            "lib.rs",
            "pub mod high;\npub mod low;\npub mod mid;\npub mod stray;\n",
        ),
        ("high.rs", "use crate::mid::M;\npub struct H(M);\n"),
        // Upward through an alias: the `use` names `high`, and so does the path.
        (
            "low/mod.rs",
            "mod inner;\nuse crate::high as h;\npub fn f() -> h::H { todo!() }\n",
        ),
        // Skipping a layer: high may import mid only.
        ("mid.rs", "pub struct M;\n"),
        (
            "low/inner.rs",
            "pub fn g() -> crate::mid::M { crate::mid::M }\n",
        ),
        ("stray.rs", "pub struct S;\n"),
    ]);
    let problems = layer_problems(&g[&Vec::new()], layers);
    assert_eq!(
        problems,
        [
            "low imports high",
            "low imports mid",
            "stray is in no layer: add it to LAYERS and ARCHITECTURE.md"
        ],
        "{g:?}"
    );
}

#[test]
fn a_path_through_an_alias_is_resolved_to_the_module_it_names() {
    // `web::tls::Pem` is `crate::srv::tls::Pem`: inside `srv`, `accept` imports `tls`.
    let (_dir, g) = planted(&[
        ("lib.rs", "pub mod srv;\n"),
        ("srv/mod.rs", "mod accept;\nmod tls;\n"),
        ("srv/tls.rs", "pub struct Pem;\n"),
        (
            "srv/accept.rs",
            "use crate::srv as web;\nfn f() -> web::tls::Pem { web::tls::Pem }\n",
        ),
    ]);
    let srv = &g[&vec!["srv".to_owned()]];
    assert!(srv["accept"].contains("tls"), "{srv:?}");
}

#[test]
fn a_planted_cycle_through_super_inside_a_folder_is_found() {
    let (_dir, g) = planted(&[
        ("lib.rs", "pub mod a;\n"),
        ("a/mod.rs", "mod x;\nmod y;\npub use x::Thing;\n"),
        ("a/x.rs", "use super::y::Other;\npub struct Thing(Other);\n"),
        // Through the folder's re-export: `super::Thing` is defined in x.
        (
            "a/y.rs",
            "pub struct Other;\nfn f() -> super::Thing { todo!() }\n",
        ),
    ]);
    let found = cycles(&g);
    assert_eq!(found, ["src/a: x -> y -> x"], "{g:?}");
}

#[test]
fn a_planted_cycle_through_a_grouped_crate_import_is_found() {
    let (_dir, g) = planted(&[
        ("lib.rs", "pub mod p;\npub mod q;\npub mod r;\npub mod s;\n"),
        // An inline module's `super` is the file's module.
        ("s.rs", "pub mod inner {\n    use super::*;\n}\n"),
        ("p.rs", "use crate::{q::{self, Q}, r};\npub struct P;\n"),
        ("q.rs", "use crate::{p::P as Other};\npub struct Q;\n"),
        (
            "r.rs",
            "//! crate::p in a comment\n/// use crate::q;\nconst S: &str = \"crate::p::P\";\n\
             #[cfg(test)]\nmod tests {\n    use crate::p;\n    const B: &str = \"}\";\n}\n",
        ),
    ]);
    let top = &g[&Vec::new()];
    assert_eq!(
        top["r"],
        BTreeSet::new(),
        "comments, strings, tests: {top:?}"
    );
    assert_eq!(cycles(&g), ["src: p -> q -> p"], "{g:?}");
}

#[test]
fn a_folder_whose_own_file_and_a_child_use_each_other_is_a_cycle() {
    let (_dir, g) = planted(&[
        ("lib.rs", "pub mod a;\n"),
        (
            "a/mod.rs",
            "mod x;\npub struct Base;\npub fn f() { x::g() }\n",
        ),
        ("a/x.rs", "use self::super::Base;\npub fn g() {}\n"),
    ]);
    assert_eq!(cycles(&g), ["src/a: mod -> x -> mod"], "{g:?}");
}
