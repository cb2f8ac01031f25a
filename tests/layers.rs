//! The crate's layers, checked against `ARCHITECTURE.md`, which states them: every module
//! imports only from the layers below its own; within the domain, only the edges the doc's
//! "Domain edges" table lists (and each of those is still used); the two planes never import
//! each other; `runtime` is imported by `main.rs` alone. The rules are read from the doc's two
//! tables, so the doc and this test cannot disagree, and `src/lib.rs`'s layer comment is held
//! to the same table.
//!
//! An import is any path into the crate that code can name: `use` trees read whole (grouped,
//! nested, `self`, renames, globs), `pub use` re-exports alike, `super::` chains resolved
//! against the file's module path (inline `mod` blocks included), and `crate::` paths anywhere
//! in code. Comments, strings and character literals are blanked before reading, so a path in
//! prose is not an import. A glob of the crate root (`use super::*` from a top-level module)
//! would bring every module into scope unseen, so it fails on its own. A failure names the
//! file, the line and the rule. `the_checker_rejects_each_way_around_it` runs the checker over
//! small fake source trees (`tests/fixtures/layers/`): each way to sneak an import past a
//! line-by-line search must fail, and a tree of legal imports written in all those forms must
//! pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// The rules, as ARCHITECTURE.md states them.
// ---------------------------------------------------------------------------------------------

/// The layers (bottom first) and the allowed domain edges.
#[derive(Debug)]
struct Rules {
    /// `(layer name, its modules)`, bottom first.
    layers: Vec<(String, Vec<String>)>,
    /// Importing domain module → the domain modules it may import, with the doc's reason.
    domain_edges: BTreeMap<String, (BTreeSet<String>, String)>,
}

/// The layer that may import its own modules through the edge table; in every other layer a
/// module imports nothing of its own layer.
const DOMAIN: &str = "domain";

impl Rules {
    fn layer_of(&self, module: &str) -> Option<usize> {
        self.layers
            .iter()
            .position(|(_, modules)| modules.iter().any(|m| m == module))
    }

    fn modules(&self) -> BTreeSet<&str> {
        let all = self.layers.iter().flat_map(|(_, modules)| modules);
        all.map(String::as_str).collect()
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The rules of `ARCHITECTURE.md`.
fn rules() -> Rules {
    let doc = read(&root().join("ARCHITECTURE.md"));
    parse_rules(&doc).unwrap_or_else(|e| panic!("ARCHITECTURE.md: {e}"))
}

/// The names in backticks in `cell`, in order.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The body rows of the Markdown table whose header row starts with `header`, as cells.
fn table_rows(doc: &str, header: &str) -> Result<Vec<Vec<String>>, String> {
    let mut lines = doc.lines().skip_while(|line| !line.starts_with(header));
    lines
        .next()
        .ok_or_else(|| format!("no table with the header `{header}`"))?;
    lines.next(); // the |---| separator
    let rows = lines.take_while(|line| line.starts_with('|'));
    let cells = |line: &str| {
        let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split('|').map(|c| c.trim().to_string()).collect()
    };
    Ok(rows.map(cells).collect())
}

/// Reads the layer table (`| layer | modules | ...`: "N name", then the modules in backticks)
/// and the domain-edge table (`| module | imports from the domain | why |`: one row per domain
/// module, "—" when it imports none).
fn parse_rules(doc: &str) -> Result<Rules, String> {
    let mut layers = Vec::new();
    for (at, row) in table_rows(doc, "| layer | modules |")?.iter().enumerate() {
        let name = row[0].split_whitespace().nth(1).unwrap_or_default();
        let number = row[0].split_whitespace().next().unwrap_or_default();
        if number != (at + 1).to_string() || name.is_empty() {
            return Err(format!("layer row `{}` is not `{} name`", row[0], at + 1));
        }
        let modules = backticked(row.get(1).ok_or("a layer row without modules")?);
        layers.push((name.to_string(), modules));
    }
    let mut domain_edges = BTreeMap::new();
    for row in table_rows(doc, "| module | imports from the domain |")? {
        let names = backticked(&row[0]);
        let [from] = names.as_slice() else {
            return Err(format!("edge row `{}` does not name one module", row[0]));
        };
        let to: BTreeSet<String> = backticked(row.get(1).map_or("", String::as_str))
            .into_iter()
            .collect();
        let why = row.get(2).cloned().unwrap_or_default();
        if domain_edges.insert(from.clone(), (to, why)).is_some() {
            return Err(format!("`{from}` has two rows in the edge table"));
        }
    }
    let rules = Rules {
        layers,
        domain_edges,
    };
    let domain = rules.layers.iter().find(|(name, _)| name == DOMAIN);
    let domain: BTreeSet<&String> = domain.ok_or("no domain layer")?.1.iter().collect();
    let rows: BTreeSet<&String> = rules.domain_edges.keys().collect();
    if rows != domain {
        return Err(format!(
            "the edge table's rows {rows:?} are not the domain's modules {domain:?}"
        ));
    }
    for (from, (to, _)) in &rules.domain_edges {
        if let Some(outside) = to.iter().find(|t| !domain.contains(t)) {
            return Err(format!("`{from}` → `{outside}`: not a domain module"));
        }
    }
    Ok(rules)
}

// ---------------------------------------------------------------------------------------------
// Reading Rust source: code without comments and literals, tokens, and the paths they name.
// ---------------------------------------------------------------------------------------------

/// `text` with comments, string, byte-string, raw-string and character literals replaced by
/// spaces (newlines kept, so line numbers hold).
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, piece: &str| {
        out.extend(piece.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
    };
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let after_ident = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let end = if rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            block_comment_len(rest)
        } else if let Some(len) = (!after_ident).then(|| raw_string_len(rest)).flatten() {
            len
        } else if rest.starts_with('"') || (!after_ident && rest.starts_with("b\"")) {
            string_len(rest)
        } else if let Some(len) = char_literal_len(rest) {
            len
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
            continue;
        };
        blank(&mut out, &rest[..end]);
        i += end;
    }
    out
}

