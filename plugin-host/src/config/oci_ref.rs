//! `oci://registry/repository[:tag][@sha256:digest]`: a plugin kept in an OCI registry.
//!
//! Parsed strictly, following the distribution specification's grammar for repository
//! names, tags and digests: whatever passes is safe to put in a URL path and a file name,
//! and nothing is guessed (no implicit `latest`, no implicit registry: an entry names
//! exactly what it runs). Only `sha256` digests: the registry, the cache and the
//! signatures all address content by it.

use std::fmt;

/// A parsed `oci://` plugin reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OciRef {
    /// `host` or `host:port` (the registry's address, spoken to over HTTPS).
    pub registry: String,
    /// `egress/hetzner`: lowercase path components.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>` of the manifest. When both are given the digest wins; the tag
    /// is only a label.
    pub digest: Option<String>,
}

pub const SCHEME: &str = "oci://";

/// Longest reference accepted (the distribution spec caps a repository name at 255).
pub const MAX_LEN: usize = 512;

/// Why a reference was refused; the caller names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OciRefError {
    #[error("longer than {MAX_LEN} characters")]
    TooLong,
    #[error("does not start with oci://")]
    Scheme,
    #[error("has no repository after the registry (oci://registry/repository@sha256:...)")]
    NoRepository,
    #[error("registry {0:?} is not a host name or IP address with an optional port")]
    Registry(String),
    #[error(
        "repository {0:?} is not lowercase letters and digits separated by '.', '_', '__', '-' or '/'"
    )]
    Repository(String),
    #[error(
        "tag {0:?} is not 1 to 128 letters, digits, '_', '.' or '-' (not starting with '.' or '-')"
    )]
    Tag(String),
    #[error("digest {0:?} is not sha256: followed by 64 lowercase hex digits")]
    Digest(String),
    #[error(
        "names neither a tag nor a digest: add @sha256:... (or :tag, resolved once and pinned)"
    )]
    Unpinned,
}

impl OciRef {
    /// Whether a providers-file `plugin` value is meant as a registry reference.
    pub fn is_oci(plugin: &str) -> bool {
        plugin.starts_with(SCHEME)
    }

    pub fn parse(s: &str) -> Result<Self, OciRefError> {
        if s.len() > MAX_LEN {
            return Err(OciRefError::TooLong);
        }
        let rest = s.strip_prefix(SCHEME).ok_or(OciRefError::Scheme)?;
        let (rest, digest) = match rest.split_once('@') {
            Some((r, d)) => {
                if !is_digest(d) {
                    return Err(OciRefError::Digest(d.into()));
                }
                (r, Some(d.to_string()))
            }
            None => (rest, None),
        };
        let (registry, path) = rest.split_once('/').ok_or(OciRefError::NoRepository)?;
        if !is_registry(registry) {
            return Err(OciRefError::Registry(registry.into()));
        }
        // A ':' in the last path component starts the tag (the registry's port is before
        // the first '/').
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t)),
            _ => (path, None),
        };
        if repository.is_empty() {
            return Err(OciRefError::NoRepository);
        }
        if !is_repository(repository) {
            return Err(OciRefError::Repository(repository.into()));
        }
        if let Some(t) = tag
            && !is_tag(t)
        {
            return Err(OciRefError::Tag(t.into()));
        }
        if tag.is_none() && digest.is_none() {
            return Err(OciRefError::Unpinned);
        }
        Ok(OciRef {
            registry: registry.into(),
            repository: repository.into(),
            tag: tag.map(String::from),
            digest,
        })
    }

    /// `oci://registry/repository`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{SCHEME}{}/{}", self.registry, self.repository)
    }

    /// The same reference pinned to `digest` (the tag kept as a label).
    pub fn pinned(&self, digest: &str) -> OciRef {
        OciRef {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// `sha256:` and 64 lowercase hex digits.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn is_registry(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        // `[::1]:5000`
        Some((h, p)) if !h.is_empty() && (!h.starts_with('[') || h.ends_with(']')) => (h, Some(p)),
        _ => (s, None),
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6.parse::<std::net::Ipv6Addr>().is_ok();
    }
    crate::policy::valid_dns_name(host)
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`, at most 255.
fn is_repository(s: &str) -> bool {
    s.len() <= 255 && s.split('/').all(is_path_component)
}

fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__', or any number of '-'.
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&x| x.is_ascii_alphanumeric() || matches!(x, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_parse_into_their_parts() {
        let r = OciRef::parse(&format!("oci://127.0.0.1:5000/egress/hetzner@{D}")).unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "egress/hetzner");
        assert_eq!((r.tag.as_deref(), r.digest.as_deref()), (None, Some(D)));
        let r = OciRef::parse("oci://ghcr.io/acme/plugins/my-cloud:v1.2.0").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("ghcr.io", "acme/plugins/my-cloud", Some("v1.2.0"))
        );
        let r = OciRef::parse(&format!("oci://[::1]:5000/a__b.c--d:t@{D}")).unwrap();
        assert_eq!(r.registry, "[::1]:5000");
        assert_eq!(r.repository, "a__b.c--d");
        assert_eq!(r.to_string(), format!("oci://[::1]:5000/a__b.c--d:t@{D}"));
        assert_eq!(
            r.pinned("sha256:x").to_string(),
            "oci://[::1]:5000/a__b.c--d:t@sha256:x"
        );
    }

    #[test]
    fn bad_references_are_refused_with_the_part_named() {
        let long = format!("oci://r/{}:t", "a".repeat(600));
        let cases: &[(&str, OciRefError)] = &[
            ("hetzner.wasm", OciRefError::Scheme),
            ("oci://registry", OciRefError::NoRepository),
            ("oci://registry/", OciRefError::NoRepository),
            ("oci://registry/repo", OciRefError::Unpinned),
            (
                "oci://registry/Repo:v1",
                OciRefError::Repository("Repo".into()),
            ),
            (
                "oci://registry/a/../b:v1",
                OciRefError::Repository("a/../b".into()),
            ),
            (
                "oci://registry/a//b:v1",
                OciRefError::Repository("a//b".into()),
            ),
            (
                "oci://registry/a___b:v1",
                OciRefError::Repository("a___b".into()),
            ),
            ("oci://registry/a:.v1", OciRefError::Tag(".v1".into())),
            ("oci://registry/a:", OciRefError::Tag("".into())),
            (
                "oci://registry/a@sha256:ABC",
                OciRefError::Digest("sha256:ABC".into()),
            ),
            (
                "oci://registry/a@sha512:00",
                OciRefError::Digest("sha512:00".into()),
            ),
            (
                "oci://user:pw@registry/a:v1",
                OciRefError::Digest("registry/a:v1".into()),
            ),
            (
                "oci://reg_istry/a:v1",
                OciRefError::Registry("reg_istry".into()),
            ),
            (
                "oci://registry:99999x/a:v1",
                OciRefError::Registry("registry:99999x".into()),
            ),
            ("oci://[zz]:1/a:v1", OciRefError::Registry("[zz]:1".into())),
            (&long, OciRefError::TooLong),
        ];
        for (input, want) in cases {
            assert_eq!(OciRef::parse(input).as_ref(), Err(want), "{input}");
        }
    }
}
