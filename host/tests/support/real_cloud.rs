//! The lifecycle every provider's real-account test runs (`backend-test=integration-tag`):
//! ignored by default, run by hand with the cloud's credentials in the environment. Each
//! provider's test builds its plugin and request; this is the part they share, so every
//! provider is held to the same contract on a real backend.

use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{
    Class, CreateRequest, Instance, Provider, ProviderError, State,
};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

/// The installation the real-account tests create under (and list by).
pub const INSTALLATION: &str = "egress-integration-test";

/// A UID no earlier run used, so a test never adopts a leftover of another run.
pub fn unique_uid() -> String {
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("it-{stamp}")
}

/// `secret` in a file of its own, as a mounted Secret holds it; the directory lives as long
/// as the returned guard.
pub fn secret_file(secret: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, secret).unwrap();
    (dir, path)
}

/// How long a backend may take, and what `get` may show while an instance is deleted.
pub struct Pace {
    pub running_within: Duration,
    pub gone_within: Duration,
    pub poll: Duration,
    /// Checks an instance `get` still answers after the DELETE (e.g. "terminated only").
    pub while_deleting: fn(&Instance),
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            running_within: Duration::from_secs(300),
            gone_within: Duration::from_secs(180),
            poll: Duration::from_secs(5),
            while_deleting: |_| {},
        }
    }
}

/// Every target ready; create; create again (the same ID: idempotent by name); `get` until
/// Running with an IP, the UID and a creation time, never Stopped and never `0.0.0.0` on
/// the way; listed under its installation; delete, twice (the second of something gone
/// succeeds); `get` until not-found. The instance is deleted whatever failed before.
pub async fn lifecycle(p: &WasmProvider, req: &CreateRequest, pace: Pace) {
    let targets = p.check().await.unwrap();
    assert!(targets.iter().all(|t| t.ready), "{targets:?}");
    let id = p.create(req).await.unwrap();
    let outcome = async {
        assert_eq!(p.create(req).await?, id);
        let deadline = Instant::now() + pace.running_within;
        loop {
            let i = p.get(&id).await?;
            assert_ne!(i.state, State::Stopped, "{i:?}");
            assert_ne!(i.ip, "0.0.0.0", "{i:?}");
            if i.state == State::Running {
                assert!(
                    !i.ip.is_empty() && i.uid == req.uid && i.created_at.is_some(),
                    "{i:?}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not running after {:?}",
                pace.running_within
            );
            tokio::time::sleep(pace.poll).await;
        }
        let listed = p.list_by_tag(&req.installation).await?;
        assert!(listed.iter().any(|i| i.id == id), "{listed:?}");
        Ok::<_, ProviderError>(())
    }
    .await;
    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    let deadline = Instant::now() + pace.gone_within;
    loop {
        match p.get(&id).await {
            Err(e) if e.class == Class::NotFound => break,
            Ok(i) => (pace.while_deleting)(&i),
            Err(e) if e.class == Class::Transient => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            Instant::now() < deadline,
            "{id} still there after {:?}",
            pace.gone_within
        );
        tokio::time::sleep(pace.poll).await;
    }
    outcome.unwrap();
}