/// The length of the (nested) block comment `rest` starts with.
fn block_comment_len(rest: &str) -> usize {
    let (mut depth, mut at) = (0usize, 0);
    while at < rest.len() {
        if rest[at..].starts_with("/*") {
            depth += 1;
            at += 2;
        } else if rest[at..].starts_with("*/") {
            depth -= 1;
            at += 2;
            if depth == 0 {
                return at;
            }
        } else {
            at += rest[at..].chars().next().map_or(1, char::len_utf8);
        }
    }
    rest.len()
}

/// The length of the raw string (`r"..."`, `r#"..."#`, `br#"..."#`) `rest` starts with.
fn raw_string_len(rest: &str) -> Option<usize> {
    let after_b = rest.strip_prefix('b').unwrap_or(rest);
    let after_r = after_b.strip_prefix('r')?;
    let hashes = after_r.len() - after_r.trim_start_matches('#').len();
    let body = after_r[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let opened = rest.len() - body.len();
    Some(
        body.find(&close)
            .map_or(rest.len(), |at| opened + at + close.len()),
    )
}

/// The length of the (byte) string literal `rest` starts with, escapes included.
fn string_len(rest: &str) -> usize {
    let open = rest.find('"').map_or(0, |at| at + 1);
    let bytes = rest.as_bytes();
    let mut at = open;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 2,
            b'"' => return at + 1,
            _ => at += 1,
        }
    }
    rest.len()
}

/// The length of the character literal `rest` starts with (`'a'`, `'\n'`, `'\u{1F600}'`,
/// `b'x'`); `None` for a lifetime or a label.
fn char_literal_len(rest: &str) -> Option<usize> {
    let quoted = rest
        .strip_prefix("b'")
        .or_else(|| rest.strip_prefix('\''))?;
    let prefix = rest.len() - quoted.len();
    let body_len = if quoted.starts_with('\\') {
        quoted.find('\'')?.max(2)
    } else {
        quoted.chars().next()?.len_utf8()
    };
    (quoted[body_len..].starts_with('\'')).then_some(prefix + body_len + 1)
}

