//! The operator layer's integration tests, one binary so the operator links once: the
//! controller against fake-kube (with the fake provider and with Wasm plugins), health
//! probes, leader election, the discovery API and status page, the real binary (`run`), and
//! the deployment (manifests, RBAC, the operations guide).
//!
//! Run one part with a filter: `cargo test -p proxy-operator --features test-support --test
//! operator discovery::`.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod controller;
mod controller_logs;
mod controller_wasm;
mod cost;
mod credentials;
mod deploy;
mod discovery;
mod harness;
mod image;
mod leader;
mod operations_doc;
mod pool;
mod probe;
mod rbac;
mod registry;
mod run;
mod spot;
mod status_page;
mod threat_borrow;
mod threat_compile;
mod threat_contract;
mod threat_credentials;
mod threat_http;
mod threat_network;
mod threat_recent;
mod threat_redaction;
mod threat_reload;
mod threat_rollout;
mod threat_template;
mod threat_watch;
