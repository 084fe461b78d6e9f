//! The suite's own hygiene, checked on the source: it must pass on a server that other clients
//! (another durable-etl, other test runs) use at the same time, so every look at a server-wide
//! view (`pg_locks`, `pg_stat_activity`) is scoped to the looking test's own database.

use std::path::Path;

/// The server-wide views whose rows belong to every database of the server.
const SERVER_WIDE: &[&str] = &["pg_locks", "pg_stat_activity"];

/// What scopes a statement to one database: the session's own, or one the test names.
const SCOPES: &[&str] = &["current_database()", "datname = $", "datname = '{"];

/// The contents of every plain string literal of `code` (comments skipped): where SQL lives.
fn string_literals(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let (mut literals, mut i) = (Vec::new(), 0);
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('/', Some('/')) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            // A character literal such as '"' holds no SQL.
            ('\'', Some('"')) => i += 3,
            ('"', _) => {
                let mut literal = String::new();
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    literal.extend(chars.get(i));
                    i += 1;
                }
                literals.push(literal);
                i += 1;
            }
            _ => i += 1,
        }
    }
    literals
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_literal_reader_sees_strings_and_skips_comments() {
    let code = "// \"not this\"\nlet c = '\"'; let s = \"a \\\"b\\\" c\"; f(\"d\");";
    assert_eq!(string_literals(code), ["a \"b\" c", "d"]);
}

#[test]
fn every_look_at_a_server_wide_view_is_scoped_to_one_database() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    let this = Path::new(file!()).file_name().unwrap();
    let mut unscoped = Vec::new();
    for file in files.iter().filter(|f| f.file_name() != Some(this)) {
        let code = std::fs::read_to_string(file).unwrap();
        for literal in string_literals(&code) {
            let looks = SERVER_WIDE.iter().any(|view| literal.contains(view));
            if looks && !SCOPES.iter().any(|scope| literal.contains(scope)) {
                let relative = file.strip_prefix(root).unwrap().display().to_string();
                unscoped.push(format!("{relative}: {}", literal.trim()));
            }
        }
    }
    assert!(
        unscoped.is_empty(),
        "statements that see other databases' backends or locks (filter by \
         datname = current_database(), or by the locks' database):\n{}",
        unscoped.join("\n")
    );
}