/// One token of code: what a path is made of, and the punctuation that ends one.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

/// The tokens of `code` (already free of comments and literals), each with its line number.
fn tokens(code: &str) -> Vec<(usize, Token)> {
    let mut out = Vec::new();
    for (number, line) in code.lines().enumerate() {
        let mut chars = line.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            let token = match c {
                c if c.is_alphanumeric() || c == '_' => {
                    let mut end = at + c.len_utf8();
                    while let Some(&(next, n)) = chars.peek() {
                        if !(n.is_alphanumeric() || n == '_') {
                            break;
                        }
                        end = next + n.len_utf8();
                        chars.next();
                    }
                    let word = &line[at..end];
                    // A raw identifier (`r#name`) names the same thing as the plain one: the
                    // next turn reads `name`.
                    if word == "r" && chars.peek().map(|&(_, n)| n) == Some('#') {
                        chars.next();
                        continue;
                    }
                    Token::Ident(word.to_string())
                }
                ':' if chars.peek().map(|&(_, n)| n) == Some(':') => {
                    chars.next();
                    Token::PathSep
                }
                '{' => Token::Open,
                '}' => Token::Close,
                ',' => Token::Comma,
                ';' => Token::Semi,
                '*' => Token::Star,
                c if c.is_whitespace() => continue,
                _ => Token::Other,
            };
            out.push((number + 1, token));
        }
    }
    out
}

/// A path the code names, resolved from the crate root: its segments (empty: the root
/// itself), whether it ends in a glob, and the line it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CratePath {
    segments: Vec<String>,
    glob: bool,
    line: usize,
}

/// A path as written: `crate`, `super`, `self` or a plain name first.
struct Written {
    segments: Vec<String>,
    glob: bool,
    line: usize,
}

