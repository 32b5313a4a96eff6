//! [`Provider`] for plugins: calls through the version-neutral [`GuestCall`]/[`GuestReply`], and
//! wraps guest errors with the operation, provider name and ID.

use super::guest::{GuestError, RawInstance};
use super::{GuestCall, GuestReply, WasmProvider};
use crate::provider::{
    Class, CreateRequest, Instance, Op, Pacing, Placement, Price, Priority, Provider,
    ProviderError, State, TargetStatus,
};
use crate::sensitive::Full;
use async_trait::async_trait;
use std::time::{Duration, SystemTime};

/// Converts a checked instance (see `reply::instance`) and applies the one rule the
/// conversion owns: Running needs an address (a Running answer without one is reported as
/// Provisioning, as the contract says).
fn instance_of(i: RawInstance) -> Instance {
    let mut state = i.state;
    if state == State::Running && i.ip.trim().is_empty() && i.ipv6.trim().is_empty() {
        state = State::Provisioning;
    }
    Instance {
        id: i.id,
        ip: i.ip,
        state,
        uid: i.uid,
        created_at: i.created_at.and_then(|(s, n)| {
            SystemTime::UNIX_EPOCH.checked_add(Duration::new(s, n.min(999_999_999)))
        }),
        ipv6: i.ipv6,
        interrupted: i.interrupted,
        hourly_price: i.hourly_price,
    }
}

impl WasmProvider {
    fn wrap(&self, op: Op, id: &str, e: GuestError) -> ProviderError {
        let mut class = e.class;
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
        document: Option<super::Document<'_>>,
        call: GuestCall<'_>,
        priority: Priority,
    ) -> Result<GuestReply, ProviderError> {
        self.invoke(op, id, document, false, call, priority)
            .await
            .map(|(reply, _)| reply)
    }

    /// A list of every instance (`since`: none) or of those created since a time; its
    /// cost is remembered per kind, for [`Pacing`](crate::provider::Pacing).
    async fn list(
        &self,
        installation: &str,
        since: Option<std::time::SystemTime>,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        let (reply, stats) = self
            .invoke(
                Op::List,
                "",
                None,
                false,
                GuestCall::List(installation, since),
                priority,
            )
            .await?;
        match reply {
            GuestReply::List(Ok(list)) => {
                self.record_list_cost(&stats, since.is_some());
                Ok(list.into_iter().map(instance_of).collect())
            }
            GuestReply::List(Err(e)) => Err(self.wrap(Op::List, "", e)),
            _ => unreachable!("list-by-tag returns GuestReply::List"),
        }
    }

    /// A call that does nothing in the guest but `check` (with an empty config): what the
    /// overhead benchmark measures. Returns the host-side statistics.
    pub async fn bench_call(&self) -> Result<super::CallStats, ProviderError> {
        self.invoke(
            Op::Check,
            "",
            None,
            false,
            GuestCall::Check,
            Priority::of_op(Op::Check),
        )
        .await
        .map(|(_, stats)| stats)
    }
}

#[async_trait]
impl Provider for WasmProvider {
    fn name(&self) -> &str {
        WasmProvider::name(self)
    }

    async fn create_at(
        &self,
        req: &CreateRequest,
        priority: Priority,
    ) -> Result<String, ProviderError> {
        match self
            .call(
                Op::Create,
                &req.name,
                Some(super::Document {
                    owner: &req.uid,
                    cloud_init: &req.cloud_init,
                }),
                GuestCall::Create(req),
                priority,
            )
            .await?
        {
            GuestReply::Id(Ok(id)) if id.is_empty() => Err(ProviderError::new(
                Class::Transient,
                Op::Create,
                self.name(),
                &req.name,
                "plugin returned an empty provider ID",
            )),
            GuestReply::Id(Ok(id)) => Ok(id),
            GuestReply::Id(Err(e)) => Err(self.wrap(Op::Create, &req.name, e)),
            _ => unreachable!("create returns GuestReply::Id"),
        }
    }

    async fn get_at(&self, id: &str, priority: Priority) -> Result<Instance, ProviderError> {
        match self
            .call(Op::Get, id, None, GuestCall::Get(id), priority)
            .await?
        {
            GuestReply::Instance(Ok(i)) => Ok(instance_of(i)),
            GuestReply::Instance(Err(e)) => Err(self.wrap(Op::Get, id, e)),
            _ => unreachable!("get returns GuestReply::Instance"),
        }
    }

