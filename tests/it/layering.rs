//! The crate's layering, checked on its source: which file of `src/` imports which.
//!
//! A file imports another when it names a path into it: a `use` declaration (`crate::…`
//! anywhere; `super::…`, `self::…` and a child module's name at the top level of the file) or a
//! `crate::…` path written inline. A path resolves to the file of its longest module prefix
//! (`crate::worker::completer::Transition` → `src/worker/completer.rs`). Comments are ignored,
//! and so is `lib.rs`, whose re-exports are the public surface, not a dependency.
//!
//! Rules:
//! - the core ([`CORE`]: the job runtime every kind runs on, the worker included) never imports
//!   `etl/`: the ETL kind is built on it like any user's kind;
//! - the worker (`worker/`) never imports `metrics`, `etl/` or `api/`;
//! - no two files import each other;
//! - the worker's stages ([`STAGES`]: liveness, complete, run, claim) each import only the
//!   stages below them and the worker's shared files (`worker/*.rs`), their test files aside;
//! - `worker/mod.rs` stays a facade (at most 200 lines) and no file is over 500 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Pairs of files still allowed to import each other, each with the reason; the test fails when
/// one no longer does, so an exception cannot outlive its cause.
const CIRCLE_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// Imports from the worker into `metrics` still allowed, with the reason (see
/// [`CIRCLE_EXCEPTIONS`]); the test fails when one no longer exists.
const WORKER_METRICS_EXCEPTIONS: &[(&str, &str)] = &[];

/// The core: every module of the job runtime, which no kind's module (`etl/`) may be imported by.
const CORE: &[&str] = &[
    "codes",
    "config",
    "db",
    "digest",
    "enqueue",
    "error",
    "handler",
    "intake",
    "job",
    "jobs",
    "notifier",
    "queue",
    "replica",
    "schema",
    "shutdown",
    "sql",
    "state",
    "telemetry",
    "time",
    "worker",
];

/// The worker's stages, lowest first: each stage's files import only the stages before it here.
/// Liveness (leases renewed, owners judged) needs no other stage; completing a claim needs
/// liveness (the held jobs, the alive locks); running a job hands it to completion; and the claim
/// loop starts runs, releases and joins presence.
const STAGES: &[&str] = &["liveness", "complete", "run", "claim"];

/// The position in [`STAGES`] of the stage `file` belongs to, if it is in one.
fn stage_of(file: &str) -> Option<usize> {
    STAGES
        .iter()
        .position(|stage| is_in(file, &format!("worker/{stage}")))
}

