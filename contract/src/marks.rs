//! The marks every managed instance carries (labels or tags on the backend). Written at
//! create, read back by orphan GC: the keys must be identical in the operator and every
//! plugin, or one would not recognise the other's instances.

/// What every mark key starts with; backends whose tags are plain strings encode the pair
/// under it.
pub const MARK_PREFIX: &str = "egress.proxy-operator.dev/";
/// Present, with [`MARK_MANAGED_YES`], on every instance the operator manages.
pub const MARK_MANAGED: &str = "egress.proxy-operator.dev/managed";
/// The value of [`MARK_MANAGED`].
pub const MARK_MANAGED_YES: &str = "true";
/// The owning Proxy's UID, so adoption can be verified and orphans found.
pub const MARK_UID: &str = "egress.proxy-operator.dev/uid";
/// The installation identity, so two operators in one account never collect each other's
/// instances.
pub const MARK_INSTALLATION: &str = "egress.proxy-operator.dev/installation";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_under_the_prefix() {
        for key in [MARK_MANAGED, MARK_UID, MARK_INSTALLATION] {
            assert!(key.starts_with(MARK_PREFIX), "{key}");
            assert!(key.len() - MARK_PREFIX.len() <= 63, "a label name: {key}");
        }
    }
}
