//! The crate's layering, checked on its source: which file of `src/` imports which.
//!
//! A file imports another when it names a path into it: a `use` declaration (`crate::…`
//! anywhere; `super::…`, `self::…` and a child module's name at the top level of the file) or a
//! `crate::…` path written inline. A path resolves to the file of its longest module prefix
//! (`crate::worker::completer::Transition` → `src/worker/completer.rs`). Comments are ignored,
//! and so is `lib.rs`, whose re-exports are the public surface, not a dependency.
//!
//! Rules:
//! - the library's parts ([`PARTS`]) stack: the foundation, the contract a kind implements
//!   (`job`), what a user calls (`jobs`), the engine (`worker`), the shipped kinds (`kinds/`) and
//!   the shipped service (`service/`); an import from a part into one above it is a back-arrow,
//!   and only those [`BACK_ARROWS_ALLOWED`] names (at most two, each with its reason) may exist;
//! - the core (every part below `kinds/`) never imports `kinds/` or `service/`, and the kinds
//!   never import the engine or the service: the ETL kind is built on the runtime like any
//!   user's kind;
//! - no file of the library or the binary is in a circle of imports of any length but those
//!   [`CIRCLES_ALLOWED`] names (none now; each with its reason);
//! - the worker's stages ([`STAGES`]: liveness, maintain, complete, run, claim) each import only
//!   the stages below them and the worker's shared files (`worker/*.rs`), test files aside;
//! - no file lies more than three folders below its crate's root (`src/`, or the binary's
//!   `src/bin/durable-etl/`);
//! - `worker/mod.rs` stays a facade (at most 200 lines); other files are sized by concept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's parts, lowest first: each top-level module (a file or a folder) of `src/` by
/// the part it belongs to. A module no part names fails the test.
const PARTS: &[(&str, &[&str])] = &[
    (
        "foundation",
        &[
            "codes",
            "config",
            "db",
            "digest",
            "directory",
            "error",
            "intake",
            "names",
            "queue",
            "schema",
            "shutdown",
            "sql",
            "telemetry",
            "time",
        ],
    ),
    ("contract", &["job"]),
    ("calls", &["jobs", "schedule", "dead_letters"]),
    ("engine", &["worker", "replica"]),
    ("kinds", &["kinds"]),
    ("service", &["service"]),
];

/// Back-arrows (imports from a part into one above it) still allowed, each as `(file, target,
/// reason)`; the test fails when one no longer exists, so an exception cannot outlive its cause.
const BACK_ARROWS_ALLOWED: &[(&str, &str, &str)] = &[];

/// The position in [`PARTS`] of the part `file` (relative to `src/`) belongs to.
fn part_of(file: &str) -> Option<usize> {
    PARTS
        .iter()
        .position(|(_, modules)| modules.iter().any(|m| is_in(file, m)))
}

/// The worker's stages, lowest first: each stage's files import only the stages before it here.
/// Liveness (leases renewed, beats, the session) needs no other stage; maintenance (recovery,
/// refunds) judges owners by liveness's locks and beats; completing a claim needs liveness (the
/// held jobs, the alive locks); running a job hands it to completion; and the claim loop starts
/// runs, releases and joins presence.
const STAGES: &[&str] = &["liveness", "maintain", "complete", "run", "claim"];

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

/// The binary's root directory, `src/bin/durable-etl/`.
fn binary() -> PathBuf {
    src().join("bin/durable-etl")
}

/// Every `.rs` file under `dir`, as paths relative to `root` with `/` separators.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap();
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

/// The top-level modules the crate root `root` (`lib.rs`, or the binary's `main.rs`) in `dir`
/// declares (`mod x;`, with any visibility).
fn crate_modules(dir: &Path, root: &str) -> BTreeSet<String> {
    let lib = strip_comments(&std::fs::read_to_string(dir.join(root)).unwrap());
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
    imports_of(&src(), "lib.rs")
}

