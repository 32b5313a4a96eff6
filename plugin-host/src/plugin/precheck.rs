//! What a component declares, read before it is compiled: the `egress:provider` world and
//! version it exports, and the packages it imports.
//!
//! Compiling costs CPU time and memory that grow with the component (and, for some code,
//! with the square of its size: see `compiler.rs`), so a plugin that could never load (the
//! wrong world, a version this host does not support, an import nothing provides) is
//! refused here, by reading the top-level import and export sections only: the nested core
//! modules, where the code is, are skipped, not parsed. The linker still has the last word
//! on every import after the compile; this check only turns away what it would certainly
//! refuse.

use super::abi::WorldVersion;
use wasmparser::{Chunk, Parser, Payload};

/// The packages the host links (see `plugin::linker`); an import from any other package
/// (`wasi:sockets` above all) can never be satisfied.
const PROVIDED_PACKAGES: &[&str] = &[
    "wasi:io",
    "wasi:clocks",
    "wasi:random",
    "wasi:cli",
    "wasi:filesystem",
    "wasi:http",
    "egress:provider",
];

/// The WASI release the host links: an import of any `0.2.x` is served (wasmtime matches
/// semver-compatible versions), `0.3` or `1.0` would not be.
const WASI_VERSION_PREFIX: &str = "0.2.";

/// What a component declares at its top level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Why a component is refused before it is compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a well-formed component (what the parser said).
    Malformed(String),
    /// Exports neither `egress:provider/plugin` nor `egress:provider/provider`.
    NotAProvider,
    /// Exports the world at another version.
    Version(String),
    /// Imports an interface the host does not provide (the import's name).
    Import(String),
}

/// The top-level imports and exports of `bytes`, skipping nested modules and components.
pub fn declared(bytes: &[u8]) -> Result<Declared, String> {
    let mut parser = Parser::new(0);
    let mut data = bytes;
    let mut out = Declared::default();
    loop {
        let (payload, consumed) = match parser.parse(data, true).map_err(|e| e.to_string())? {
            Chunk::Parsed { payload, consumed } => (payload, consumed),
            Chunk::NeedMoreData(_) => unreachable!("parse at end of file never needs more"),
        };
        data = &data[consumed..];
        match payload {
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => {
                // The outer parser already counted these bytes; skip them unparsed.
                data = data
                    .get(unchecked_range.len()..)
                    .ok_or("a nested module runs past the end of the file")?;
            }
            Payload::ComponentImportSection(reader) => {
                for import in reader {
                    let import = import.map_err(|e| e.to_string())?;
                    out.imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(|e| e.to_string())?;
                    out.exports.push(export.name.name.to_string());
                }
            }
            Payload::End(_) => return Ok(out),
            _ => {}
        }
    }
}

impl Declared {
    /// The version of the `egress:provider` world the component exports, if any.
    pub fn world_version(&self) -> Option<String> {
        let mut plugin = None;
        let mut provider = None;
        for name in &self.exports {
            if let Some(v) = name.strip_prefix("egress:provider/plugin@") {
                plugin = Some(v.to_string());
            } else if let Some(v) = name.strip_prefix("egress:provider/provider@") {
                provider = Some(v.to_string());
            }
        }
        match (plugin, provider) {
            (Some(a), Some(b)) if a == b => Some(a),
            (Some(a), _) | (_, Some(a)) => Some(a),
            _ => None,
        }
    }

    /// An `egress:provider` interface imported at another version than `version`: a plugin
    /// imports the host interface of the world it exports, never another's.
    pub fn other_version_import(&self, version: WorldVersion) -> Option<&str> {
        let suffix = format!("@{version}");
        self.imports
            .iter()
            .find(|i| i.starts_with("egress:provider/") && !i.ends_with(&suffix))
            .map(String::as_str)
    }

    /// The first import the host certainly cannot provide.
    pub fn unprovided_import(&self) -> Option<&str> {
        self.imports
            .iter()
            .find(|name| !import_provided(name))
            .map(String::as_str)
    }
}

