//! Whether this replica is ready, shared between the loops that learn it (the Proxy cache,
//! the plugin (re)loads) and `/readyz`.
//!
//! Readiness gates the discovery Service, and the discovery API answers from the Proxy
//! cache. So a replica is ready once that cache has synced and its first plugin load is
//! done; a provider that failed to load does not make it unready (every other provider's
//! proxies are still worth serving). A failed load is reported in `/readyz`'s body, in the
//! provider's `ProviderHealth` and in `proxy_operator_provider_reload_errors_total`.

use axum::http::StatusCode;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What `/readyz` reports, shared between the loops that learn it and the endpoint.
#[derive(Clone, Default)]
pub struct Readiness {
    inner: Arc<ReadinessInner>,
}

#[derive(Default)]
struct ReadinessInner {
    cache_synced: AtomicBool,
    plugins_loaded: AtomicBool,
    providers: Mutex<ProviderLoad>,
}

/// Which providers serve and which failed their last load (with why).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderLoad {
    pub serving: Vec<String>,
    /// By provider name; `""` is the providers file itself.
    pub errors: BTreeMap<String, String>,
    /// What each serving provider runs (its pinned `oci://` reference, or its plugin
    /// file and digest), by provider name.
    pub plugins: BTreeMap<String, String>,
}

impl Readiness {
    pub fn set_cache_synced(&self) {
        self.inner.cache_synced.store(true, Ordering::Release);
    }

    /// After every plugin (re)load: the first call also marks the first load done.
    pub fn set_providers(&self, load: ProviderLoad) {
        *self
            .inner
            .providers
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = load;
        self.inner.plugins_loaded.store(true, Ordering::Release);
    }

    /// The last load errors, by provider (`""` for the providers file).
    pub fn load_errors(&self) -> BTreeMap<String, String> {
        self.providers().errors
    }

    /// What each serving provider runs ([`ProviderLoad::plugins`]).
    pub fn plugins(&self) -> BTreeMap<String, String> {
        self.providers().plugins
    }

    fn providers(&self) -> ProviderLoad {
        self.inner
            .providers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The `/readyz` answer now.
    pub fn verdict(&self) -> (StatusCode, String) {
        verdict(
            self.inner.cache_synced.load(Ordering::Acquire),
            self.inner.plugins_loaded.load(Ordering::Acquire),
            &self.providers(),
        )
    }
}

/// The `/readyz` status and body. Pure.
pub fn verdict(
    cache_synced: bool,
    plugins_loaded: bool,
    load: &ProviderLoad,
) -> (StatusCode, String) {
    let mut body = String::new();
    let mut ready = true;
    if cache_synced {
        body.push_str("[+] proxy cache synced\n");
    } else {
        ready = false;
        body.push_str("[-] proxy cache not synced yet\n");
    }
    if plugins_loaded {
        body.push_str(&format!(
            "[+] plugins loaded: {} provider(s) serving{}\n",
            load.serving.len(),
            if load.serving.is_empty() {
                String::new()
            } else {
                format!(" ({})", load.serving.join(", "))
            }
        ));
    } else {
        ready = false;
        body.push_str("[-] plugins not loaded yet\n");
    }
    for (provider, why) in &load.errors {
        let what = if provider.is_empty() {
            "providers file failed to load; every provider keeps its current version".into()
        } else if load.serving.contains(provider) {
            format!("provider {provider} failed to reload; its previous version keeps serving")
        } else {
            format!("provider {provider} failed to load")
        };
        body.push_str(&format!("[!] {what} (not a readiness failure): {why}\n"));
    }
    body.push_str(if ready { "ready\n" } else { "not ready\n" });
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(serving: &[&str], errors: &[(&str, &str)]) -> ProviderLoad {
        ProviderLoad {
            serving: serving.iter().map(|s| s.to_string()).collect(),
            errors: errors
                .iter()
                .map(|(p, e)| (p.to_string(), e.to_string()))
                .collect(),
            plugins: BTreeMap::new(),
        }
    }

    #[test]
    fn readiness_table() {
        // (case, cache synced, plugins loaded, load, status, texts in the body)
        type Case = (
            &'static str,
            bool,
            bool,
            ProviderLoad,
            StatusCode,
            &'static [&'static str],
        );
        let cases: &[Case] = &[
            (
                "nothing yet",
                false,
                false,
                load(&[], &[]),
                StatusCode::SERVICE_UNAVAILABLE,
                &[
                    "[-] proxy cache not synced",
                    "[-] plugins not loaded",
                    "not ready",
                ],
            ),
            (
                "cache synced, plugins loading",
                true,
                false,
                load(&[], &[]),
                StatusCode::SERVICE_UNAVAILABLE,
                &["[+] proxy cache synced", "[-] plugins not loaded"],
            ),
            (
                "plugins loaded, cache syncing",
                false,
                true,
                load(&["ec2"], &[]),
                StatusCode::SERVICE_UNAVAILABLE,
                &["[-] proxy cache not synced", "1 provider(s) serving (ec2)"],
            ),
            (
                "all there",
                true,
                true,
                load(&["ec2", "hetzner"], &[]),
                StatusCode::OK,
                &["2 provider(s) serving (ec2, hetzner)", "ready\n"],
            ),
            (
                "a broken provider is reported, not a readiness failure",
                true,
                true,
                load(
                    &["ec2"],
                    &[("hetzner", "plugin file \"h.wasm\" is not in /plugins")],
                ),
                StatusCode::OK,
                &[
                    "[!] provider hetzner failed to load (not a readiness failure): plugin file \"h.wasm\" is not in /plugins",
                ],
            ),
            (
                "a provider whose new version failed still serves the old one",
                true,
                true,
                load(
                    &["ec2", "hetzner"],
                    &[(
                        "hetzner",
                        "provider \"hetzner\": not rebuilt within 1m (stopped while running validate-config)",
                    )],
                ),
                StatusCode::OK,
                &[
                    "2 provider(s) serving (ec2, hetzner)",
                    "[!] provider hetzner failed to reload; its previous version keeps serving (not a readiness failure): provider \"hetzner\": not rebuilt within 1m",
                ],
            ),
            (
                "a broken providers file is reported too",
                true,
                true,
                load(&[], &[("", "providers.yaml: unknown field `limit`")]),
                StatusCode::OK,
                &[
                    "[!] providers file failed to load; every provider keeps its current version (not a readiness failure): providers.yaml",
                    "0 provider(s) serving\n",
                ],
            ),
        ];
        for (name, synced, loaded, load, code, texts) in cases {
            let (got, body) = verdict(*synced, *loaded, load);
            assert_eq!(got, *code, "{name}: {body}");
            for t in *texts {
                assert!(body.contains(t), "{name}: {t:?} not in\n{body}");
            }
        }
    }

    #[test]
    fn the_first_load_flips_plugins_loaded() {
        let r = Readiness::default();
        r.set_cache_synced();
        assert_eq!(r.verdict().0, StatusCode::SERVICE_UNAVAILABLE);
        r.set_providers(load(&["ec2"], &[]));
        assert_eq!(r.verdict().0, StatusCode::OK);
    }
}
