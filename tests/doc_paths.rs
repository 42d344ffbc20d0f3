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

/// ARCHITECTURE.md's pass table lists the cpu pipeline in order (every pass of a target with
/// every option on), each with the level it starts at and files that exist.
#[test]
fn the_pass_table_is_the_pipeline() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut rows = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | # | `pass` | files | level | what |
        if cells.len() == 7 && cells[1].parse::<usize>().is_ok() && cells[2].starts_with('`') {
            rows.push((cells[2].trim_matches('`').to_string(), cells[3].to_string(), cells[4].to_string()));
        }
    }
    let mut target = aim_compiler::target::Target::host();
    target.features.avx512vnni = true;
    let names = aim_compiler::passes::cpu_pass_names(&target);
    let table: Vec<&str> = rows.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(table, names, "ARCHITECTURE.md's pass table against cpu_pass_names");
    for (name, files, level) in &rows {
        let want = aim_compiler::passes::min_level(name).number().to_string();
        assert_eq!(level, &want, "{name}'s level");
        for f in files.split(',').map(|f| f.trim().trim_matches('`')).filter(|f| f.ends_with(".rs")) {
            let path = if f.starts_with("compiler/") { root.join(f) } else { root.join("compiler/src/passes").join(f) };
            assert!(path.exists(), "{name}: {} does not exist", path.display());
        }
    }
}
