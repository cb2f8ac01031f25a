//! The crate's layers, checked: every module imports only from the layers below its own (and
//! from modules of its own layer without a cycle), the two planes never import each other, and
//! `runtime` is imported by `main.rs` alone. `ARCHITECTURE.md` explains the layers; this test
//! reads every `crate::` path in `src/` (comments aside) and fails on the first one against
//! that order, naming the file, the line and the rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first. A module may import from a lower layer; within its own layer only
/// where the layer allows it (see `same_layer_allowed`).
const LAYERS: &[(&str, &[&str])] = &[
    ("leaves", &["limits", "ids", "error", "copy"]),
    (
        "domain",
        &[
            "config",
            "request",
            "index",
            "kv_events",
            "policy",
            "tokenize",
            "workers",
            "metrics",
            "mesh",
        ],
    ),
    ("shared", &["shared"]),
    ("net", &["net"]),
    ("planes", &["http", "control"]),
    ("program", &["runtime"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// Leaves import nothing of the crate; the two planes never import each other; the domain's
/// modules may import each other as long as no cycle forms (checked apart).
fn same_layer_allowed(layer: usize) -> bool {
    LAYERS[layer].0 == "domain"
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file under `src/` belongs to (`None` for `lib.rs` and `main.rs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// `(line number, module)` of every `crate::module` path in `text`, comments left out.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((number + 1, name));
            }
            rest = after;
        }
    }
    found
}

/// The crate's imports: `(importing module, imported module) -> first place seen`.
fn imports() -> BTreeMap<(String, String), String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(
        files.len() > 20,
        "found only {} files under src/",
        files.len()
    );
    let mut edges = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{e}"));
        let shown = file
            .strip_prefix(&src)
            .unwrap_or(&file)
            .display()
            .to_string();
        let from = module_of(&src, &file);
        for (line, to) in crate_paths(&text) {
            let from = from.clone().unwrap_or_else(|| shown.clone());
            if from != to {
                edges
                    .entry((from, to))
                    .or_insert_with(|| format!("src/{shown}:{line}"));
            }
        }
    }
    edges
}

#[test]
fn every_module_is_in_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
    for module in &modules {
        assert!(
            layer_of(module).is_some(),
            "src/{module} is in no layer: add it to LAYERS here and to ARCHITECTURE.md"
        );
    }
}

#[test]
fn modules_import_only_from_the_layers_below() {
    for ((from, to), place) in imports() {
        let Some(to_layer) = layer_of(&to) else {
            continue;
        };
        if from.ends_with(".rs") {
            // lib.rs declares the modules; main.rs is the program and may use any of them.
            continue;
        }
        let from_layer = layer_of(&from).unwrap_or_else(|| panic!("{from} is in no layer"));
        let (from_name, to_name) = (LAYERS[from_layer].0, LAYERS[to_layer].0);
        assert!(
            to_layer < from_layer || (to_layer == from_layer && same_layer_allowed(to_layer)),
            "{place}: `{from}` ({from_name}) imports `{to}` ({to_name}); a module may only import \
             from the layers below its own (see ARCHITECTURE.md)"
        );
    }
}

#[test]
fn only_main_starts_the_program() {
    for ((from, to), place) in imports() {
        assert!(
            to != "runtime" || from == "main.rs" || from == "lib.rs",
            "{place}: `{from}` imports `runtime`, which main.rs alone may use"
        );
    }
}

#[test]
fn the_domain_modules_import_each_other_without_a_cycle() {
    let domain = layer_of("policy").expect("policy is in the domain");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((from, to), _) in imports() {
        if layer_of(&from) == Some(domain) && layer_of(&to) == Some(domain) {
            graph.entry(from).or_default().insert(to);
        }
    }
    // Depth-first search from every module; a module met again on the current path closes a cycle.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(at) = path.iter().position(|n| n == node) {
            panic!(
                "import cycle among domain modules: {} -> {node}",
                path[at..].join(" -> ")
            );
        }
        if done.contains(node) {
            return;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, path, done);
        }
        path.pop();
        done.insert(node.to_string());
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_checker_sees_paths_and_skips_comments() {
    let text = "use crate::policy::Router;\n// crate::runtime in a comment\nlet x = crate::limits::A; // crate::http\n";
    let paths: Vec<(usize, String)> = crate_paths(text);
    assert_eq!(
        paths,
        [(1, "policy".to_string()), (3, "limits".to_string())]
    );
}
