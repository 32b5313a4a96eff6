//! The leak check every provider's tests run: a cloud-init sentinel and a credential
//! sentinel go through the plugin's success and failure paths, and neither may come back in
//! an error, a log line or a span. The host redacts what a plugin emits, so the check also
//! requires that nothing needed redacting: the plugin itself never tried to emit them.

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp};
use egress_plugin_host::provider::{CreateRequest, Provider};
use proxy_operator::testing::Captured;

/// Cloud-init whose only content is `sentinel`.
pub fn cloud_init_with(sentinel: &str) -> Vec<u8> {
    format!("#cloud-config\nwrite_files:\n  - content: {sentinel}\n").into_bytes()
}

/// Drives `p` through every path an error or a log line can take with `req` (its cloud-init
/// holding a sentinel): create (the backend must get the cloud-init byte for byte, or the
/// check would be empty), get, list, check; a create of `bad` that the backend refuses
/// after `refuse` arranges it; every call refused for bad credentials; delete. Returns all
/// the answers, as text.
pub async fn exercise<P: Provider + ?Sized>(
    p: &P,
    emu: &dyn Emulator,
    req: &CreateRequest,
    bad: &CreateRequest,
    refuse: impl FnOnce(),
) -> String {
    let mut seen = String::new();
    let id = p.create(req).await.unwrap();
    assert!(
        emu.dump()
            .instances
            .iter()
            .any(|i| i.user_data == req.cloud_init),
        "the cloud-init did not reach the backend as sent"
    );
    assert_eq!(p.create(req).await.unwrap(), id);
    seen += &format!(
        "{:?}\n{:?}\n",
        p.get(&id).await,
        p.list_by_tag(&req.installation).await
    );
    seen += &format!("{:?}\n", p.check().await);
    refuse();
    seen += &format!("{:?}\n", p.create(bad).await);
    emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::Auth,
        count: 10,
    });
    seen += &format!(
        "{:?}\n{:?}\n{:?}\n",
        p.create(bad).await,
        p.get(&id).await,
        p.check().await
    );
    emu.reset();
    seen += &format!("{:?}\n", p.delete(&id).await);
    seen
}

/// No sentinel in `seen` or in anything `captured` recorded, nothing redacted, and the
/// plugin's own `outcome` line was recorded (so the capture saw the plugin at all).
pub fn assert_nothing_leaked(seen: &str, captured: &Captured, sentinels: &[&str], outcome: &str) {
    let seen = format!("{seen}{}", captured.all_text());
    for sentinel in sentinels {
        assert!(!seen.contains(sentinel), "{sentinel} leaked:\n{seen}");
    }
    assert!(
        !seen.contains("[REDACTED]"),
        "the host had to redact something the plugin emitted:\n{seen}"
    );
    assert!(
        captured
            .events()
            .iter()
            .any(|e| e.message().contains(outcome)),
        "no {outcome:?} line was captured, so the check above means nothing:\n{seen}"
    );
}