/// Whether the host links a package of this name and version (the interface itself is
/// checked by the linker, after the compile).
fn import_provided(name: &str) -> bool {
    let Some((package, rest)) = name.split_once('/') else {
        // A plain-named import (a function, a resource): the host provides none.
        return false;
    };
    let version = rest.split_once('@').map(|(_, v)| v);
    if !PROVIDED_PACKAGES.contains(&package) {
        return false;
    }
    match (package, version) {
        ("egress:provider", v) => v.and_then(WorldVersion::parse).is_some(),
        (_, Some(v)) => v.starts_with(WASI_VERSION_PREFIX),
        (_, None) => false,
    }
}

/// The checks before the compile: well-formed at the top level, the `egress:provider`
/// world at a version this host serves ([`WorldVersion`]), and nothing imported that the
/// host cannot provide. The world version on success.
pub fn check(bytes: &[u8]) -> Result<WorldVersion, Refusal> {
    let declared = declared(bytes).map_err(Refusal::Malformed)?;
    let found = declared.world_version().ok_or(Refusal::NotAProvider)?;
    let version = WorldVersion::parse(&found).ok_or(Refusal::Version(found))?;
    if let Some(other) = declared.other_version_import(version) {
        return Err(Refusal::Import(other.to_string()));
    }
    if let Some(name) = declared.unprovided_import() {
        return Err(Refusal::Import(name.to_string()));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared_with(imports: &[&str], exports: &[&str]) -> Declared {
        Declared {
            imports: imports.iter().map(|s| s.to_string()).collect(),
            exports: exports.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn world_version_and_imports() {
        let world = [
            "egress:provider/plugin@0.1.0",
            "egress:provider/provider@0.1.0",
        ];
        let ok = declared_with(
            &[
                "wasi:io/streams@0.2.3",
                "wasi:http/outgoing-handler@0.2.0",
                "egress:provider/host@0.1.0",
            ],
            &world,
        );
        assert_eq!(ok.world_version().as_deref(), Some("0.1.0"));
        assert_eq!(ok.unprovided_import(), None);
        for (import, refused) in [
            ("wasi:sockets/tcp@0.2.0", true),
            ("wasi:io/streams@0.3.0", true),
            ("wasi:io/streams", true),
            ("egress:provider/host@9.0.0", true),
            ("other:pkg/thing@0.2.0", true),
            ("log", true),
            ("wasi:cli/environment@0.2.6", false),
        ] {
            let d = declared_with(&[import], &world);
            assert_eq!(d.unprovided_import().is_some(), refused, "{import}");
        }
        assert_eq!(declared_with(&[], &["run"]).world_version(), None);
        assert_eq!(
            declared_with(&[], &["egress:provider/plugin@9.0.0"])
                .world_version()
                .as_deref(),
            Some("9.0.0")
        );
    }

    /// A component exports one version's world and imports that version's `host`; the
    /// other version's `host` (a plugin stitched from two SDKs) is refused before compiling.
    #[test]
    fn a_plugin_imports_the_host_of_its_own_version() {
        let world = |v: &str| {
            [
                format!("egress:provider/plugin@{v}"),
                format!("egress:provider/provider@{v}"),
            ]
        };
        for (exports, import, ok) in [
            ("0.1.0", "egress:provider/host@0.1.0", true),
            ("0.2.0", "egress:provider/host@0.2.0", true),
            ("0.2.0", "egress:provider/types@0.2.0", true),
            ("0.2.0", "egress:provider/host@0.1.0", false),
            ("0.1.0", "egress:provider/host@0.2.0", false),
        ] {
            let d = Declared {
                imports: vec![import.to_string()],
                exports: world(exports).to_vec(),
            };
            let version = WorldVersion::parse(&d.world_version().unwrap()).unwrap();
            let refused = d.other_version_import(version).or(d.unprovided_import());
            assert_eq!(
                refused.is_none(),
                ok,
                "{exports} importing {import}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_truncated_component_is_malformed() {
        // Header, then a module section that claims more bytes than there are.
        let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
        bytes.extend([1, 0x7f]);
        assert!(matches!(check(&bytes), Err(Refusal::Malformed(_))));
        // An empty component exports nothing.
        assert_eq!(check(b"\0asm\x0d\0\x01\0"), Err(Refusal::NotAProvider));
    }
}