/// Every file of the crate whose root is `root` in `dir` (`src/lib.rs`, or the binary's
/// `main.rs`: the modules it declares), relative to `dir`, with the files of that crate it
/// imports (`crate::…` names its own root).
fn imports_of(dir: &Path, root: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    rust_files(dir, dir, &mut all);
    let modules = crate_modules(dir, root);
    let files: BTreeSet<String> = all
        .into_iter()
        .filter(|f| modules.iter().any(|m| is_in(f, m)))
        .collect();
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
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
        "//! [`crate::service`]\n/* use crate::service; */ use claimer::X;\nuse completer::Transition;\n\
         use crate::{etl::request::{self, Y}, worker};\nfn f() { let _ = \"crate::service::metrics\"; \
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

/// The imports of `imports` that break the parts' rules: each as a line saying why, and the
/// back-arrows (an import from a part into one above it), as `(file, target)`.
fn part_breaks(
    imports: &BTreeMap<String, BTreeSet<String>>,
) -> (Vec<String>, Vec<(String, String)>) {
    let (mut broken, mut back) = (Vec::new(), Vec::new());
    let kinds = part_of("kinds.rs").unwrap_or(usize::MAX);
    for (file, targets) in imports {
        let Some(from) = part_of(file) else {
            broken.push(format!("{file} is in no part"));
            continue;
        };
        for target in targets {
            let to = part_of(target).unwrap_or(usize::MAX);
            if from < kinds && (is_in(target, "kinds") || is_in(target, "service")) {
                broken.push(format!("{file} (core) imports {target}"));
            }
            if is_in(file, "kinds") && (is_in(target, "worker") || is_in(target, "service")) {
                broken.push(format!("{file} (a kind) imports {target}"));
            }
            if to > from && to != usize::MAX {
                back.push((file.clone(), target.clone()));
            }
        }
    }
    (broken, back)
}

#[test]
fn the_parts_stack_and_the_core_never_imports_the_kinds_or_the_service() {
    let (mut broken, back) = part_breaks(&imports());
    for (file, target) in &back {
        if !BACK_ARROWS_ALLOWED
            .iter()
            .any(|(f, t, _)| f == file && t == target)
        {
            broken.push(format!("back-arrow: {file} -> {target}"));
        }
    }
    for (file, target, why) in BACK_ARROWS_ALLOWED {
        if !back.iter().any(|(f, t)| f == file && t == target) {
            broken.push(format!(
                "{file} no longer imports {target}: remove its exception ({why})"
            ));
        }
    }
    assert!(BACK_ARROWS_ALLOWED.len() <= 2);
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

/// The rules see a back-arrow, a core file importing the service, a kind importing the engine
/// and a file of no part; and let forward imports be.
#[test]
fn the_part_rules_see_back_arrows_and_forbidden_imports() {
    let imports: BTreeMap<String, BTreeSet<String>> = [
        ("error.rs", &["jobs/view.rs"][..]),
        (
            "worker/shared.rs",
            &["service/metrics.rs", "db.rs", "job/handler.rs"],
        ),
        ("kinds/etl/load.rs", &["worker/lease.rs", "job/handler.rs"]),
        ("stray.rs", &[]),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_owned(), t.iter().map(|t| (*t).to_owned()).collect()))
    .collect();
    let (broken, back) = part_breaks(&imports);
    assert_eq!(
        broken,
        [
            "kinds/etl/load.rs (a kind) imports worker/lease.rs",
            "stray.rs is in no part",
            "worker/shared.rs (core) imports service/metrics.rs",
        ]
    );
    assert_eq!(
        back,
        [
            ("error.rs".to_owned(), "jobs/view.rs".to_owned()),
            (
                "worker/shared.rs".to_owned(),
                "service/metrics.rs".to_owned()
            ),
        ]
    );
}

/// No file lies more than three folders below its crate's root.
#[test]
fn no_file_lies_more_than_three_folders_deep() {
    let mut deep = Vec::new();
    for dir in [src(), binary()] {
        let mut files = Vec::new();
        rust_files(&dir, &dir, &mut files);
        deep.extend(
            files
                .into_iter()
                .filter(|f| !f.starts_with("bin/") && f.matches('/').count() > 3),
        );
    }
    assert!(deep.is_empty(), "too deep: {deep:?}");
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

/// The import circles of `imports`, of any length: each strongly connected set of two or more
/// files (every file of it reaches every other through imports), as its sorted files.
fn circles(imports: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen: BTreeSet<&String> = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(file) = stack.pop() {
            for target in imports.get(file).into_iter().flatten() {
                if seen.insert(target) {
                    stack.push(target);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<&String>> =
        imports.keys().map(|f| (f, reach(f))).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    for (file, from_it) in &reached {
        let circle: Vec<String> = from_it
            .iter()
            .filter(|other| reached.get(*other).is_some_and(|back| back.contains(file)))
            .map(|f| (*f).clone())
            .collect();
        if circle.len() > 1 && !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

/// Import circles still allowed, each as its files (sorted) with the reason; the test fails when
/// one changes or goes, so an exception cannot outlive its cause.
const CIRCLES_ALLOWED: &[(&[&str], &str)] = &[];

/// No file of the library or the binary is in an import circle of any length but those
/// [`CIRCLES_ALLOWED`] names.
#[test]
fn no_file_of_the_library_or_the_binary_is_in_an_import_circle() {
    let mut unexpected = Vec::new();
    let mut found = circles(&imports());
    found.extend(circles(&imports_of(&binary(), "main.rs")));
    for circle in &found {
        let allowed = CIRCLES_ALLOWED
            .iter()
            .any(|(files, _)| files.iter().copied().eq(circle.iter().map(String::as_str)));
        if !allowed {
            unexpected.push(circle.join(" -> "));
        }
    }
    for (files, why) in CIRCLES_ALLOWED {
        let still = found
            .iter()
            .any(|c| files.iter().copied().eq(c.iter().map(String::as_str)));
        if !still {
            unexpected.push(format!(
                "{files:?} changed or is gone: update its exception ({why})"
            ));
        }
    }
    assert!(
        unexpected.is_empty(),
        "import circles:\n{}",
        unexpected.join("\n")
    );
}

/// The circle finder sees a circle of three files, and one among the binary's modules.
#[test]
fn the_circle_finder_sees_circles_of_three_and_leaves_chains_alone() {
    let graph = |edges: &[(&str, &str)]| {
        let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            imports
                .entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
            imports.entry((*to).to_owned()).or_default();
        }
        imports
    };
    let three = graph(&[
        ("a.rs", "b.rs"),
        ("b.rs", "c.rs"),
        ("c.rs", "a.rs"),
        ("c.rs", "d.rs"),
    ]);
    assert_eq!(
        circles(&three),
        [["a.rs", "b.rs", "c.rs"].map(String::from).to_vec()]
    );
    let chain = graph(&[("a.rs", "b.rs"), ("b.rs", "c.rs"), ("a.rs", "c.rs")]);
    assert!(circles(&chain).is_empty());
    // The binary's own modules are read from `main.rs`, their `crate::` paths against it.
    let binary = imports_of(&binary(), "main.rs");
    assert!(binary.keys().any(|f| f.starts_with("cli/")), "{binary:?}");
    assert!(
        binary.keys().all(|f| !f.starts_with("worker/")),
        "{binary:?}"
    );
}

/// The worker's facade only starts and stops roles. Files are otherwise sized by what they hold,
/// not by a line count.
#[test]
fn the_worker_facade_stays_thin() {
    let lines = std::fs::read_to_string(src().join("worker/mod.rs"))
        .unwrap()
        .lines()
        .count();
    assert!(lines <= 200, "worker/mod.rs is no facade: {lines} lines");
}
