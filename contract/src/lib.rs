//! The rules both sides of the provider contract must agree on, in one place.
//!
//! The operator writes marks on every instance and names instances after their Proxy's UID;
//! plugins write the same marks and may derive the same name; the emulators read the marks
//! back to play a cloud; the fake API server and the discovery API filter by the same
//! label-selector grammar. A rule written twice drifts (GC that no longer recognises a
//! plugin's instances, a selector the API accepts but the fake refuses), so each lives here
//! once and every crate uses this one.

/// Error codes the operator acts on (spot capacity, reclaimed instances, unsupported asks).
pub mod codes;
/// The marks every managed instance carries (labels or tags on the backend).
pub mod marks;
mod name;
/// Kubernetes label selectors in their string form (`kubectl -l`, `?labelSelector=`).
pub mod selector;

pub use marks::{MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_PREFIX, MARK_UID};
pub use name::name_from_uid;
