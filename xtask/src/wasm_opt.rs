//! Shrinking a built plugin with Binaryen's `wasm-opt -Oz`, when it is installed.
//!
//! Binaryen optimizes core modules, not components, so this walks the component's
//! top-level sections, runs `wasm-opt` on its largest core module (the plugin's code; the
//! others are the few-hundred-byte shims `wasm-component-ld` adds) and writes that section
//! back in place. Sections refer to each other by index, never by offset, so a module of a
//! new length is still the same component; wasm-opt keeps every import and export.
//! Measured on the three plugins of 2026-12: 13.5 to 14% smaller files, fewer functions to
//! compile at every operator start.

use anyhow::{Context, Result, bail, ensure};
use std::path::Path;
use std::process::Command;

/// The component preamble: `\0asm`, version 0x0d, layer 1.
const COMPONENT_PREAMBLE: [u8; 8] = [0, b'a', b's', b'm', 0x0d, 0, 1, 0];
/// A component's core module section.
const CORE_MODULE_SECTION: u8 = 1;
/// What rustc emits for wasm32-wasip2 and wasmtime accepts. Binaryen's `--all-features`
/// would also allow encodings (GC types) this wasmtime refuses to parse.
const FEATURES: &[&str] = &[
    "--enable-bulk-memory",
    "--enable-sign-ext",
    "--enable-mutable-globals",
    "--enable-nontrapping-float-to-int",
    "--enable-multivalue",
    "--enable-reference-types",
];

/// Whether `wasm-opt` can be run.
pub fn available() -> bool {
    Command::new("wasm-opt")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Rewrites the component at `path` with its largest core module optimized for size;
/// returns the sizes before and after. Keeps the file as it was when the result would not
/// be smaller.
pub fn shrink(path: &Path, scratch: &Path) -> Result<(u64, u64)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let sections =
        sections(&bytes).with_context(|| format!("{} is not a component", path.display()))?;
    let (index, module) = sections
        .iter()
        .enumerate()
        .filter(|(_, s)| s.id == CORE_MODULE_SECTION)
        .max_by_key(|(_, s)| s.body.len())
        .with_context(|| format!("{} holds no core module", path.display()))?;
    let input = scratch.join("core.wasm");
    let output = scratch.join("core-oz.wasm");
    std::fs::write(&input, module.body)?;
    let out = Command::new("wasm-opt")
        .arg("-Oz")
        .args(FEATURES)
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .context("running wasm-opt")?;
    if !out.status.success() {
        bail!(
            "wasm-opt -Oz failed on {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        );
    }
    let optimized = std::fs::read(&output)?;
    let rebuilt = splice(&sections, index, &optimized);
    let before = bytes.len() as u64;
    let after = rebuilt.len() as u64;
    if after < before {
        std::fs::write(path, &rebuilt).with_context(|| format!("writing {}", path.display()))?;
        Ok((before, after))
    } else {
        Ok((before, before))
    }
}

#[derive(Debug, PartialEq)]
struct Section<'a> {
    id: u8,
    body: &'a [u8],
}

/// The top-level sections of a component.
fn sections(bytes: &[u8]) -> Result<Vec<Section<'_>>> {
    ensure!(
        bytes.starts_with(&COMPONENT_PREAMBLE),
        "no component preamble"
    );
    let mut at = COMPONENT_PREAMBLE.len();
    let mut out = Vec::new();
    while at < bytes.len() {
        let id = bytes[at];
        let (len, next) = read_leb(bytes, at + 1)?;
        let end = next.checked_add(len).filter(|e| *e <= bytes.len());
        let Some(end) = end else {
            bail!("section {id} at byte {at} runs past the end");
        };
        out.push(Section {
            id,
            body: &bytes[next..end],
        });
        at = end;
    }
    Ok(out)
}

/// The component again, with section `index`'s body replaced by `body`.
fn splice(sections: &[Section<'_>], index: usize, body: &[u8]) -> Vec<u8> {
    let mut out = COMPONENT_PREAMBLE.to_vec();
    for (i, s) in sections.iter().enumerate() {
        let body = if i == index { body } else { s.body };
        out.push(s.id);
        write_leb(&mut out, body.len());
        out.extend_from_slice(body);
    }
    out
}

fn read_leb(bytes: &[u8], mut at: usize) -> Result<(usize, usize)> {
    let mut value: usize = 0;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(at).context("truncated LEB128")?;
        at += 1;
        value |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value, at));
        }
    }
    bail!("LEB128 longer than a u32")
}

fn write_leb(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(sections: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let parsed: Vec<Section> = sections
            .iter()
            .map(|(id, body)| Section { id: *id, body })
            .collect();
        splice(&parsed, usize::MAX, &[])
    }

    #[test]
    fn sections_round_trip_and_a_spliced_module_may_change_length() {
        let big = vec![7u8; 300];
        let bytes = component(&[(0, b"custom".to_vec()), (1, big.clone()), (1, vec![1, 2])]);
        let parsed = sections(&bytes).unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[1], Section { id: 1, body: &big });
        assert_eq!(splice(&parsed, usize::MAX, &[]), bytes);
        let smaller = splice(&parsed, 1, &[9; 100]);
        let again = sections(&smaller).unwrap();
        assert_eq!(again[1].body, &[9; 100][..]);
        assert_eq!(again[0], parsed[0]);
        assert_eq!(again[2], parsed[2]);
    }

    #[test]
    fn leb128_round_trips_across_byte_boundaries() {
        for n in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            305_602,
            u32::MAX as usize,
        ] {
            let mut out = Vec::new();
            write_leb(&mut out, n);
            assert_eq!(read_leb(&out, 0).unwrap(), (n, out.len()), "{n}");
        }
    }

    #[test]
    fn what_is_not_a_component_is_refused() {
        assert!(sections(b"\0asm\x01\0\0\0").is_err(), "a core module");
        let mut cut = component(&[(1, vec![0; 10])]);
        cut.truncate(cut.len() - 1);
        assert!(sections(&cut).is_err(), "a truncated section");
    }
}
