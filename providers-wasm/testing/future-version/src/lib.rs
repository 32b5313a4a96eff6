//! A minimal plugin built against `egress:provider@9.0.0` (its own copy of the WIT in
//! `wit/`), a version the host does not know: the host must refuse to load it by its
//! export names, before calling anything. Never deploy it.

wit_bindgen::generate!({
    path: "wit",
    world: "provider-plugin",
});

use egress::provider::types::{CreateRequest, Instance, PluginInfo, ProviderError, TargetStatus};
use exports::egress::provider::{plugin, provider};

struct FutureVersion;

fn refused() -> ProviderError {
    ProviderError {
        class: egress::provider::types::ErrorClass::Permanent,
        message: "a 9.0.0 plugin should never have been called".into(),
        code: None,
    }
}

impl plugin::Guest for FutureVersion {
    fn info() -> PluginInfo {
        PluginInfo {
            type_name: "future-version".into(),
            version: "9.0.0".into(),
            has_check: false,
            default_hosts: vec![],
            profile: vec![],
        }
    }

    fn validate_config(_config: String) -> Result<(), ProviderError> {
        Ok(())
    }
}

impl provider::Guest for FutureVersion {
    fn create(_req: CreateRequest) -> Result<String, ProviderError> {
        Err(refused())
    }

    fn get(_id: String) -> Result<Instance, ProviderError> {
        Err(refused())
    }

    fn delete(_id: String) -> Result<(), ProviderError> {
        Err(refused())
    }

    fn list_by_tag(_installation: String) -> Result<Vec<Instance>, ProviderError> {
        Err(refused())
    }

    fn check() -> Vec<TargetStatus> {
        Vec::new()
    }
}

export!(FutureVersion);
