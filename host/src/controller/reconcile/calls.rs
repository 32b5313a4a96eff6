//! The provider calls a decision asks for, each at its priority, and their answers.

use super::{Resolved, Shell};
use crate::controller::decide::{Answer, Call, DeletePurpose, GetPurpose};
use egress_plugin_host::provider::Priority;
use egress_plugin_host::provider::State;
use egress_plugin_host::provider::{
    Class, CreateRequest, Op, Provider, ProviderError, name_from_uid,
};

use tracing::debug;

impl<'a> Shell<'a> {
    pub(super) async fn call(&self, call: Call, resolved: Option<&Resolved>) -> Answer {
        // decide asks for calls only with a configured provider, and for Create only with
        // resolved inputs; should that ever break, the call fails (and is retried) rather
        // than panicking a worker.
        let missing = |op, id: &str, what: &str| {
            ProviderError::new(
                Class::Transient,
                op,
                &self.proxy.spec.provider,
                id,
                format!("internal: {what}"),
            )
        };
        let Some(provider) = &self.provider else {
            let e = missing(Op::Get, "", "no provider for this call");
            return match call {
                Call::Create => Answer::Created(Err(e)),
                Call::Get { purpose, .. } => Answer::Got(purpose, Err(e)),
                Call::Delete { purpose, .. } => Answer::Deleted(purpose, Err(e)),
            };
        };
        match call {
            Call::Create => {
                let Some(r) = resolved else {
                    return Answer::Created(Err(missing(
                        Op::Create,
                        "",
                        "inputs not resolved for Create",
                    )));
                };
                let p = &self.proxy.spec.placement;
                let req = CreateRequest {
                    name: name_from_uid(&self.uid),
                    uid: self.uid.clone(),
                    namespace: self.namespace.clone(),
                    proxy_name: self.name.clone(),
                    installation: self.ctx.settings.installation.clone(),
                    placement: p.to_provider(),
                    cloud_init: r.cloud_init.clone(),
                    port: r.port,
                    ip_family: self.proxy.spec.ip_family.to_provider(),
                };
                let asked = std::time::SystemTime::now();
                let result = provider.create_at(&req, Priority::Urgent).await;
                log_call("create", &req.name, result.as_ref().err());
                if let (Ok(id), Some(inventory)) = (&result, &self.ctx.inventory) {
                    let at = std::time::SystemTime::now();
                    inventory.created_between(&self.proxy.spec.provider, id, asked, at);
                }
                if result.is_ok() {
                    self.ctx.returned.note(&self.uid);
                }
                Answer::Created(result)
            }
            Call::Get { id, purpose } => {
                // A Running Proxy's Get is a drift check: background work that waits while
                // the provider's request budget is short. Anything else is in transition.
                let running = self.proxy.status.as_ref().and_then(|s| s.state.as_deref())
                    == Some(State::Running.as_str());
                let priority = match purpose {
                    GetPurpose::Observe if running => Priority::Background,
                    _ => Priority::Transition,
                };
                let result = provider.get_at(&id, priority).await;
                log_call("get", &id, result.as_ref().err());
                Answer::Got(purpose, result)
            }
            Call::Delete { id, purpose } => {
                // Deleting a user's Proxy is theirs to wait for; replacing is transition.
                let priority = match purpose {
                    DeletePurpose::Finalize | DeletePurpose::FinalizeAfterPermanentGet => {
                        Priority::Urgent
                    }
                    DeletePurpose::Replace | DeletePurpose::Stopped => Priority::Transition,
                };
                let result = provider.delete_at(&id, priority).await;
                log_call("delete", &id, result.as_ref().err());
                Answer::Deleted(purpose, result)
            }
        }
    }
}

fn log_call(op: &'static str, id: &str, err: Option<&ProviderError>) {
    match err {
        None => debug!(op, provider.id = id, "provider call ok"),
        Some(e) => {
            debug!(op, provider.id = id, class = e.class.as_str(), error = %e, "provider call failed")
        }
    }
}
