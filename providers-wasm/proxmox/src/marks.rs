//! The identity of a VM as the operator sees it: provider IDs, and the marks in tags and in the description.
//!
//! Proxmox tags take `[a-z0-9_][a-z0-9_+.-]*` (case-insensitive) and are `;`-separated, so a mark is a tag
//! `egress.<name>.<value>`: `egress.managed`, `egress.uid.<uid>`, `egress.inst.<installation>` and
//! `egress.created.<unix seconds>`. Values keep lowercase letters, digits and `-`; every other byte is `_` plus two
//! hex digits, so they read back exactly (`cluster/Prod` is `cluster_2f_50rod`). An installation longer than 100
//! characters once escaped is matched by `__` plus 32 base32 characters of its SHA-256. The cluster resource list
//! carries tags, so the plugin finds and reads marks without opening each VM's config.
//!
//! The clone call cannot set tags, but it sets the description: the full marks are written there, one
//! `egress.proxy-operator.dev/<key>=<value>` line each, in the call that creates the VM, and later the UPID of the
//! start task (`start-task`), which tells a VM that was never started from one that stopped since.

use egress_guest_sdk::id::{is_decimal_id, is_word};
use egress_guest_sdk::{MARK_INSTALLATION, MARK_MANAGED, MARK_PREFIX, MARK_UID, ProviderError};
use sha2::{Digest, Sha256};
use std::fmt::Write;

const MANAGED: &str = "egress.managed";
const UID: &str = "egress.uid.";
const INST: &str = "egress.inst.";
const CREATED: &str = "egress.created.";
const CREATED_AT: &str = "created-at";
const START: &str = "start-task";

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
        match b {
            b'_' => {
                let hex = tail.get(..2).filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                rest = &tail[2..];
            }
            b'a'..=b'z' | b'0'..=b'9' | b'-' => out.push(b),
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// The tag value GC matches the installation by: escaped, or hashed when too long for a readable tag.
pub fn installation_value(installation: &str) -> String {
    let v = escape(installation);
    if v.len() <= 100 {
        return v;
    }
    let digest = Sha256::digest(installation.as_bytes());
    format!("__{}", data_encoding::BASE32_NOPAD.encode(&digest[..20]).to_ascii_lowercase())
}

/// The marks of one VM, from its tags or its description.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Marks {
    pub managed: bool,
    /// `None`: no uid mark at all (listed as `""`).
    pub uid: Option<String>,
    /// As the tag holds it ([`installation_value`]); from the description, the installation itself.
    pub installation: Option<String>,
    pub created: Option<u64>,
    /// The UPID of the start task; only in the description.
    pub start: Option<String>,
}

/// A VM's tags (`a;b;c`, also `,` or space separated on input) split into tags.
pub fn split(tags: &str) -> impl Iterator<Item = &str> {
    tags.split([';', ',', ' ']).filter(|t| !t.is_empty())
}

/// The marks a VM's tags carry. A malformed mark tag counts as absent.
pub fn from_tags(tags: &str) -> Marks {
    let mut m = Marks::default();
    for t in split(tags).map(str::to_ascii_lowercase) {
        if t == MANAGED {
            m.managed = true;
        } else if let Some(v) = t.strip_prefix(UID) {
            m.uid = unescape(v);
        } else if let Some(v) = t.strip_prefix(INST) {
            m.installation = Some(v.to_string());
        } else if let Some(v) = t.strip_prefix(CREATED) {
            m.created = v.parse().ok();
        }
    }
    m
}

/// The tags of a managed VM: the marks, then the VM's other tags as they were (the template's, a user's), minus
/// old marks.
pub fn tags(uid: &str, installation: &str, created: u64, existing: &str) -> String {
    let marks =
        [MANAGED.to_string(), format!("{UID}{}", escape(uid)), format!("{INST}{}", installation_value(installation))];
    let others = split(existing).filter(|t| !t.to_ascii_lowercase().starts_with("egress."));
    let all: Vec<String> =
        marks.into_iter().chain([format!("{CREATED}{created}")]).chain(others.map(str::to_string)).collect();
    all.join(";")
}

/// The description of a managed VM: the full marks, readable, one per line.
pub fn description(uid: &str, installation: &str, created: u64, start: Option<&str>) -> String {
    let mut d = String::from("Egress proxy managed by proxy-operator. Do not edit the lines below.\n");
    let _ = writeln!(d, "{MARK_MANAGED}=true\n{MARK_UID}={uid}\n{MARK_INSTALLATION}={installation}");
    let _ = writeln!(d, "{MARK_PREFIX}{CREATED_AT}={created}");
    if let Some(upid) = start {
        let _ = writeln!(d, "{MARK_PREFIX}{START}={upid}");
    }
    d
}

