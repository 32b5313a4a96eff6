//! The egress proxy operator: keeps forward proxies running on disposable cloud instances,
//! with every cloud backend a sandboxed WebAssembly plugin.

/// The operator's custom resources, group `egress.proxy-operator.dev`, version `v1alpha1`.
pub mod api;
/// The provider conformance suite: the contract's rules, case by case, against an emulator.
pub mod conformance;
/// The Proxy reconciler: pure decisions, and the calls and status writes they ask for.
pub mod controller;
/// The discovery API: the live `ip:port` list, per caller's permissions.
pub mod discovery;
/// The operator's own endpoints next to the discovery API: metrics, health, readiness.
pub mod endpoints;
/// Orphan GC: instances of this installation that no Proxy owns.
pub mod gc;
/// The heap's free pages given back to the kernel every few seconds.
pub mod heap_trim;
/// The operator's one HTTP port, with its connection and request bounds.
pub mod http_server;
/// The installation identity that marks this operator's instances.
pub mod installation;
/// The inventory: each provider's last list, so drift costs one list instead of a Get per Proxy.
pub mod inventory;
/// The Kubernetes client, as kube builds it but with its connection pool bounded.
pub mod kube_client;
/// Leader election over a `coordination.k8s.io/v1` Lease (kube-lease-manager).
pub mod leader;
/// Every metric the operator serves on `/metrics`, registered in one place.
pub mod metrics;
/// Plugins from OCI registries: pull, cache, cosign signatures, push.
pub mod oci;
/// The ProxyPool controller.
pub mod pool;
/// The probe engine: a real `CONNECT` through each instance.
pub mod probe;
/// The provider check monitor: each provider's health, published as ProviderHealth.
pub mod provider_check;
/// The process's one cache of Proxies, and whether a reflector has finished its first list.
pub mod proxy_cache;
/// Every Kubernetes API call the operator makes, as RBAC rules.
pub mod rbac;
/// Whether this replica is ready: the Proxy cache synced, the first plugin load done.
pub mod readiness;
/// The configured providers, by name, as the loops see them.
pub mod registry;
/// Reloading providers without a restart, when the mounted providers file or a plugin file changes.
pub mod reload;

/// Logging and tracing setup shared by the binary and the tests.
pub mod telemetry;
/// Test support (fakes, a span recorder, a headless-browser driver): for tests and the
/// demo only, behind the `test-support` feature, so the operator never ships it.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
/// The test binary's allocator: counts heap bytes per thread
/// (`egress_plugin_host::thread_heap::live`).
#[cfg(test)]
#[global_allocator]
static HEAP: egress_plugin_host::thread_heap::Counting = egress_plugin_host::thread_heap::Counting;

/// What the watches read and keep of the objects users write: list pages, trimmed metadata.
pub mod watched;
