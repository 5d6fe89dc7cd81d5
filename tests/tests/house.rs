//! The repository explains itself: the README's Layout section names every
//! Rust source file (itself, or a folder holding it) and nothing that is
//! not there, and no source or document refers to a tracker's issue by
//! number (the code says what it does and why instead).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

/// The paths the Layout block lists, relative to the root: a line's first
/// word is a path when it has a `/` or a `.`; an indented one is inside the
/// folder above it; deeply indented lines continue a description.
fn layout_paths(readme: &str) -> Vec<String> {
    let start = readme.find("## Layout").expect("a Layout section");
    let block = &readme[start..];
    let open = block.find("```").expect("a code block") + 3;
    let close = open + block[open..].find("```").expect("its end");
    let mut folders: Vec<(usize, String)> = Vec::new();
    let mut paths = Vec::new();
    for line in block[open..close].lines() {
        let indent = line.len() - line.trim_start().len();
        let Some(word) = line.split_whitespace().next() else {
            continue;
        };
        if indent >= 20 || !(word.contains('/') || word.contains('.')) {
            continue;
        }
        while folders.last().is_some_and(|(i, _)| *i >= indent) {
            folders.pop();
        }
        let path = match folders.last() {
            Some((_, folder)) => format!("{folder}{word}"),
            None => word.to_string(),
        };
        if path.ends_with('/') {
            folders.push((indent, path.clone()));
        }
        paths.push(path);
    }
    paths
}

fn files(dir: &Path, ext: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !["target", "node_modules", ".git", "vendor"].contains(&name.as_ref()) {
                files(&path, ext, out);
            }
        } else if ext.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .expect("under the root")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_layout_names_every_source_file() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let listed = layout_paths(&readme);
    let absent: Vec<&String> = listed.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        absent.is_empty(),
        "the Layout lists what is not there: {absent:?}"
    );

    // Folders of a whole crate, or its src/ or tests/, name too much to count.
    let roots = [
        "guest/src",
        "guest/tests",
        "host/src",
        "host/tests",
        "host/benches",
        "tests/src",
        "tests/tests",
        "plugins/mosquitto/src",
        "plugins/mosquitto/tests",
    ];
    let broad: BTreeSet<String> = ["guest/", "host/", "tests/", "plugins/mosquitto/"]
        .into_iter()
        .map(String::from)
        .chain(roots.iter().map(|r| format!("{r}/")))
        .collect();
    let folders: Vec<&String> = listed
        .iter()
        .filter(|p| p.ends_with('/') && !broad.contains(*p))
        .collect();
    let mut sources = Vec::new();
    for r in roots {
        files(&root.join(r), &[".rs"], &mut sources);
    }
    let missing: Vec<String> = sources
        .iter()
        .map(|p| relative(p))
        .filter(|p| !listed.contains(p) && !folders.iter().any(|f| p.starts_with(f.as_str())))
        .collect();
    assert!(
        missing.is_empty(),
        "source files the README's Layout does not name (add a line each): {missing:?}"
    );
}

#[test]
fn the_layout_reader_follows_folders() {
    let readme = "## Layout\n\n```\nhost/  the host\n  src/a.rs  a\n  src/cluster/  c\n                    more about c\n  tests/b.rs  b\nwit/x.wit  x\n```\n";
    assert_eq!(
        layout_paths(readme),
        [
            "host/",
            "host/src/a.rs",
            "host/src/cluster/",
            "host/tests/b.rs",
            "wit/x.wit"
        ]
    );
}

/// The word for a tracker's ticket, or for a review's numbered point,
/// followed by its number (with `#`, in the plural, either case): a
/// reader of the repository cannot follow them.
fn issue_reference(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    ["issue", "finding"].iter().any(|word| {
        lower.match_indices(word).any(|(at, _)| {
            let word_start = !lower[..at].ends_with(|c: char| c.is_ascii_alphanumeric());
            let after = lower[at + word.len()..]
                .trim_start_matches('s')
                .trim_start_matches([' ', '#']);
            word_start && after.starts_with(|c: char| c.is_ascii_digit())
        })
    })
}

#[test]
fn no_source_or_document_names_an_issue_number() {
    let root = root();
    let mut paths = Vec::new();
    for dir in [
        "guest", "host", "tests", "plugins", "fuzz", "scripts", "examples", "wit", "docs", ".ci",
    ] {
        files(
            &root.join(dir),
            &[
                ".rs", ".md", ".toml", ".go", ".js", ".mjs", ".py", ".sh", ".wit", ".yaml", ".json",
            ],
            &mut paths,
        );
    }
    for file in [
        "README.md",
        "CHANGELOG.md",
        "BENCHMARKS.md",
        "Cargo.toml",
        "rust-toolchain.toml",
    ] {
        paths.push(root.join(file));
    }
    // The scripts have no extension.
    if let Ok(entries) = std::fs::read_dir(root.join("scripts")) {
        paths.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
    }
    let this = Path::new(file!()).file_name().expect("a name").to_owned();
    let mut found = Vec::new();
    for path in paths {
        if path.file_name() == Some(this.as_os_str()) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if issue_reference(line) {
                found.push(format!("{}:{}: {}", relative(&path), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "say what the code does instead of naming an issue:\n{}",
        found.join("\n")
    );
}

#[test]
fn issue_references_are_recognised() {
    // Built here, so that this file does not hold what it forbids.
    let (i, f) = ("issue", "finding");
    for yes in [
        format!("({i} 15)"),
        format!("{}ssue #16", 'I'),
        format!("{i}s 15 and 16"),
        format!("see {i}15"),
        format!("{}inding 7: x", 'F'),
    ] {
        assert!(issue_reference(&yes), "{yes}");
    }
    assert!(issue_reference(&format!("{f} 3")));
    for no in [
        "an issue with it",
        "issues remain",
        "tissue 4 x",
        "findings remain",
    ] {
        assert!(!issue_reference(no), "{no}");
    }
}