/// The crate's `src/` directory.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, as paths relative to `src/` with `/` separators.
fn rust_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(src()).unwrap();
            out.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The module path of a file (`worker/mod.rs` → `["worker"]`, `etl/request.rs` →
/// `["etl", "request"]`, `lib.rs` → `[]`).
fn module_of(file: &str) -> Vec<String> {
    let stem = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The file of the longest module prefix of `path` (crate-relative segments), if any file of
/// `src/` holds one; `lib.rs` (the crate root) does not count.
fn file_of(path: &[String], files: &BTreeSet<String>) -> Option<String> {
    (1..=path.len()).rev().find_map(|n| {
        let prefix = path[..n].join("/");
        [format!("{prefix}.rs"), format!("{prefix}/mod.rs")]
            .into_iter()
            .find(|f| files.contains(f))
    })
}

/// `text` without its comments and with every string and character literal emptied, so that
/// neither a doc link nor a string that happens to read `crate::…` or `use …` counts.
fn strip_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        let after_ident = i > 0 && is_ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && !after_ident && matches!(next, Some('"' | '#')) {
            let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
            let open = i + 1 + hashes;
            if chars.get(open) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let closing: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let rest: String = chars[open + 1..].iter().collect();
            let len = rest
                .find(&closing)
                .map_or(rest.len(), |n| n + closing.len());
            out.push_str("\"\"");
            i = open + 1 + rest[..len].chars().count();
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal (a lifetime has no closing quote right after its first char).
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("' '");
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The paths a use tree names (`a::{b, c::{self, D}}` → `a::b`, `a::c`, `a::c::D`), as segments.
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    /// Expands `tree` under `prefix` into `out`.
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(open) = tree.find('{') {
            let mut path = prefix.to_vec();
            path.extend(segments(&tree[..open]));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            for part in split_top_level(inner) {
                expand(&path, part, out);
            }
        } else {
            let name = tree.split(" as ").next().unwrap_or(tree);
            let mut path = prefix.to_vec();
            path.extend(
                segments(name)
                    .into_iter()
                    .filter(|s| s != "self" && s != "*"),
            );
            out.push(path);
        }
    }
    let mut out = Vec::new();
    expand(&[], tree, &mut out);
    out
}

/// The `::`-separated segments of a path, trimmed, without empty ones.
fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `text` split at its top-level commas (not those inside braces).
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Whether `c` can be part of an identifier.
fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The crate-relative paths `code` (the comment-free text of `file`) names.
fn named_paths(file: &str, code: &str, files: &BTreeSet<String>) -> Vec<Vec<String>> {
    let module = module_of(file);
    let mut paths = Vec::new();
    // Inline absolute paths: `crate::a::b` wherever it stands.
    for (at, _) in code.match_indices("crate::") {
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let end = rest
            .find(|c: char| !(is_ident(c) || c == ':'))
            .unwrap_or(rest.len());
        paths.push(segments(&rest[..end]));
    }
    // Use declarations: their trees, resolved from where they stand.
    let mut offset = 0;
    while let Some(found) = code[offset..].find("use ") {
        let at = offset + found;
        offset = at + 4;
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
        let prefix = &code[line_start..at];
        // `use` opens the statement (after any visibility); at column 0 it is the file's own.
        if !(prefix.trim().is_empty() || prefix.trim_start().starts_with("pub")) {
            continue;
        }
        let top_level = prefix.is_empty() || prefix.starts_with("pub");
        let end = code[at..].find(';').map_or(code.len(), |n| at + n);
        for path in expand_use_tree(&code[at + 4..end]) {
            let Some(first) = path.first() else { continue };
            let resolved = match first.as_str() {
                "crate" => path[1..].to_vec(),
                "super" if top_level => {
                    let mut base = module.clone();
                    base.pop();
                    base.into_iter().chain(path[1..].iter().cloned()).collect()
                }
                "self" if top_level => module.iter().chain(&path[1..]).cloned().collect(),
                _ if top_level => {
                    let mut child = module.clone();
                    child.push(first.clone());
                    if file_of(&child, files).is_none_or(|f| module_of(&f) != child) {
                        continue;
                    }
                    module.iter().chain(&path).cloned().collect()
                }
                _ => continue,
            };
            paths.push(resolved);
        }
    }
    paths
}

/// The top-level modules `lib.rs` declares (`mod x;`, with any visibility).
fn library_modules() -> BTreeSet<String> {
    let lib = strip_comments(&std::fs::read_to_string(src().join("lib.rs")).unwrap());
    lib.split(';')
        .filter_map(|statement| {
            let words: Vec<&str> = statement.split_whitespace().collect();
            match words.as_slice() {
                [.., "mod", name] => Some((*name).to_owned()),
                _ => None,
            }
        })
        .collect()
}

/// Every file of the library (the modules `lib.rs` declares, not the binary's) with the files
/// it imports.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    rust_files(&src(), &mut all);
    let modules = library_modules();
    let files: BTreeSet<String> = all
        .into_iter()
        .filter(|f| modules.iter().any(|m| is_in(f, m)))
        .collect();
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(src().join(file)).unwrap();
            let code = strip_comments(&text);
            let targets = named_paths(file, &code, &files)
                .iter()
                .filter_map(|path| file_of(path, &files))
                .filter(|target| target != file)
                .collect();
            (file.clone(), targets)
        })
        .collect()
}

/// Whether `file` is `name.rs` or lies under `name/`.
fn is_in(file: &str, name: &str) -> bool {
    file == format!("{name}.rs") || file.starts_with(&format!("{name}/"))
}

