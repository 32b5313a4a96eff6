//! Labels and provider IDs: the identity of a VM instance as the operator sees it.
//!
//! GCE labels are key/value pairs; keys and values take lowercase letters, digits, `_` and `-`, at most 63 characters
//! (keys start with a letter). The marks become the keys `egress-managed`, `egress-uid` and `egress-installation`;
//! a value keeps lowercase letters, digits and `-`, and every other byte becomes `_` plus two lowercase hex digits, so
//! it reads back exactly. An installation too long for a label is matched by `__` plus 32 base32 characters of its
//! SHA-256 (`__` never comes out of the escaping). A UID too long is refused: Kubernetes UIDs are 36-character UUIDs.

use crate::config::{is_name, is_project, is_zone};
use egress_guest_sdk::ProviderError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write;

pub const MANAGED: &str = "egress-managed";
pub const UID: &str = "egress-uid";
pub const INSTALLATION: &str = "egress-installation";
const MAX: usize = 63;

fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'0'..=b'9' | b'-' => out.push(b as char),
            _ => drop(write!(out, "_{b:02x}")),
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let (mut out, mut rest) = (Vec::new(), s.as_bytes());
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        if b == b'_' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok().filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// The label value GC matches the installation by: escaped, or hashed when too long.
pub fn installation(installation: &str) -> String {
    let v = escape(installation);
    if v.len() <= MAX {
        return v;
    }
    let digest = Sha256::digest(installation.as_bytes());
    format!("__{}", data_encoding::BASE32_NOPAD.encode(&digest[..20]).to_ascii_lowercase())
}

/// The labels an instance is created with.
pub fn create_labels(uid: &str, inst: &str) -> Result<BTreeMap<&'static str, String>, ProviderError> {
    let uid_value = escape(uid);
    if uid_value.len() > MAX {
        let msg = format!("uid {uid:?} does not fit in a GCE label value (63 characters once escaped)");
        return Err(ProviderError::permanent(msg).with_code("InvalidUid"));
    }
    Ok(BTreeMap::from([(MANAGED, "true".to_string()), (UID, uid_value), (INSTALLATION, installation(inst))]))
}

/// The UID mark read back, `""` when the instance has none (or an unreadable one).
pub fn uid(labels: &BTreeMap<String, String>) -> String {
    labels.get(UID).and_then(|v| unescape(v)).unwrap_or_default()
}

/// Whether a listed instance is managed by this installation: checked on every listed instance, so a filter the API
/// ignored cannot hand GC another installation's.
pub fn is_gc_match(labels: &BTreeMap<String, String>, inst: &str) -> bool {
    labels.get(MANAGED).is_some_and(|v| v == "true") && labels.get(INSTALLATION) == Some(&installation(inst))
}

/// `instances.aggregatedList`'s filter for this installation's instances.
pub fn filter(inst: &str) -> String {
    format!("(labels.{MANAGED} = \"true\") (labels.{INSTALLATION} = \"{}\")", installation(inst))
}

/// A provider ID: `<project>/<zone>/<instance name>`. GCE addresses an instance by project, zone and name, so the ID
/// is all `get` and `delete` need, whatever the config says later.
pub const SHAPE: &str = "<project>/<zone>/<instance name>, e.g. my-project/europe-west1-b/proxy-abc";

pub struct Id<'a> {
    pub project: &'a str,
    pub zone: &'a str,
    pub name: &'a str,
}

impl Id<'_> {
    pub fn parse(id: &str) -> Result<Id<'_>, ProviderError> {
        match id.split('/').collect::<Vec<_>>()[..] {
            [project, zone, name] if is_project(project) && is_zone(zone) && is_name(name, 63) => {
                Ok(Id { project, zone, name })
            }
            _ => Err(ProviderError::invalid_id(id, SHAPE)),
        }
    }

    /// The instance's path below the API base.
    pub fn path(&self) -> String {
        format!("/projects/{}/zones/{}/instances/{}", self.project, self.zone, self.name)
    }
}

impl std::fmt::Display for Id<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.project, self.zone, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &BTreeMap<&str, String>) -> BTreeMap<String, String> {
        l.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn labels_fit_gce_and_read_back() {
        let long = "x/".repeat(100);
        for (uid, inst) in
            [("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01", "inst"), ("UID/Up:x_1", "cluster/Prod"), ("u", long.as_str())]
        {
            let l = create_labels(uid, inst).unwrap();
            for (k, v) in &l {
                assert!(is_name(k, 63) && v.len() <= 63, "{k}={v}");
                assert!(v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_".contains(&b)), "{v}");
            }
            let read = labels(&l);
            assert_eq!(uid_of(&read), uid);
            assert!(is_gc_match(&read, inst) && !is_gc_match(&read, "other"));
            assert!(filter(inst).contains(&format!("(labels.egress-installation = \"{}\")", l[INSTALLATION])));
        }
        let l = create_labels("u-1", "cluster/Prod").unwrap();
        assert_eq!((l[UID].as_str(), l[INSTALLATION].as_str()), ("u-1", "cluster_2f_50rod"));
        // A fixed vector: changing the mapping would orphan every instance made under it.
        assert_eq!(installation(&long), "__fpopsbjmy5mwua65ni7zs3kpoid2dt3a");
        let mut unmanaged = labels(&l);
        unmanaged.remove(MANAGED);
        assert!(!is_gc_match(&unmanaged, "cluster/Prod"));
        assert_eq!(uid_of(&BTreeMap::new()), "");
        let e = create_labels(&"u/".repeat(20), "i").unwrap_err();
        assert_eq!(e.code.as_deref(), Some("InvalidUid"));
    }

    fn uid_of(l: &BTreeMap<String, String>) -> String {
        uid(l)
    }

    #[test]
    fn ids_are_parsed_strictly() {
        let id = Id::parse("my-project/europe-west1-b/proxy-abc").unwrap();
        assert_eq!((id.project, id.zone, id.name), ("my-project", "europe-west1-b", "proxy-abc"));
        assert_eq!(id.to_string(), "my-project/europe-west1-b/proxy-abc");
        assert_eq!(id.path(), "/projects/my-project/zones/europe-west1-b/instances/proxy-abc");
        for bad in [
            "",
            "proxy-abc",
            "europe-west1-b/proxy-abc",
            "my-project/europe-west1-b/proxy-abc/x",
            "my-project/europe-west1/proxy-abc",
            "my-project/europe-west1-b/Proxy",
            "my-project/europe-west1-b/..",
            "../europe-west1-b/proxy-abc",
            "my-project/europe-west1-b/proxy-\n",
        ] {
            assert_eq!(Id::parse(bad).err().unwrap().code.as_deref(), Some("InvalidId"), "{bad:?}");
        }
    }
}