    async fn delete_at(&self, id: &str, priority: Priority) -> Result<(), ProviderError> {
        match self
            .call(Op::Delete, id, None, GuestCall::Delete(id), priority)
            .await?
        {
            GuestReply::Unit(Ok(())) => Ok(()),
            GuestReply::Unit(Err(e)) => Err(self.wrap(Op::Delete, id, e)),
            _ => unreachable!("delete returns GuestReply::Unit"),
        }
    }

    async fn list_by_tag_at(
        &self,
        installation: &str,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        self.list(installation, None, priority).await
    }

    fn lists_recent(&self) -> bool {
        self.plugin.info.lists_recent
    }

    async fn list_recent_at(
        &self,
        installation: &str,
        since: std::time::SystemTime,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        // A plugin that did not declare `lists-recent` is never asked (0.1.0 and 0.2.0
        // have no place for it): it lists everything, as the trait's default does.
        let since = self.plugin.info.lists_recent.then_some(since);
        self.list(installation, since, priority).await
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

    fn pacing(&self) -> Option<Pacing> {
        WasmProvider::pacing(self)
    }

    fn known_price(&self, placement: &Placement) -> Option<Price> {
        crate::config::prices::price_of(&self.shared.prices, placement).or_else(|| {
            (self.shared.quotes.lock())
                .unwrap_or_else(|e| e.into_inner())
                .get(placement, std::time::Instant::now())
                .flatten()
        })
    }

    /// The providers file's `prices` first (what this account pays), then the plugin's
    /// `quote`, kept an hour per placement (see `quotes`). A 0.1.0 plugin has no `quote`:
    /// without a rule the call is refused by name before it takes a slot (no plugin runs),
    /// and its placements have no price.
    async fn quote(&self, placement: &Placement) -> Result<Option<Price>, ProviderError> {
        if let Some(p) = crate::config::prices::price_of(&self.shared.prices, placement) {
            return Ok(Some(p));
        }
        let now = std::time::Instant::now();
        let kept = (self.shared.quotes.lock())
            .unwrap_or_else(|e| e.into_inner())
            .get(placement, now);
        if let Some(hit) = kept {
            return Ok(hit);
        }
        let answer = match self
            .call(
                Op::Quote,
                "",
                None,
                GuestCall::Quote(placement),
                Priority::of_op(Op::Quote),
            )
            .await
        {
            Ok(GuestReply::Quote(Ok(p))) => Ok(p),
            Ok(GuestReply::Quote(Err(e))) => Err(self.wrap(Op::Quote, "", e)),
            Ok(_) => unreachable!("quote returns GuestReply::Quote"),
            Err(e) => Err(e),
        };
        // A failure is kept as "no price" too: every reconcile of a running Proxy without a
        // price asks, and a plugin whose quote keeps failing must not cost a call each time.
        let kept = answer.as_ref().ok().cloned().flatten();
        (self.shared.quotes.lock())
            .unwrap_or_else(|e| e.into_inner())
            .put(placement, kept, now);
        answer
    }

    /// A check never fails as a whole: a failed call becomes one not-ready target.
    async fn check(&self) -> Option<Vec<TargetStatus>> {
        if !self.info().has_check {
            return None;
        }
        Some(
            match self
                .call(
                    Op::Check,
                    "",
                    None,
                    GuestCall::Check,
                    Priority::of_op(Op::Check),
                )
                .await
            {
                Ok(GuestReply::Check(targets)) => targets,
                Ok(_) => unreachable!("check returns GuestReply::Check"),
                Err(e) => vec![TargetStatus {
                    target: "plugin".into(),
                    ready: false,
                    reason: "PluginError".into(),
                    message: e.message,
                    details: Vec::new(),
                }],
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_without_any_address_is_provisioning() {
        let base = RawInstance {
            id: "r/1".into(),
            ip: String::new(),
            ipv6: String::new(),
            state: State::Running,
            uid: "u".into(),
            created_at: Some((10, 5)),
            interrupted: false,
            hourly_price: None,
        };
        let i = instance_of(base.clone());
        assert_eq!(i.state, State::Provisioning);
        assert_eq!(
            i.created_at,
            Some(SystemTime::UNIX_EPOCH + Duration::new(10, 5))
        );
        for (ip, ipv6) in [
            ("1.2.3.4", ""),
            ("", "2001:db8::1"),
            ("1.2.3.4", "2001:db8::1"),
        ] {
            let i = instance_of(RawInstance {
                ip: ip.into(),
                ipv6: ipv6.into(),
                ..base.clone()
            });
            assert_eq!(i.state, State::Running, "{ip:?} {ipv6:?}");
        }
        let i = instance_of(RawInstance {
            state: State::Stopped,
            ..base
        });
        assert_eq!(i.state, State::Stopped);
    }
}