/// The marks a description carries (unknown lines ignored).
pub fn from_description(text: &str) -> Marks {
    let mut m = Marks::default();
    for (key, value) in text.lines().filter_map(|l| l.trim_end_matches('\r').split_once('=')) {
        let value = value.to_string();
        match key.strip_prefix(MARK_PREFIX) {
            _ if key == MARK_MANAGED => m.managed = value == "true",
            _ if key == MARK_UID => m.uid = Some(value),
            _ if key == MARK_INSTALLATION => m.installation = Some(value),
            Some(CREATED_AT) => m.created = value.parse().ok(),
            Some(START) => m.start = Some(value),
            _ => {}
        }
    }
    m
}

/// A provider ID: `<vmid>/<name>`. The VMID addresses the VM anywhere in the cluster (the node is looked up, so a
/// migrated VM is still found); the name tells our VM from a later one that reused the VMID.
pub const SHAPE: &str = "<vmid>/<vm name>, e.g. 912345/proxy-abc";

pub struct Id<'a> {
    pub vmid: u32,
    pub name: &'a str,
}

/// A VM name Proxmox takes (`dns-name`): letters, digits, `-` and `.`, starting and ending with a letter or digit.
pub fn is_vm_name(s: &str) -> bool {
    is_word(s, 63, b"-.") && !s.starts_with(['-', '.']) && !s.ends_with(['-', '.']) && !s.contains("..")
}

impl Id<'_> {
    pub fn parse(id: &str) -> Result<Id<'_>, ProviderError> {
        let parsed = id.split_once('/').and_then(|(vmid, name)| {
            let vmid =
                Some(vmid).filter(|v| is_decimal_id(v))?.parse().ok().filter(|v| (100..1_000_000_000).contains(v))?;
            is_vm_name(name).then_some(Id { vmid, name })
        });
        parsed.ok_or_else(|| ProviderError::invalid_id(id, SHAPE))
    }
}

impl std::fmt::Display for Id<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.vmid, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_fit_proxmox_and_read_back() {
        let long = "x/".repeat(100);
        for (uid, inst) in
            [("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01", "inst"), ("UID/Up:x_1", "cluster/Prod"), ("", long.as_str())]
        {
            let t = tags(uid, inst, 1_733_132_400, "web;egress.uid.old;Prod+1");
            for tag in split(&t) {
                let ok = |b: u8| b.is_ascii_alphanumeric() || b"_+.-".contains(&b);
                assert!(tag.bytes().all(ok) && !tag.starts_with(['-', '+', '.']), "{tag}");
            }
            assert!(t.ends_with(";web;Prod+1") && !t.contains("egress.uid.old"), "{t}");
            let m = from_tags(&t);
            assert_eq!((m.managed, m.uid.as_deref(), m.created), (true, Some(uid), Some(1_733_132_400)));
            assert_eq!(m.installation, Some(installation_value(inst)));
            let d =
                from_description(&description(uid, inst, 7, Some("UPID:pve1:0000A:0000B:0000C:qmstart:100:u@pam:")));
            assert_eq!((d.managed, d.uid.as_deref(), d.installation.as_deref()), (true, Some(uid), Some(inst)));
            assert_eq!(
                (d.created, d.start.as_deref()),
                (Some(7), Some("UPID:pve1:0000A:0000B:0000C:qmstart:100:u@pam:"))
            );
        }
        assert_eq!(
            tags("u-1", "cluster/Prod", 5, ""),
            "egress.managed;egress.uid.u-1;egress.inst.cluster_2f_50rod;egress.created.5"
        );
        // A fixed vector: changing the mapping would orphan every VM made under it.
        assert_eq!(installation_value(&long), "__fpopsbjmy5mwua65ni7zs3kpoid2dt3a");
        assert_eq!(
            from_tags("EGRESS.UID.A_2Fb,egress.created.x web"),
            Marks { uid: Some("a/b".into()), ..Marks::default() }
        );
        assert_eq!(from_tags("egress.uid.a_zz;egress.uid.a_2").uid, None);
        assert_eq!(from_description("egress.proxy-operator.dev/managed=yes\nnoise"), Marks::default());
    }

    #[test]
    fn ids_are_parsed_strictly() {
        let id = Id::parse("912345/proxy-abc").unwrap();
        assert_eq!((id.vmid, id.name, id.to_string().as_str()), (912345, "proxy-abc", "912345/proxy-abc"));
        for bad in [
            "",
            "/",
            "proxy-abc",
            "912345",
            "912345/",
            "0912345/x",
            "99/x",
            "1000000000/x",
            "1/2/3",
            "9000/-x",
            "9000/x..y",
            "9000/../x",
            "9000/a b",
            "9000/x\n",
            "-1/x",
        ] {
            assert_eq!(Id::parse(bad).err().unwrap().code.as_deref(), Some("InvalidId"), "{bad:?}");
        }
    }
}
