//! The module graph of `src/` runs one way: no top-level module imports, directly or
//! through others, a module that imports it back (ARCHITECTURE.md). Read from the
//! sources, so a new cycle fails here rather than in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its non-test code names as `crate::X`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
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
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_str()
                .unwrap();
            let module = first.trim_end_matches(".rs").to_owned();
            if module == "lib" || module == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests may reach anywhere; the graph is about the shipped code.
            let code = text.split("#[cfg(test)]").next().unwrap();
            let deps = graph.entry(module.clone()).or_default();
            for part in code.split("crate::").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
        }
    }
    graph
}

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
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

#[test]
fn src_modules_import_one_way() {
    let graph = imports();
    assert!(graph.len() > 10, "modules found: {:?}", graph.keys());
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle among src/ modules: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut graph = imports();
    // probe -> stalls exists; add the edge back.
    assert!(graph["probe"].contains("stalls"));
    graph.get_mut("stalls").unwrap().insert("probe".into());
    let cycle = find_cycle(&graph).expect("a cycle");
    assert!(cycle.contains(&"probe".to_string()) && cycle.contains(&"stalls".to_string()));
}

#[test]
fn leaves_import_nothing_above_them() {
    let graph = imports();
    // Leaves may use each other (the registry writes with family's text primitives,
    // both lock with sync's lock), never a module above them.
    let leaves = ["sync", "config", "mounts", "vm", "family", "metrics"];
    for leaf in leaves {
        let deps = graph.get(leaf).cloned().unwrap_or_default();
        let allowed: BTreeSet<String> = leaves
            .iter()
            .chain(&["kernfs"])
            .map(|s| s.to_string())
            .collect();
        assert!(
            deps.is_subset(&allowed),
            "{leaf} is a leaf but imports {deps:?}"
        );
    }
}