#[test]
fn the_parser_sees_use_trees_inline_paths_and_child_modules() {
    let files: BTreeSet<String> = [
        "api/mod.rs",
        "db.rs",
        "etl/request.rs",
        "metrics.rs",
        "worker/completer.rs",
        "worker/mod.rs",
    ]
    .map(str::to_owned)
    .into();
    let code = strip_comments(
        "//! [`crate::api`]\n/* use crate::api; */ use claimer::X;\nuse completer::Transition;\n\
         use crate::{etl::request::{self, Y}, worker};\nfn f() { let _ = \"crate::metrics\"; \
         crate::db::checkout(); }\n",
    );
    let paths = named_paths("worker/mod.rs", &code, &files);
    let targets: BTreeSet<_> = paths.iter().filter_map(|p| file_of(p, &files)).collect();
    assert_eq!(
        targets,
        [
            "db.rs",
            "etl/request.rs",
            "worker/completer.rs",
            "worker/mod.rs"
        ]
        .map(str::to_owned)
        .into()
    );
}

#[test]
fn the_core_never_imports_etl_and_the_worker_never_imports_metrics_etl_or_api() {
    let imports = imports();
    let mut broken = Vec::new();
    for (file, targets) in &imports {
        for target in targets {
            let core = CORE.iter().any(|m| is_in(file, m));
            if core && is_in(target, "etl") {
                broken.push(format!("{file} imports {target}"));
            }
            let worker = is_in(file, "worker");
            let excepted =
                target == "metrics.rs" && WORKER_METRICS_EXCEPTIONS.iter().any(|(f, _)| f == file);
            if worker && !excepted && ["metrics", "etl", "api"].iter().any(|n| is_in(target, n)) {
                broken.push(format!("{file} imports {target}"));
            }
        }
    }
    for (file, why) in WORKER_METRICS_EXCEPTIONS {
        if !imports.get(*file).is_some_and(|t| t.contains("metrics.rs")) {
            broken.push(format!(
                "{file} no longer imports metrics.rs: remove its exception ({why})"
            ));
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn each_stage_of_the_worker_imports_only_the_stages_below_it() {
    let imports = imports();
    let mut upward = Vec::new();
    let mut staged = 0;
    for (file, targets) in &imports {
        let Some(from) = stage_of(file) else {
            continue;
        };
        staged += 1;
        if file.ends_with("tests.rs") {
            continue;
        }
        for target in targets {
            if stage_of(target).is_some_and(|to| to > from) {
                upward.push(format!("{file} -> {target}"));
            }
        }
    }
    assert!(staged > 20, "only {staged} files in stages");
    assert!(
        upward.is_empty(),
        "imports of a later stage:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_two_files_of_src_import_each_other() {
    let imports = imports();
    let mut circles = Vec::new();
    for (file, targets) in &imports {
        for target in targets {
            let back = imports.get(target).is_some_and(|t| t.contains(file));
            let excepted = CIRCLE_EXCEPTIONS
                .iter()
                .any(|(a, b, _)| (a, b) == (&file.as_str(), &target.as_str()));
            if back && file < target && !excepted {
                circles.push(format!("{file} <-> {target}"));
            }
        }
    }
    for (a, b, why) in CIRCLE_EXCEPTIONS {
        let imports_of = |x: &str, y: &str| imports.get(x).is_some_and(|t| t.contains(y));
        let still = imports_of(a, b) && imports_of(b, a);
        if !still {
            circles.push(format!("{a} <-> {b} is gone: remove its exception ({why})"));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_facade_stays_thin_and_no_file_of_src_grows_past_500_lines() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let lines = |file: &str| {
        std::fs::read_to_string(src().join(file))
            .unwrap()
            .lines()
            .count()
    };
    assert!(files.len() > 40, "only {} files found", files.len());
    let long: Vec<(String, usize)> = files
        .iter()
        .map(|f| (f.clone(), lines(f)))
        .filter(|(_, n)| *n > 500)
        .collect();
    assert!(long.is_empty(), "files over 500 lines: {long:?}");
    assert!(lines("worker/mod.rs") <= 200, "worker/mod.rs is no facade");
}