/// Resolves `written` against the module `module` (segments from the crate root); `None` for
/// a path that does not start at `crate`, `super` or `self` (an extern crate, or a name in
/// scope, whose own import is read where it is made), or one that climbs above the root.
fn resolve(module: &[String], written: &Written) -> Option<CratePath> {
    let mut segments = written.segments.iter().map(String::as_str).peekable();
    let mut base: Vec<String> = match segments.peek().copied() {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("super") | Some("self") => module.to_vec(),
        _ => return None,
    };
    while let Some(&first) = segments.peek() {
        match first {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        segments.next();
    }
    // `a::b::self` (from `a::b::{self, ...}`) names `a::b`.
    base.extend(segments.filter(|s| *s != "self").map(str::to_string));
    Some(CratePath {
        segments: base,
        glob: written.glob,
        line: written.line,
    })
}

/// Reads one use tree starting at `tokens[*at]` under `prefix`, pushing every path it names
/// to `out`; stops before the `,`, `}` or `;` that ends it.
fn use_tree(tokens: &[(usize, Token)], at: &mut usize, prefix: &[String], out: &mut Vec<Written>) {
    let mut path = prefix.to_vec();
    let mut line = tokens.get(*at).map_or(0, |t| t.0);
    while let Some((l, token)) = tokens.get(*at) {
        line = *l;
        match token {
            Token::Ident(word) if word == "as" => {
                // A rename: the path is what it was before it; the new name is skipped.
                *at += 2;
                break;
            }
            Token::Ident(word) => {
                path.push(word.clone());
                *at += 1;
            }
            Token::PathSep => *at += 1,
            Token::Star => {
                *at += 1;
                out.push(Written {
                    segments: path,
                    glob: true,
                    line,
                });
                return;
            }
            Token::Open => {
                *at += 1;
                loop {
                    use_tree(tokens, at, &path, out);
                    match tokens.get(*at).map(|t| &t.1) {
                        Some(Token::Comma) => *at += 1,
                        Some(Token::Close) => {
                            *at += 1;
                            return;
                        }
                        _ => return,
                    }
                    if tokens.get(*at).map(|t| &t.1) == Some(&Token::Close) {
                        *at += 1;
                        return;
                    }
                }
            }
            _ => break,
        }
    }
    if path.len() > prefix.len() {
        out.push(Written {
            segments: path,
            glob: false,
            line,
        });
    }
}

/// `crate_paths`' reading of a path in code (not a `use`) from its first segment at
/// `tokens[*at]`: the segments as long as `::` and a name follow; `*at` ends after them.
fn code_path(tokens: &[(usize, Token)], at: &mut usize) -> Written {
    let line = tokens[*at].0;
    let mut segments = Vec::new();
    if let Token::Ident(first) = &tokens[*at].1 {
        segments.push(first.clone());
    }
    *at += 1;
    while let (Some(Token::PathSep), Some(Token::Ident(next))) = (
        tokens.get(*at).map(|t| &t.1),
        tokens.get(*at + 1).map(|t| &t.1),
    ) {
        segments.push(next.clone());
        *at += 2;
    }
    Written {
        segments,
        glob: false,
        line,
    }
}

/// Every path into the crate that `text` (a file of module `module`) names, resolved.
fn crate_paths(module: &[String], text: &str) -> Vec<CratePath> {
    let tokens = tokens(&code_only(text));
    let mut written = Vec::new();
    // Inline `mod name { ... }` blocks: (name, the brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut at = 0;
    let here = |inline: &[(String, usize)]| {
        let mut path = module.to_vec();
        path.extend(inline.iter().map(|(name, _)| name.clone()));
        path
    };
    while at < tokens.len() {
        let before = at.checked_sub(1).map(|b| &tokens[b].1);
        match &tokens[at].1 {
            Token::Open => depth += 1,
            Token::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            Token::Ident(word) if word == "mod" => {
                let name = tokens.get(at + 1).and_then(|t| match &t.1 {
                    Token::Ident(name) => Some(name.clone()),
                    _ => None,
                });
                if let (Some(name), Some(Token::Open)) = (name, tokens.get(at + 2).map(|t| &t.1)) {
                    depth += 1;
                    inline.push((name, depth));
                    at += 3;
                    continue;
                }
            }
            Token::Ident(word) if word == "use" && before != Some(&Token::PathSep) => {
                let mut found = Vec::new();
                at += 1;
                use_tree(&tokens, &mut at, &[], &mut found);
                let module = here(&inline);
                written.extend(found.into_iter().map(|w| (module.clone(), w)));
                continue;
            }
            Token::Ident(word)
                if matches!(word.as_str(), "crate" | "super" | "self")
                    && before != Some(&Token::PathSep)
                    && tokens.get(at + 1).map(|t| &t.1) == Some(&Token::PathSep) =>
            {
                written.push((here(&inline), code_path(&tokens, &mut at)));
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    let resolved = written.iter().filter_map(|(m, w)| resolve(m, w));
    resolved.collect()
}

// ---------------------------------------------------------------------------------------------
// The crate's import graph, and what is wrong with it.
// ---------------------------------------------------------------------------------------------

/// One module importing another (top-level modules), first seen in a file at `place`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
    place: String,
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module path of a file under `src` (`http/admin.rs` → `http::admin`, `http/mod.rs` →
/// `http`, `lib.rs` and `main.rs` → the root).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut path: Vec<String> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

/// What the files under `src` import of the top-level modules (theirs, and `known`: the
/// crate's, for a fixture that holds only the importing side), and the places where a glob of
/// the crate root brings them all into scope unseen. `lib.rs` declares the modules and
/// `main.rs` is the program (it may use any of them): both are left out.
fn imports(src: &Path, known: &BTreeSet<&str>) -> (Vec<Edge>, Vec<String>) {
    let files = rust_files(src);
    let mut top: BTreeSet<String> = known.iter().map(|m| m.to_string()).collect();
    top.extend(
        files
            .iter()
            .filter_map(|f| module_path(src, f).first().cloned()),
    );
    // One edge per file and imported module, at its first line in that file.
    let mut edges: BTreeMap<(String, String, &Path), String> = BTreeMap::new();
    let mut root_globs = Vec::new();
    for file in &files {
        let module = module_path(src, file);
        let Some(from) = module.first() else {
            continue;
        };
        let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
        for path in crate_paths(&module, &read(file)) {
            let place = format!("{shown}:{}", path.line);
            match path.segments.first() {
                None if path.glob => root_globs.push(place),
                Some(to) if to != from && top.contains(to) => {
                    let key = (from.clone(), to.clone(), file.as_path());
                    edges.entry(key).or_insert(place);
                }
                _ => {}
            }
        }
    }
    let edges = edges
        .into_iter()
        .map(|((from, to, _), place)| Edge { from, to, place });
    (edges.collect(), root_globs)
}

/// A forbidden import: what it is (`from → to`, or "root glob") and its message.
type Violation = (String, String);

/// Every import of `edges` that `rules` forbid, and every root glob.
fn violations(rules: &Rules, edges: &[Edge], root_globs: &[String]) -> Vec<Violation> {
    let mut found: Vec<Violation> = root_globs
        .iter()
        .map(|place| {
            let message = format!(
                "{place}: a glob of the crate root brings every module into scope unseen; \
                 import what is used by its path"
            );
            ("root glob".to_string(), message)
        })
        .collect();
    for edge in edges {
        if let Some(message) = edge_violation(rules, edge) {
            found.push((format!("{} → {}", edge.from, edge.to), message));
        }
    }
    found
}

/// Why `rules` forbid `edge`, if they do.
fn edge_violation(rules: &Rules, Edge { from, to, place }: &Edge) -> Option<String> {
    let (Some(from_layer), Some(to_layer)) = (rules.layer_of(from), rules.layer_of(to)) else {
        return Some(format!(
            "{place}: `{from}` imports `{to}`, and one of them is in no layer of ARCHITECTURE.md"
        ));
    };
    let (from_name, to_name) = (&rules.layers[from_layer].0, &rules.layers[to_layer].0);
    if to_layer < from_layer {
        return None;
    }
    if to_layer > from_layer {
        return Some(format!(
            "{place}: `{from}` ({from_name}) imports `{to}` ({to_name}), a layer above its own"
        ));
    }
    if from_name != DOMAIN {
        return Some(format!(
            "{place}: `{from}` imports `{to}`, both in the {from_name} layer, whose modules \
             never import each other"
        ));
    }
    let allowed = rules.domain_edges.get(from).map(|(to, _)| to);
    (!allowed.is_some_and(|allowed| allowed.contains(to))).then(|| {
        format!(
            "{place}: `{from}` imports `{to}`, a domain edge ARCHITECTURE.md's edge table does \
             not list (list it with its reason, or move what is imported)"
        )
    })
}

// ---------------------------------------------------------------------------------------------
// The checks on the crate.
// ---------------------------------------------------------------------------------------------

fn src() -> PathBuf {
    root().join("src")
}

#[test]
fn every_module_is_in_exactly_one_layer_and_every_layer_module_exists() {
    let rules = rules();
    let files = rust_files(&src());
    assert!(
        files.len() > 20,
        "found only {} files under src/",
        files.len()
    );
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(&src(), f).first().cloned())
        .collect();
    let listed = rules.modules();
    for module in &modules {
        assert!(
            listed.contains(module.as_str()),
            "src/{module} is in no layer: add it to ARCHITECTURE.md's layer table"
        );
    }
    for module in &listed {
        assert!(
            modules.contains(*module),
            "ARCHITECTURE.md's layer table lists `{module}`, which is not a module of src/"
        );
    }
    // The checker reads a file's module from where it lies, as the compiler does without
    // `#[path]`.
    for file in &files {
        let code = code_only(&read(file));
        let shown = file.display();
        assert!(!code.contains("#[path"), "{shown}: a `#[path]` attribute");
    }
    let count: usize = rules.layers.iter().map(|(_, m)| m.len()).sum();
    assert_eq!(count, listed.len(), "a module is in two layers: {rules:?}");
}

#[test]
fn modules_import_only_what_the_layers_and_the_edge_table_allow() {
    let rules = rules();
    let (edges, root_globs) = imports(&src(), &rules.modules());
    let found = violations(&rules, &edges, &root_globs);
    let messages: Vec<&str> = found.iter().map(|(_, m)| m.as_str()).collect();
    assert!(found.is_empty(), "{}", messages.join("\n"));
}

#[test]
fn every_listed_domain_edge_is_used() {
    let rules = rules();
    let (edges, _) = imports(&src(), &rules.modules());
    let used: BTreeSet<(&str, &str)> = edges
        .iter()
        .map(|e| (e.from.as_str(), e.to.as_str()))
        .collect();
    for (from, (to, _)) in &rules.domain_edges {
        for to in to {
            assert!(
                used.contains(&(from.as_str(), to.as_str())),
                "ARCHITECTURE.md lists the domain edge `{from}` → `{to}`, which no code uses: \
                 remove it from the table"
            );
        }
    }
}

#[test]
fn the_domain_edge_table_has_no_cycle_and_every_edge_has_a_reason() {
    let rules = rules();
    for (from, (to, why)) in &rules.domain_edges {
        assert!(
            to.is_empty() || !why.is_empty(),
            "`{from}`'s domain edges have no reason in ARCHITECTURE.md"
        );
    }
    // Depth-first from every module; a module met again on the current path closes a cycle.
    fn visit(
        node: &str,
        rules: &Rules,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Result<(), String> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Err(format!("{} -> {node}", path[at..].join(" -> ")));
        }
        if done.contains(node) {
            return Ok(());
        }
        path.push(node.to_string());
        for next in rules.domain_edges.get(node).into_iter().flat_map(|e| &e.0) {
            visit(next, rules, path, done)?;
        }
        path.pop();
        done.insert(node.to_string());
        Ok(())
    }
    let mut done = BTreeSet::new();
    for node in rules.domain_edges.keys() {
        if let Err(cycle) = visit(node, &rules, &mut Vec::new(), &mut done) {
            panic!("ARCHITECTURE.md's domain edges form a cycle: {cycle}");
        }
    }
}

#[test]
fn only_main_starts_the_program() {
    let rules = rules();
    let top = rules.layers.last().expect("layers");
    assert_eq!(
        top,
        &("program".to_string(), vec!["runtime".to_string()]),
        "the top layer is the program, `runtime` alone"
    );
    // Nothing may import the top layer (`violations` fails an upward import); main.rs, left
    // out of the graph, is the one user.
    let main = read(&src().join("main.rs"));
    assert!(main.contains("runtime::"), "main.rs starts the runtime");
}

#[test]
fn lib_rs_states_the_same_layers() {
    let rules = rules();
    let lib = read(&src().join("lib.rs"));
    // `//! N. name: `a`, `b` ...` items, continued on the lines below until the next one.
    let mut stated: Vec<Vec<String>> = Vec::new();
    for line in lib.lines().filter_map(|l| l.strip_prefix("//!")) {
        let line = line.trim_start();
        let number = line.split('.').next().unwrap_or_default();
        if !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()) {
            stated.push(Vec::new());
        } else if line.is_empty() {
            continue;
        }
        if let Some(item) = stated.last_mut() {
            item.extend(backticked(line));
        }
    }
    let modules = rules.modules();
    let stated: Vec<BTreeSet<String>> = stated
        .into_iter()
        .map(|names| {
            let names = names.into_iter().filter(|n| modules.contains(n.as_str()));
            names.collect()
        })
        .collect();
    let doc: Vec<BTreeSet<String>> = rules
        .layers
        .iter()
        .map(|(_, modules)| modules.iter().cloned().collect())
        .collect();
    assert_eq!(
        stated, doc,
        "src/lib.rs's layer list and ARCHITECTURE.md's layer table disagree"
    );
}

// ---------------------------------------------------------------------------------------------
// The checker, checked.
// ---------------------------------------------------------------------------------------------

#[test]
fn the_checker_reads_use_trees_chains_and_code_paths_but_not_prose() {
    let module = ["http".to_string(), "admin".to_string()];
    let text = r##"
        use crate::{control::ControlCore, net::{self, codec::{Head as H, parse}}};
        pub use super::super::shared::Shared;
        pub(crate) use self::inner::Thing;
        // use crate::runtime::run;
        /* use crate::runtime::run; /* nested */ crate::runtime */
        /// crate::runtime in a doc comment
        const S: &str = "crate::runtime::run";
        const R: &str = r#"use crate::runtime; "quoted""#;
        const C: char = '"';
        fn f<'a>(x: &'a str) -> u64 { crate::limits::MAX + x.len() as u64 + crate::r#copy::N }
        mod inner { use super::super::super::mesh::*; }
        pub(super) fn g() {}
    "##;
    let named: Vec<(usize, String)> = crate_paths(&module, text)
        .into_iter()
        .map(|p| {
            (
                p.line,
                p.segments.join("::") + if p.glob { "::*" } else { "" },
            )
        })
        .collect();
    let expected = [
        (2, "control::ControlCore"),
        (2, "net"),
        (2, "net::codec::Head"),
        (2, "net::codec::parse"),
        (3, "shared::Shared"),
        (4, "http::admin::inner::Thing"),
        (11, "limits::MAX"),
        (11, "copy::N"),
        (12, "mesh::*"),
    ];
    let expected: Vec<(usize, String)> =
        expected.iter().map(|(l, p)| (*l, p.to_string())).collect();
    assert_eq!(named, expected);
}

/// One fake source tree under `tests/fixtures/layers/` and the imports the checker must find
/// forbidden there (`from → to`; empty: the tree must pass).
const FIXTURES: &[(&str, &[&str])] = &[
    ("grouped_use_between_the_planes", &["http → control"]),
    (
        "super_chain_to_the_other_plane",
        &["http → control", "http → control"],
    ),
    ("pub_use_of_a_forbidden_domain_edge", &["kv_events → index"]),
    (
        "nested_use_trees_and_renames",
        &["metrics → policy", "tokenize → index"],
    ),
    ("crate_path_in_an_expression", &["workers → policy"]),
    ("glob_of_the_crate_root", &["root glob"]),
    ("legal_imports_in_every_form", &[]),
];

#[test]
fn the_checker_rejects_each_way_around_it() {
    let rules = rules();
    let fixtures = root().join("tests/fixtures/layers");
    for (case, expected) in FIXTURES {
        let (edges, root_globs) = imports(&fixtures.join(case), &rules.modules());
        assert!(
            !edges.is_empty() || !root_globs.is_empty(),
            "{case}: read no import"
        );
        let found = violations(&rules, &edges, &root_globs);
        println!("{case}:");
        for edge in &edges {
            println!("  edge {} → {} ({})", edge.from, edge.to, edge.place);
        }
        if found.is_empty() {
            println!("  accepted");
        }
        for (_, message) in &found {
            println!("  rejected: {message}");
        }
        let rejected: Vec<&str> = found.iter().map(|(label, _)| label.as_str()).collect();
        assert_eq!(rejected, *expected, "{case}: {found:#?}");
    }
}

#[test]
fn the_rules_reader_refuses_a_table_it_cannot_trust() {
    let layers = "| layer | modules | what |\n|---|---|---|\n| 1 leaves | `ids` | x |\n\
                  | 2 domain | `a`, `b` | x |\n\n";
    let edges = |rows: &str| {
        format!("{layers}| module | imports from the domain | why |\n|---|---|---|\n{rows}\n")
    };
    let good = parse_rules(&edges("| `a` | `b` | a reason |\n| `b` | — | |")).expect("valid");
    assert_eq!(good.layers.len(), 2);
    assert!(good.domain_edges["a"].0.contains("b"));
    for bad in [
        edges("| `a` | `b` | r |"),                           // `b` has no row
        edges("| `a` | `c` | r |\n| `b` | — | |"),            // `c` is not a domain module
        edges("| `a` | — | |\n| `a` | — | |\n| `b` | — | |"), // two rows for `a`
        layers.to_string(),                                   // no edge table
    ] {
        assert!(parse_rules(&bad).is_err(), "accepted:\n{bad}");
    }
}
