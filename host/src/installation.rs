//! The installation identity: which operator install an instance belongs to.
//!
//! It is written on every instance at Create and is the filter of ListByTag, so orphan GC
//! of one install never sees, let alone deletes, the instances of another install sharing
//! the same cloud account. It must be stable for the life of an install: a new value would
//! make every existing instance invisible to GC (never deleted wrongly, but leaked).

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use sha2::{Digest, Sha256};

/// The default identity: derived from the cluster (the UID of `kube-system`, which lives as
/// long as the cluster) and the operator's namespace, so two installs in one cluster differ
/// and a reinstall into the same namespace finds its instances again.
pub fn derive(cluster_uid: &str, namespace: &str) -> String {
    let digest = Sha256::digest(format!("{cluster_uid}/{namespace}").as_bytes());
    format!(
        "install-{}",
        data_encoding::BASE32_NOPAD
            .encode(&digest[..10])
            .to_ascii_lowercase()
    )
}

/// Reads the cluster's UID and derives the default identity for `namespace`.
pub async fn default_identity(
    client: kube::Client,
    namespace: &str,
) -> Result<String, kube::Error> {
    let ns: Api<Namespace> = Api::all(client);
    let kube_system = ns.get("kube-system").await?;
    let uid = kube_system.metadata.uid.unwrap_or_default();
    Ok(derive(&uid, namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_distinct_per_cluster_and_namespace() {
        let a = derive("c1", "egress-system");
        assert_eq!(a, derive("c1", "egress-system"));
        assert_ne!(a, derive("c2", "egress-system"));
        assert_ne!(a, derive("c1", "other"));
        assert!(a.starts_with("install-") && a.len() == 24, "{a}");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }

    #[tokio::test]
    async fn default_reads_the_kube_system_uid() {
        let api = fake_kube::FakeApi::new();
        let uid = api.object("namespaces", None, "kube-system").unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string();
        let id = default_identity(api.client(), "egress").await.unwrap();
        assert_eq!(id, derive(&uid, "egress"));
    }
}
