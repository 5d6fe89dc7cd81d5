//! No import cycles between the modules of the guest or of the host.
//!
//! A module is a file or folder directly under `src/` (`machine/` with its
//! files is one module); it depends on another when its code (not its
//! comments, nor its `#[cfg(test)]` tests) names `crate::<other>`. The graph
//! must be acyclic, so that each layer can be read, tested and replaced
//! without the ones above it. Run `cargo test -p statestore-tests --test
//! module_deps -- --nocapture` to print the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

/// The code of a file: comments and the `#[cfg(test)]` module cut away.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module names `crate::` paths in `code` start with,
/// including each name of a `use crate::{a, b::c}` group.
fn references(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: at brace depth 0, after `{` or `,`.
            let mut depth = 0;
            let mut expect_name = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => expect_name = true,
                    c if c.is_whitespace() => {}
                    _ if expect_name && depth == 0 => {
                        out.insert(ident(&group[i..]));
                        expect_name = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// The module graph of a crate's `src/`.
fn graph(src: &Path, skip: &[&str]) -> Graph {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(src).expect("src/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a name")
            .to_string();
        if skip.contains(&name.as_str()) {
            continue;
        }
        if path.is_dir() {
            let mut stack = vec![path];
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).expect("dir") {
                    let p = e.expect("entry").path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        files.push((name.clone(), p));
                    }
                }
            }
        } else if path.extension().is_some_and(|x| x == "rs") {
            files.push((name, path));
        }
    }
    let modules: BTreeSet<String> = files.iter().map(|(n, _)| n.clone()).collect();
    let mut g = Graph::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path).expect("source");
        let deps = g.entry(module.clone()).or_default();
        for r in references(&code(&text)) {
            if r != *module && modules.contains(&r) {
                deps.insert(r);
            }
        }
    }
    g
}

/// Every cycle's modules, found by depth-first search (one per back edge).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    fn visit(
        n: &str,
        g: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            found.push(cycle);
            return;
        }
        if done.contains(n) {
            return;
        }
        path.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            visit(d, g, path, done, found);
        }
        path.pop();
        done.insert(n.to_string());
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for n in g.keys() {
        visit(n, g, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

fn check(crate_dir: &str, skip: &[&str]) {
    let g = graph(&root().join(crate_dir).join("src"), skip);
    println!("{crate_dir}:");
    for (m, deps) in &g {
        println!(
            "  {m} -> {}",
            deps.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "import cycles in {crate_dir}/src: {}",
        found
            .iter()
            .map(|c| c.join(" -> "))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

#[test]
fn the_guest_has_no_import_cycles() {
    // lib.rs is the root that declares the modules; component.rs is the
    // wasm glue at the top that nothing uses.
    check("guest", &["lib", "component"]);
}

#[test]
fn the_host_has_no_import_cycles() {
    // lib.rs declares the modules; main.rs is the binary (another crate).
    check("host", &["lib", "main"]);
}

#[test]
fn the_checker_finds_cycles() {
    let refs = references(
        "use crate::{a::X, b, c::{d, e}};\nfn f() { crate::f::g(); }\n// crate::comment",
    );
    assert_eq!(
        refs,
        ["a", "b", "c", "comment", "f"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    assert!(!code("x\n// crate::comment\n").contains("comment"));
    let g: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .fold(Graph::new(), |mut g, (from, to)| {
            g.entry(from.into()).or_default().insert(to.into());
            g.entry(to.into()).or_default();
            g
        });
    assert_eq!(cycles(&g), vec![vec!["a", "b", "c", "a"]]);
}
