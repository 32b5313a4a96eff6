//! [`Provider`] for plugins: converts between the operator's types and the WIT types, and
//! wraps guest errors with the operation, provider name and ID.

use super::{Class, CreateRequest, Instance, Op, Provider, ProviderError, State, TargetStatus};
use crate::plugin::bindings::egress::provider::types as wit;
use crate::plugin::sensitive::Full;
use crate::plugin::{Call, Reply, WasmProvider, class_of};
use async_trait::async_trait;
use std::time::{Duration, SystemTime};

fn state_of(s: wit::State) -> State {
    match s {
        wit::State::Provisioning => State::Provisioning,
        wit::State::Running => State::Running,
        wit::State::Stopped => State::Stopped,
        wit::State::Terminated => State::Terminated,
    }
}

/// Converts and enforces what the host can check on a plugin's answer: Running needs an
/// IP (a Running answer without one is reported as Provisioning, as the contract says).
fn instance_of(i: wit::Instance) -> Instance {
    let mut state = state_of(i.state);
    if state == State::Running && i.ip.trim().is_empty() {
        state = State::Provisioning;
    }
    Instance {
        id: i.id,
        ip: i.ip,
        state,
        uid: i.uid,
        created_at: i.created_at.and_then(|t| {
            SystemTime::UNIX_EPOCH
                .checked_add(Duration::new(t.seconds, t.nanoseconds.min(999_999_999)))
        }),
    }
}

impl WasmProvider {
    fn wrap(&self, op: Op, id: &str, e: wit::ProviderError) -> ProviderError {
        let mut class = class_of(e.class);
        // NotFound is an answer only Get can give; from anything else it would mislead.
        if class == Class::NotFound && op != Op::Get && op != Op::Delete {
            class = Class::Transient;
        }
        ProviderError {
            class,
            op,
            provider: self.name().to_string(),
            id: id.to_string(),
            message: e.message,
            code: e.code,
        }
    }

    async fn call(
        &self,
        op: Op,
        id: &str,
        document: Option<crate::plugin::Document<'_>>,
        call: Call<'_>,
    ) -> Result<Reply, ProviderError> {
        self.invoke(op, id, document, false, call)
            .await
            .map(|(reply, _)| reply)
    }

    /// A call that does nothing in the guest but `check` (with an empty config): what the
    /// overhead benchmark measures. Returns the host-side statistics.
    pub async fn bench_call(&self) -> Result<crate::plugin::CallStats, ProviderError> {
        self.invoke(Op::Check, "", None, false, Call::Check)
            .await
            .map(|(_, stats)| stats)
    }
}

#[async_trait]
impl Provider for WasmProvider {
    fn name(&self) -> &str {
        WasmProvider::name(self)
    }

    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        let wreq = wit::CreateRequest {
            name: req.name.clone(),
            uid: req.uid.clone(),
            namespace: req.namespace.clone(),
            proxy_name: req.proxy_name.clone(),
            installation: req.installation.clone(),
            placement: wit::Placement {
                region: req.placement.region.clone(),
                zone: req.placement.zone.clone(),
                machine_type: req.placement.machine_type.clone(),
                image: req.placement.image.clone(),
            },
            cloud_init: req.cloud_init.clone(),
            port: req.port,
        };
        match self
            .call(
                Op::Create,
                &req.name,
                Some(crate::plugin::Document {
                    owner: &req.uid,
                    cloud_init: &req.cloud_init,
                }),
                Call::Create(&wreq),
            )
            .await?
        {
            Reply::Id(Ok(id)) if id.is_empty() => Err(ProviderError::new(
                Class::Transient,
                Op::Create,
                self.name(),
                &req.name,
                "plugin returned an empty provider ID",
            )),
            Reply::Id(Ok(id)) => Ok(id),
            Reply::Id(Err(e)) => Err(self.wrap(Op::Create, &req.name, e)),
            _ => unreachable!("create returns Reply::Id"),
        }
    }

    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        match self.call(Op::Get, id, None, Call::Get(id)).await? {
            Reply::Instance(Ok(i)) => Ok(instance_of(i)),
            Reply::Instance(Err(e)) => Err(self.wrap(Op::Get, id, e)),
            _ => unreachable!("get returns Reply::Instance"),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        match self.call(Op::Delete, id, None, Call::Delete(id)).await? {
            Reply::Unit(Ok(())) => Ok(()),
            Reply::Unit(Err(e)) => Err(self.wrap(Op::Delete, id, e)),
            _ => unreachable!("delete returns Reply::Unit"),
        }
    }

    async fn list_by_tag(&self, installation: &str) -> Result<Vec<Instance>, ProviderError> {
        let (reply, stats) = self
            .invoke(Op::List, "", None, false, Call::List(installation))
            .await?;
        match reply {
            Reply::List(Ok(list)) => {
                self.record_list_cost(&stats);
                Ok(list.into_iter().map(instance_of).collect())
            }
            Reply::List(Err(e)) => Err(self.wrap(Op::List, "", e)),
            _ => unreachable!("list-by-tag returns Reply::List"),
        }
    }

    fn remember_cloud_init(&self, owner: &str, doc: &[u8]) -> Result<(), Full> {
        WasmProvider::remember_cloud_init(self, owner, doc)
    }

    fn remember_credentials(
        &self,
        owner: &str,
        username: &str,
        password: &str,
    ) -> Result<(), Full> {
        WasmProvider::remember_credentials(self, owner, username, password)
    }

    fn forget(&self, owner: &str) {
        WasmProvider::forget(self, owner)
    }

    fn private_addresses_allowed(&self) -> bool {
        WasmProvider::private_addresses_allowed(self)
    }

    fn pacing(&self) -> Option<super::Pacing> {
        WasmProvider::pacing(self)
    }

    /// A check never fails as a whole: a failed call becomes one not-ready target.
    async fn check(&self) -> Option<Vec<TargetStatus>> {
        if !self.info().has_check {
            return None;
        }
        Some(match self.call(Op::Check, "", None, Call::Check).await {
            Ok(Reply::Check(targets)) => targets
                .into_iter()
                .map(|t| TargetStatus {
                    target: t.target,
                    ready: t.ready,
                    reason: t.reason,
                    message: t.message,
                    details: t.details,
                })
                .collect(),
            Ok(_) => unreachable!("check returns Reply::Check"),
            Err(e) => vec![TargetStatus {
                target: "plugin".into(),
                ready: false,
                reason: "PluginError".into(),
                message: e.message,
                details: Vec::new(),
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_without_ip_is_provisioning() {
        let base = wit::Instance {
            id: "r/1".into(),
            ip: String::new(),
            state: wit::State::Running,
            uid: "u".into(),
            created_at: Some(wit::Datetime {
                seconds: 10,
                nanoseconds: 5,
            }),
        };
        let i = instance_of(base.clone());
        assert_eq!(i.state, State::Provisioning);
        assert_eq!(
            i.created_at,
            Some(SystemTime::UNIX_EPOCH + Duration::new(10, 5))
        );
        let i = instance_of(wit::Instance {
            ip: "1.2.3.4".into(),
            ..base.clone()
        });
        assert_eq!(i.state, State::Running);
        let i = instance_of(wit::Instance {
            state: wit::State::Stopped,
            ..base
        });
        assert_eq!(i.state, State::Stopped);
    }
}
