//! Every repository path the docs cite exists: README.md, ARCHITECTURE.md and `docs/*.md`
//! name files and folders in backquotes (`compiler/src/passes/fuse.rs`), and a file moved
//! or renamed without its docs fails here, naming the document and the path.

use std::path::Path;

/// The top-level folders a cited path starts with; other backquoted text (commands, code,
/// option names) is not a path.
const ROOTS: &[&str] = &[
    "capi/",
    "compiler/",
    "deploy/",
    "docs/",
    "examples/",
    "fuzz/",
    "include/",
    "ir-spec/",
    "kernels/",
    "python/",
    "runtime/",
    "runtime-capi/",
    "src/",
    "tests/",
    "tools/",
];

/// The backquoted spans of `text` that name a repository path: a known root, no
/// placeholders (`<pass>`, `NAME`, `*`, `…`), no spaces; a trailing `:line` or `#anchor`
/// is dropped.
fn cited_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 || span.contains(char::is_whitespace) || !ROOTS.iter().any(|r| span.starts_with(r)) {
            continue;
        }
        if span.contains(['<', '>', '*', '{', '…', '$']) || span.contains("NAME") {
            continue;
        }
        let path = span.split(['#', ':']).next().unwrap_or(span).trim_end_matches(['.', ',', ')']);
        out.push(path.to_string());
    }
    out
}

#[test]
fn every_path_the_docs_cite_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut pages: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    docs.extend(pages);
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        for p in cited_paths(&text) {
            checked += 1;
            if !root.join(&p).exists() {
                missing.push(format!("{}: `{p}`", doc.strip_prefix(root).unwrap_or(doc).display()));
            }
        }
    }
    println!("{checked} cited paths in {} documents", docs.len());
    assert!(checked > 50, "only {checked} paths found: is the parsing still right?");
    assert!(missing.is_empty(), "paths cited by the docs that do not exist:\n{}", missing.join("\n"));
}
