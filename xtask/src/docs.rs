//! Sections of a generated document that different commands own: `cargo xtask bench` and
//! `cargo xtask scale` each rewrite their own part of docs/benchmarks.md and keep the rest.
//! A section runs from `<!-- begin NAME -->` to `<!-- end NAME -->`.

use anyhow::{Context, Result};
use std::path::Path;

/// The head of docs/benchmarks.md when it has to be created.
pub const TITLE: &str = "# Benchmarks\n\nEach section is written by the command it names (release builds). Absolute figures move \
with machine load; compare the columns of one run, not runs.\n";

/// "on a 2-core machine, load average at the end: ...": what a figure was measured on.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "on a {cores}-core machine, load average at the end: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- begin {name} -->\n"),
        format!("<!-- end {name} -->\n"),
    )
}

/// The body of section `name` in `doc`, if it has one.
pub fn section<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let (begin, end) = markers(name);
    let start = doc.find(&begin)? + begin.len();
    let len = doc[start..].find(&end)?;
    Some(&doc[start..start + len])
}

/// `doc` with section `name`'s body replaced by `body` (appended when it has none).
pub fn replace_section(doc: &str, name: &str, body: &str) -> String {
    let (begin, end) = markers(name);
    let body = if body.ends_with('\n') {
        body.to_string()
    } else {
        format!("{body}\n")
    };
    match (doc.find(&begin), doc.find(&end)) {
        (Some(b), Some(e)) if b < e => format!(
            "{}{begin}{body}{}",
            &doc[..b],
            &doc[e..] // starts with the end marker
        ),
        _ => {
            let sep = if doc.is_empty() || doc.ends_with("\n\n") {
                ""
            } else if doc.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{doc}{sep}{begin}{body}{end}")
        }
    }
}

/// Rewrites section `name` of the file at `path` (created with `title` when missing).
pub fn update_file(path: &Path, title: &str, name: &str, body: &str) -> Result<()> {
    let doc = match std::fs::read_to_string(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!("{title}\n"),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    std::fs::write(path, replace_section(&doc, name, body))
        .with_context(|| format!("writing {}", path.display()))
}

/// A keyed block inside a section (one run of a benchmark), between `<!-- run KEY -->`
/// and `<!-- end run -->`, with a blank line after.
pub fn run_block(key: &str, body: &str) -> String {
    let body = body.trim_end();
    format!("\n<!-- run {key} -->\n{body}\n<!-- end run -->\n")
}

/// The keyed blocks of a section body, in order: `(key, body)`.
pub fn runs(section: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = section;
    while let Some(start) = rest.find("<!-- run ") {
        let after = &rest[start + "<!-- run ".len()..];
        let Some(key_end) = after.find(" -->\n") else {
            break;
        };
        let key = after[..key_end].to_string();
        let body_start = key_end + " -->\n".len();
        let Some(len) = after[body_start..].find("<!-- end run -->") else {
            break;
        };
        out.push((key, after[body_start..body_start + len].to_string()));
        rest = &after[body_start + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_replaced_in_place_or_appended() {
        let doc = "# T\n\nintro\n";
        let one = replace_section(doc, "a", "A1");
        assert_eq!(
            one,
            "# T\n\nintro\n\n<!-- begin a -->\nA1\n<!-- end a -->\n"
        );
        let two = replace_section(&one, "b", "B1\n");
        let again = replace_section(&two, "a", "A2\n");
        assert_eq!(
            again,
            "# T\n\nintro\n\n<!-- begin a -->\nA2\n<!-- end a -->\n\n<!-- begin b -->\nB1\n<!-- end b -->\n"
        );
        assert_eq!(section(&again, "b"), Some("B1\n"));
        assert_eq!(section(&again, "c"), None);
    }

    #[test]
    fn run_blocks_round_trip() {
        let body = format!(
            "intro\n{}{}",
            run_block("a-1", "A\n"),
            run_block("b-2", "B")
        );
        assert_eq!(
            runs(&body),
            vec![("a-1".into(), "A\n".into()), ("b-2".into(), "B\n".into())]
        );
        assert!(runs("intro only").is_empty());
    }
}
