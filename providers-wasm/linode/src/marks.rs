//! Tags and provider IDs: the identity of a Linode as the operator sees it.
//!
//! Linode has tags, not key/value labels: plain strings of 3 to 50 characters. The
//! contract's marks (`egress.proxy-operator.dev/uid=<uid>` is 66 characters with a UUID)
//! do not fit, so each mark is a short prefixed tag: `egress-managed`, `egress-uid:<uid>`
//! (47 characters with a UUID) and `egress-inst:<installation>`. Tags are filterable
//! (`X-Filter: {"tags": ...}`), so GC's list is filtered server-side.

use data_encoding::BASE32_NOPAD;
use egress_guest_sdk::ProviderError;
use egress_guest_sdk::id::{IdFormat, is_decimal_id};
use sha2::{Digest, Sha256};

/// The managed mark (`egress.proxy-operator.dev/managed=true`).
pub const TAG_MANAGED: &str = "egress-managed";
/// Prefix of the uid mark; the rest of the tag is the Proxy's UID.
pub const TAG_UID: &str = "egress-uid:";
/// Prefix of the installation mark; the rest is [`installation_value`].
pub const TAG_INSTALLATION: &str = "egress-inst:";
/// Linode's longest tag.
const TAG_MAX: usize = 50;
/// Prefix of a hashed installation value.
const HASHED_PREFIX: &str = "sha256-";

/// Whether `s` can follow a prefix in a tag as it is: lowercase (so a tag reads back the
/// same whatever case rules the backend applies) and short enough for [`TAG_MAX`].
fn is_tag_value(s: &str, prefix: &str) -> bool {
    s.len() + prefix.len() <= TAG_MAX
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_'))
}

/// The tag value that stands for an installation identity: verbatim when it fits, else
/// `sha256-` plus 24 lowercase base32 characters (120 bits) of its SHA-256, so the same
/// installation always maps to the same tag and GC finds exactly its Linodes.
pub fn installation_value(installation: &str) -> String {
    if !installation.is_empty() && is_tag_value(installation, TAG_INSTALLATION) {
        return installation.to_string();
    }
    let digest = Sha256::digest(installation.as_bytes());
    format!("{HASHED_PREFIX}{}", BASE32_NOPAD.encode(&digest[..15]).to_ascii_lowercase())
}

/// The tags a Linode is created with, all in the create call, so no unmarked Linode ever
/// exists. A UID that cannot be a tag is permanent (Kubernetes UIDs always fit).
pub fn create_tags(uid: &str, installation: &str) -> Result<Vec<String>, ProviderError> {
    if !is_tag_value(uid, TAG_UID) {
        let msg = format!("uid {uid:?} cannot be stored in a Linode tag (at most 39 of [a-z0-9._-])");
        return Err(ProviderError::permanent(msg).with_code("InvalidUid"));
    }
    let inst = format!("{TAG_INSTALLATION}{}", installation_value(installation));
    Ok(vec![TAG_MANAGED.to_string(), format!("{TAG_UID}{uid}"), inst])
}

/// The uid mark of a Linode: `""` when it has none (GC then lists it with an empty uid
/// and never deletes it).
pub fn uid_of(tags: &[String]) -> &str {
    tags.iter().find_map(|t| t.strip_prefix(TAG_UID)).unwrap_or_default()
}

/// Whether a listed Linode carries the managed mark and this installation's mark; checked
/// again on the client so a backend (or proxy) that ignored the filter cannot hand GC
/// someone else's Linodes.
pub fn is_gc_match(tags: &[String], installation: &str) -> bool {
    let inst = format!("{TAG_INSTALLATION}{}", installation_value(installation));
    tags.iter().any(|t| t == TAG_MANAGED) && tags.contains(&inst)
}

/// The `X-Filter` of GC's list: managed Linodes of one installation.
pub fn gc_filter(installation: &str) -> String {
    let inst = format!("{TAG_INSTALLATION}{}", installation_value(installation));
    serde_json::json!({"+and": [{"tags": TAG_MANAGED}, {"tags": inst}]}).to_string()
}

/// `<region>/<linode id>`. Linode IDs are global; the region is there so an ID read in a
/// Proxy's status says where it runs.
pub const ID: IdFormat = IdFormat {
    shape: "<region>/<linode id>, e.g. us-east/12345678",
    scope: crate::config::is_region,
    key: is_decimal_id,
};

/// Parse a provider ID strictly: a malformed one is permanent, never a lookup of
/// something else.
pub fn parse_id(id: &str) -> Result<(&str, u64), ProviderError> {
    let (region, num) = ID.parse(id)?;
    let n = num.parse().map_err(|_| ProviderError::invalid_id(id, ID.shape))?;
    Ok((region, n))
}
