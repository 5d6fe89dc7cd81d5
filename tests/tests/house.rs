//! The repository explains itself: the book's Layout chapter names every
//! Rust source file (itself, or a folder holding it) and nothing that is
//! not there, every link between the README and the book's pages leads to
//! a page and a heading that exist, no source or document refers to a
//! tracker's issue by number (the code says what it does and why instead),
//! and no source file or function is too long to read.

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
    let start = readme.find("# Layout").expect("a Layout section");
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
    let layout =
        std::fs::read_to_string(root.join("docs/src/layout.md")).expect("docs/src/layout.md");
    let listed = layout_paths(&layout);
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
        "source files docs/src/layout.md does not name (add a line each): {missing:?}"
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

/// The id mdBook (and GitHub) gives a heading: lower case, spaces to `-`,
/// only letters, digits, `-` and `_` kept.
fn heading_id(title: &str) -> String {
    title
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The ids of a page's headings (outside code blocks).
fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            code = !code;
            continue;
        }
        if !code && let Some(title) = line.strip_prefix('#') {
            ids.insert(heading_id(title.trim_start_matches('#')));
        }
    }
    ids
}

/// The targets of a page's Markdown links (`[text](target)`), outside code.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            code = !code;
            continue;
        }
        if code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_link_of_the_readme_and_the_book_leads_somewhere() {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    files(&root.join("docs/src"), &[".md"], &mut pages);
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a page");
        for target in link_targets(&text) {
            if target.contains("://") {
                broken.push(format!(
                    "{}: {target}: a link outside the repository",
                    relative(page)
                ));
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let to = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a folder").join(file)
            };
            let Ok(to_text) = std::fs::read_to_string(&to) else {
                broken.push(format!("{}: {target}: no such file", relative(page)));
                continue;
            };
            if !anchor.is_empty() && !heading_ids(&to_text).contains(anchor) {
                broken.push(format!("{}: {target}: no such heading", relative(page)));
            }
        }
    }
    // Every chapter is in the book's table of contents.
    let summary = std::fs::read_to_string(root.join("docs/src/SUMMARY.md")).expect("SUMMARY.md");
    let listed: BTreeSet<String> = link_targets(&summary).into_iter().collect();
    for page in &pages[1..] {
        let name = page
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if name != "SUMMARY.md" && !listed.contains(&name) {
            broken.push(format!("docs/src/{name}: not in SUMMARY.md"));
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn heading_ids_are_mdbooks() {
    assert_eq!(
        heading_id(" The embedded broker as an MQTT 5 broker"),
        "the-embedded-broker-as-an-mqtt-5-broker"
    );
    assert_eq!(heading_id("Listing keys: SCAN"), "listing-keys-scan");
}

/// Where each function of a rustfmt-formatted file starts and how many
/// lines it spans (to the closing brace at its own indentation).
fn function_spans(text: &str) -> Vec<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut spans = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let mut words = body.split_whitespace().peekable();
        while words
            .peek()
            .is_some_and(|w| w.starts_with("pub") || ["async", "const", "unsafe"].contains(w))
        {
            words.next();
        }
        if words.next() != Some("fn") || body.ends_with(';') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            spans.push((i + 1, end + 2, body.to_string()));
        }
    }
    spans
}

/// The sources stay small enough to read: no file of a crate's `src` over
/// 1,000 lines, no function over 150.
#[test]
fn no_source_file_or_function_is_too_long() {
    let mut sources = Vec::new();
    for dir in ["host/src", "guest/src", "plugins", "tests/src"] {
        files(&root().join(dir), &[".rs"], &mut sources);
    }
    assert!(sources.len() > 50, "found {} sources", sources.len());
    let mut long = Vec::new();
    for path in &sources {
        if !relative(path).contains("/src/") {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("read a source");
        let n = text.lines().count();
        if n > 1000 {
            long.push(format!("{}: {n} lines", relative(path)));
        }
        for (at, len, head) in function_spans(&text) {
            if len > 150 {
                long.push(format!("{}:{at}: {len} lines: {head}", relative(path)));
            }
        }
    }
    assert!(long.is_empty(), "split these:\n{}", long.join("\n"));
}

#[test]
fn function_spans_are_measured() {
    let text = "fn a() {\n    x();\n}\n\nimpl B {\n    pub(crate) async fn c(\n        d: u8,\n    ) {\n        e();\n    }\n    fn f();\n}\n";
    let spans: Vec<(usize, usize)> = function_spans(text)
        .into_iter()
        .map(|(at, len, _)| (at, len))
        .collect();
    assert_eq!(spans, vec![(1, 3), (6, 5)]);
}
