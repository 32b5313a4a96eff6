//! The Hetzner provider with two deliberate contract bugs, so the conformance tests can
//! prove the suite fails when a plugin is wrong (a suite that passes everything proves
//! nothing). Everything else is the real provider.
//!
//! 1. Create is not idempotent: a repeat call for a name it created before creates another
//!    server under a fresh name, as a plugin that "resolved" a name clash by renaming
//!    would. (The first call uses the requested name, so every other case still finds
//!    the instance by name.)
//! 2. Get answers NotFound for a server that is not running (being deleted, stopped, in an
//!    unknown state), as a plugin that took "not running" for "gone" would.
//! 3. It declares `lists-recent`, and its list of the servers made since a time shows
//!    those made before it instead, as a plugin that sorted the wrong way round would.

use egress_guest_sdk::time::now;
use egress_guest_sdk::{
    CreateRequest, Datetime, Instance, PluginInfo, Provider, ProviderError, State, TargetStatus,
    cache_get, cache_set, export_provider,
};
use hetzner::Hetzner;

struct Broken;
export_provider!(Broken);

impl Provider for Broken {
    const OUTCOMES: egress_guest_sdk::outcome::Outcomes =
        egress_guest_sdk::outcome::Outcomes::new("broken");

    fn info() -> PluginInfo {
        PluginInfo {
            type_name: "broken".into(),
            ..Hetzner::info()
        }
    }

    fn validate_config(config: &str) -> Result<(), ProviderError> {
        Hetzner::validate_config(config)
    }

    fn create(mut req: CreateRequest) -> Result<String, ProviderError> {
        // Bug 1: seen this name before? Then pick another instead of returning that server.
        let key = format!("created/{}", req.name);
        if cache_get(&key).is_some() {
            req.name = format!("{}-{:x}", req.name, now().nanoseconds);
        } else {
            cache_set(&key, b"1", 3600);
        }
        Hetzner::create(req)
    }

    fn get(id: &str) -> Result<Instance, ProviderError> {
        let i = Hetzner::get(id)?;
        // Bug 2: anything that is not coming up or running reads as gone.
        match i.state {
            State::Running | State::Provisioning => Ok(i),
            _ => Err(ProviderError::not_found(format!("server {id} is gone"))),
        }
    }

    fn delete(id: &str) -> Result<(), ProviderError> {
        Hetzner::delete(id)
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        Hetzner::list_by_tag(installation)
    }

    const LISTS_RECENT: bool = true;

    fn list_recent(installation: &str, since: Datetime) -> Result<Vec<Instance>, ProviderError> {
        // Bug 3: the older servers, not the newer ones.
        let mut all = Hetzner::list_by_tag(installation)?;
        all.retain(|i| i.created_at.is_some_and(|c| c.seconds < since.seconds));
        Ok(all)
    }

    fn check() -> Vec<TargetStatus> {
        Hetzner::check()
    }
}
