//! Tags and provider IDs: the identity of a Droplet as the operator sees it.
//!
//! DigitalOcean tags are plain strings of `[A-Za-z0-9:_-]`, 1 to 255 characters, compared without regard to case. The
//! marks are key/value pairs, so each becomes one tag through the SDK's [`TagScheme`] (`egress:uid:<escaped UID>`,
//! module docs of `egress_guest_sdk::tags`): lowercase only, within the charset, and read back exactly.

use egress_guest_sdk::id::{IdFormat, is_decimal_id};
use egress_guest_sdk::tags::{TagScheme, has};
use egress_guest_sdk::{MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_UID, ProviderError};

pub const TAGS: TagScheme = TagScheme { prefix: "egress:", max_len: 255 };

/// Whether DigitalOcean accepts `s` as a tag name (`^[a-zA-Z0-9_\-\:]+$`, at most 255).
pub fn is_tag(s: &str) -> bool {
    (1..=255).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'_'))
}

/// The tag GC lists by (`tag_name`): the installation, verbatim or hashed when too long.
pub fn installation_tag(installation: &str) -> String {
    TAGS.matching(MARK_INSTALLATION, installation)
}

/// The tag every managed Droplet carries.
pub fn managed_tag() -> String {
    TAGS.matching(MARK_MANAGED, MARK_MANAGED_YES)
}

/// The UID mark's value, `""` when the Droplet has none.
pub fn uid(tags: &[String]) -> String {
    TAGS.value(tags, MARK_UID).unwrap_or_default()
}

/// Whether a listed Droplet is managed by this installation: checked on every Droplet of a list, so a backend (or
/// proxy) that ignored `tag_name` cannot hand GC another one's.
pub fn is_gc_match(tags: &[String], installation: &str) -> bool {
    has(tags, &managed_tag()) && has(tags, &installation_tag(installation))
}

/// The tags a Droplet is created with: the three marks, then the config's own.
pub fn create_tags(uid: &str, installation: &str, extra: &[String]) -> Result<Vec<String>, ProviderError> {
    let Some(uid_tag) = TAGS.encode(MARK_UID, uid) else {
        let msg = format!("uid {uid:?} does not fit in a DigitalOcean tag (255 characters once escaped)");
        return Err(ProviderError::permanent(msg).with_code("InvalidUid"));
    };
    let mut tags = vec![managed_tag(), uid_tag, installation_tag(installation)];
    tags.extend(extra.iter().cloned());
    Ok(tags)
}

/// `<region>/<droplet id>`. Droplet IDs are global; the region says where it runs, and the ID keeps working when the
/// region leaves the config.
pub const ID: IdFormat =
    IdFormat { shape: "<region>/<droplet id>, e.g. nyc3/3164444", scope: crate::config::is_region, key: is_decimal_id };

/// The region and Droplet ID of a provider ID; malformed is permanent `InvalidId`.
pub fn parse_id(id: &str) -> Result<(&str, u64), ProviderError> {
    let (region, key) = ID.parse(id)?;
    Ok((region, key.parse().map_err(|_| ProviderError::invalid_id(id, ID.shape))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_fit_digitalocean_and_carry_the_marks() {
        let long = "x/".repeat(100);
        for inst in ["inst", "cluster/Prod:eu west", long.as_str()] {
            let tags = create_tags("3f1c2a4e-7B1D/x", inst, &["fw:proxies".into()]).unwrap();
            assert!(tags.iter().all(|t| is_tag(t)), "{tags:?}");
            assert_eq!(uid(&tags), "3f1c2a4e-7B1D/x");
            assert!(is_gc_match(&tags, inst) && !is_gc_match(&tags, "other"));
            assert!(!is_gc_match(&tags[1..], inst), "unmanaged");
        }
        let tags = create_tags("u-1", "inst", &[]).unwrap();
        assert_eq!(tags, ["egress:managed:true", "egress:uid:u-1", "egress:installation:inst"]);
        assert!(is_gc_match(&["EGRESS:MANAGED:TRUE".into(), "egress:installation:inst".into()], "inst"));
        assert_eq!(uid(&tags[2..]), "");
        let e = create_tags(&"u/".repeat(100), "i", &[]).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("InvalidUid"));
        assert!(!is_tag("") && !is_tag("a b") && !is_tag(&"a".repeat(256)));
    }

    #[test]
    fn ids_are_parsed_strictly() {
        assert_eq!(parse_id("nyc3/3164444").unwrap(), ("nyc3", 3_164_444));
        for bad in ["", "3164444", "nyc3/", "/1", "nyc3/1/2", "nyc3/01", "NYC3/1", "nyc3/-1", "../1", "nyc3/1\n"] {
            assert_eq!(parse_id(bad).unwrap_err().code.as_deref(), Some("InvalidId"), "{bad:?}");
        }
    }
}
