//! The kube side of the pool controller: triggers, reading the cache, creating and deleting
//! Proxies, the status write and events.
//!
//! Pools are watched untyped ([`DynamicObject`]) and read into [`ProxyPool`] one by one in the
//! reconcile. A typed watch fails a whole list on one object that does not deserialize (a
//! `maxSurge: 4294967295` that an older CRD let through is not an `int32`): that pool was
//! never reconciled, nor, after a restart, any other pool of the cluster, and nothing said
//! so. Now such a pool gets `Progressing=False` with reason `InvalidSpec` naming the field,
//! its value and its limit, a Warning Event and a log line, like every spec the plan refuses
//! ([`plan::SpecError`]) and every Proxy the API server refuses to create from the template.

use super::ANNOTATION_PLACEMENT;
use super::plan::{self, Child, Creation, Deletion, PLACEMENT_FAILURES, Resolved};
use crate::api::Proxy;
use crate::api::{
    LABEL_POOL, MAX_POOL_NAME, ProxyPool, ProxyPoolStatus, condition, pool_condition,
};
use crate::controller::FIELD_MANAGER;
use crate::controller::events::Events;
use crate::controller::status::set_condition;
use crate::proxy_cache::{ProxyCache, ProxyFeed};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Instrument, info, warn};

/// How the pool controller runs.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// A pool with nothing due is looked at again after this long anyway (no provider call,
    /// no API call unless something changed).
    pub resync: Duration,
    /// How long to wait for the Proxy cache to show a create or delete.
    pub cache_wait: Duration,
    /// Pools reconciled at once.
    pub concurrency: u16,
    /// This replica's name, for Events.
    pub instance_name: Option<String>,
    /// Where `strategy: Cheapest` reads prices, without a provider call (see
    /// [`known_prices`]); without it only the pool's own Proxies' prices are known.
    pub registry: Option<crate::registry::ProviderRegistry>,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            resync: Duration::from_secs(5 * 60),
            cache_wait: Duration::from_secs(10),
            concurrency: 4,
            instance_name: None,
            registry: None,
        }
    }
}

struct Ctx {
    client: kube::Client,
    proxies: ProxyCache,
    /// The controller's own cache of pools: a pass waits until it shows the status the pass
    /// wrote, since the next pass reads the placements' back-off from there.
    pools: kube::runtime::reflector::Store<DynamicObject>,
    /// ProxyPool's group, version and plural, for the untyped watch.
    resource: ApiResource,
    events: Events,
    settings: PoolSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("creating Proxy {name}: {source}")]
    Create {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting Proxy {name}: {source}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status: {0}")]
    Status(#[source] kube::Error),
    #[error("no random numbers for a Proxy name: {0}")]
    Random(getrandom::Error),
}

/// Runs the pool controller until `shutdown`: triggered by pools and by changes of the
/// Proxies they own (through the process's Proxy cache and its feed).
pub async fn run(
    client: kube::Client,
    proxies: ProxyCache,
    feed: Arc<ProxyFeed>,
    settings: PoolSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let resource = ApiResource::erase::<ProxyPool>(&());
    let pools: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let children = {
        let resource = resource.clone();
        feed.subscribe().filter_map(move |p| {
            let resource = resource.clone();
            async move {
                let owner = p
                    .owner_references()
                    .iter()
                    .find(|o| o.controller == Some(true) && o.kind == "ProxyPool")?;
                Some(
                    ObjectRef::<DynamicObject>::new_with(&owner.name, resource)
                        .within(&p.namespace()?),
                )
            }
        })
    };
    let events = Events::new(
        client.clone(),
        Reporter {
            controller: "proxy-operator".into(),
            instance: settings.instance_name.clone(),
        },
    );
    let concurrency = settings.concurrency;
    // The pools' own watch, paged and trimmed like every watch of the operator: a pool's
    // metadata is its writer's to fill, and the controller reads none of its labels,
    // annotations or finalizers.
    let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let reader = writer.as_reader();
    let trigger = reflector::reflector(
        writer,
        watcher(pools, crate::watched::watcher_config()).modify(|o: &mut DynamicObject| {
            crate::watched::trim_metadata(&mut o.metadata, crate::watched::Keep::default());
        }),
    )
    .applied_objects();
    let controller = Controller::for_stream_with(trigger, reader, resource.clone());
    let ctx = Arc::new(Ctx {
        client,
        proxies,
        pools: controller.store(),
        resource,
        events,
        settings,
    });
    controller
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .reconcile_on(children)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

/// Each placement's hourly price as far as it is known without a provider call: the
/// provider's own knowledge (the providers file's `prices`, a quote still held), else what
/// a Proxy of the pool on that placement costs. The pool controller never calls a provider.
pub fn known_prices(
    spec: &Resolved,
    children: &[plan::Child],
    registry: Option<&crate::registry::ProviderRegistry>,
) -> BTreeMap<String, egress_plugin_host::provider::Price> {
    let mut out = BTreeMap::new();
    for (name, _, proxy) in &spec.placements {
        let placement = proxy.placement.to_provider();
        let known = registry
            .and_then(|r| r.get(&proxy.provider))
            .and_then(|provider| provider.known_price(&placement));
        let seen = || {
            children
                .iter()
                .filter(|c| c.placement.as_deref() == Some(name.as_str()))
                .find_map(|c| {
                    let h = c.price.as_ref()?;
                    Some(egress_plugin_host::provider::Price {
                        currency: h.currency.clone(),
                        micros_per_hour: h.micros()?,
                    })
                })
        };
        if let Some(price) = known.or_else(seen) {
            out.insert(name.clone(), price);
        }
    }
    out
}

fn error_policy(pool: Arc<DynamicObject>, err: &PoolError, _: Arc<Ctx>) -> Action {
    warn!(
        pool.namespace = pool.namespace().unwrap_or_default(),
        pool.name = pool.name_any(),
        error = %err,
        "pool reconcile failed"
    );
    Action::requeue(Duration::from_secs(5))
}

/// The Proxies `pool` owns, from the cache.
fn children_of(store: &kube::runtime::reflector::Store<Proxy>, pool: &ProxyPool) -> Vec<Child> {
    let (Some(ns), Some(uid)) = (pool.namespace(), pool.uid()) else {
        return Vec::new();
    };
    store
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| p.owner_references().iter().any(|o| o.uid == uid))
        .map(|p| child(p))
        .collect()
}

fn child(p: &Proxy) -> Child {
    let failure = p
        .condition(condition::PROVISIONED)
        .filter(|c| c.status == "False" && PLACEMENT_FAILURES.contains(&c.reason.as_str()))
        .map(|c| (c.reason.clone(), c.message.clone()));
    Child {
        name: p.name_any(),
        uid: p.uid().unwrap_or_default(),
        created: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(k8s_openapi::jiff::Timestamp::now, |t| t.0),
        deleting: p.metadata.deletion_timestamp.is_some(),
        ready: p
            .condition(condition::READY)
            .is_some_and(|c| c.status == "True"),
        spec: p.spec.clone(),
        placement: p.annotations().get(ANNOTATION_PLACEMENT).cloned(),
        failure,
        price: p.status.as_ref().and_then(|s| s.hourly_price.clone()),
    }
}

async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, PoolError> {
    let span = tracing::info_span!(
        "pool",
        pool.namespace = %obj.namespace().unwrap_or_default(),
        pool.name = %obj.name_any()
    );
    reconcile_pool(obj, ctx).instrument(span).await
}

/// The status the operator last wrote; a status that does not read (only the operator
/// writes it) counts as none, and is replaced whole by the next write.
fn status_of(obj: &DynamicObject) -> ProxyPoolStatus {
    obj.data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default()
}

async fn reconcile_pool(obj: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, PoolError> {
    if obj.metadata.deletion_timestamp.is_some() {
        // Its Proxies go through Kubernetes garbage collection (owner references).
        return Ok(Action::await_change());
    }
    if !ctx.proxies.synced.is_synced() {
        ctx.proxies.synced.wait().await;
    }
    let name = obj.name_any();
    let ns = obj.namespace().unwrap_or_default();
    let generation = obj.metadata.generation.unwrap_or(0);
    let current = status_of(&obj);
    let now = k8s_openapi::jiff::Timestamp::now();

    let null = serde_json::Value::Null;
    let spec = match plan::read_spec(obj.data.get("spec").unwrap_or(&null)) {
        Ok(spec) => spec,
        Err(e) => {
            report_invalid(&ctx, &obj, &current, generation, &e.to_string()).await?;
            return Ok(Action::await_change());
        }
    };
    let pool = Arc::new(ProxyPool {
        metadata: obj.metadata.clone(),
        spec,
        status: Some(current.clone()),
    });
    let resolved = match Resolved::from_spec(&pool.spec) {
        Ok(r) if name.len() <= MAX_POOL_NAME => r,
        Ok(_) => {
            let message = format!(
                "metadata.name: {name:?} is longer than {MAX_POOL_NAME} characters (its Proxies are named <pool>-<5 characters>)"
            );
            report_invalid(&ctx, &obj, &current, generation, &message).await?;
            return Ok(Action::await_change());
        }
        Err(e) => {
            report_invalid(&ctx, &obj, &current, generation, &e.to_string()).await?;
            return Ok(Action::await_change());
        }
    };
    let children = children_of(&ctx.proxies.store, &pool);
    let mut resolved = resolved;
    if resolved.cheapest {
        resolved.prices = known_prices(&resolved, &children, ctx.settings.registry.as_ref());
    }
    let plan = plan::plan(&name, &resolved, &current, generation, &children, now);

    let proxies: Api<Proxy> = Api::namespaced(ctx.client.clone(), &ns);
    let deleted = futures::future::join_all(plan.delete.iter().map(|d| delete(&proxies, d))).await;
    let created =
        futures::future::join_all(plan.create.iter().map(|c| create(&proxies, &pool, c))).await;
    let mut waits = Vec::new();
    for r in deleted {
        if let Some(w) = r? {
            waits.push(w);
        }
    }
    let mut refused = None;
    for r in created {
        match r {
            Ok(w) => waits.push(w),
            // The API server refuses a Proxy made from the template (a label key it does not
            // take, a value the Proxy CRD bounds): every create would be refused alike, so the
            // spec is what is wrong, and the pool says so instead of retrying in the log.
            Err(PoolError::Create {
                name,
                source: kube::Error::Api(e),
            }) if e.code == 422 => {
                refused.get_or_insert((name, e.message));
            }
            Err(e) => return Err(e),
        }
    }
    if let Some((proxy, why)) = refused {
        let mut message =
            format!("spec.template: the API server refused the Proxy {proxy} made from it: {why}");
        crate::controller::truncate(&mut message, crate::controller::CONDITION_MESSAGE_MAX);
        report_invalid(&ctx, &obj, &current, generation, &message).await?;
        // What did go through must be in the cache before the next pass counts.
        caught_up(&ctx, &obj, &waits).await;
        return Ok(Action::await_change());
    }
    announce(&ctx, &pool, &plan).await;
    if !plan.create.is_empty() || !plan.delete.is_empty() {
        info!(
            created = plan.create.len(),
            deleted = plan.delete.len(),
            replicas = resolved.replicas,
            "pool changed"
        );
    }

    if plan.status != current {
        write_status(&ctx, &obj, &plan.status).await?;
        waits.push(Wait::PoolWritten(obj.resource_version()));
    }

    // The next decision must see what this one did.
    if !caught_up(&ctx, &obj, &waits).await {
        warn!("the Proxy cache did not show this pass's changes in time; looking again");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let next = plan
        .requeue
        .map_or(ctx.settings.resync, |d| d.min(ctx.settings.resync));
    // A Proxy expires at its limit, not one tick before it.
    Ok(Action::requeue(next + Duration::from_millis(50)))
}

/// A change the caches must show before the next pass: a Proxy created (present, by UID)
/// or deleted (gone or being deleted), the pool's status written (its resourceVersion no
/// longer the one the pass started from).
enum Wait {
    Created(String, String),
    Deleted(String),
    PoolWritten(Option<String>),
}

async fn caught_up(ctx: &Ctx, pool: &DynamicObject, waits: &[Wait]) -> bool {
    let deadline = Instant::now() + ctx.settings.cache_wait;
    let ns = pool.namespace().unwrap_or_default();
    let ns = ns.as_str();
    loop {
        let done = waits.iter().all(|w| match w {
            Wait::PoolWritten(before) => ctx
                .pools
                .get(&ObjectRef::from_obj_with(pool, ctx.resource.clone()))
                .is_none_or(|p| p.resource_version() != *before),
            Wait::Created(name, uid) => ctx
                .proxies
                .store
                .get(&ObjectRef::new(name).within(ns))
                .is_some_and(|p| p.uid().as_deref() == Some(uid.as_str())),
            Wait::Deleted(name) => ctx
                .proxies
                .store
                .get(&ObjectRef::new(name).within(ns))
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        });
        if done {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn delete(proxies: &Api<Proxy>, d: &Deletion) -> Result<Option<Wait>, PoolError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(d.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match proxies.delete(&d.name, &params).await {
        Ok(_) => Ok(Some(Wait::Deleted(d.name.clone()))),
        // Gone already, or another object of that name now (the precondition).
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(None),
        Err(source) => Err(PoolError::Delete {
            name: d.name.clone(),
            source,
        }),
    }
}

/// Lower-case consonants and digits, as Kubernetes' generated names use: no words, no
/// look-alikes.
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn suffix() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 5];
    getrandom::fill(&mut bytes)?;
    Ok(bytes
        .iter()
        .map(|b| SUFFIX_ALPHABET[usize::from(*b) % SUFFIX_ALPHABET.len()] as char)
        .collect())
}

/// The Proxy for `c`, owned by `pool`.
fn proxy_for(pool: &ProxyPool, c: &Creation, name: String) -> Proxy {
    let meta = pool.spec.template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels;
    labels.insert(LABEL_POOL.into(), pool.name_any());
    let mut annotations = meta.annotations;
    annotations.insert(ANNOTATION_PLACEMENT.into(), c.placement.clone());
    Proxy {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: pool.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: ProxyPool::api_version(&()).into(),
                kind: ProxyPool::kind(&()).into(),
                name: pool.name_any(),
                uid: pool.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: c.spec.clone(),
        status: None,
    }
}

async fn create(proxies: &Api<Proxy>, pool: &ProxyPool, c: &Creation) -> Result<Wait, PoolError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let name = format!(
            "{}-{}",
            pool.name_any(),
            suffix().map_err(PoolError::Random)?
        );
        match proxies
            .create(&PostParams::default(), &proxy_for(pool, c, name.clone()))
            .await
        {
            Ok(p) => return Ok(Wait::Created(name, p.uid().unwrap_or_default())),
            // A name taken by chance: draw another.
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => continue,
            Err(source) => return Err(PoolError::Create { name, source }),
        }
    }
}

/// One Event per kind of change in a pass (counted per placement or reason), and one per
/// placement that starts failing: a pool of a thousand does not make a thousand Events.
async fn announce(ctx: &Ctx, pool: &ProxyPool, plan: &plan::Plan) {
    let regarding = pool.object_ref(&());
    let mut notes: Vec<Event> = Vec::new();
    if !plan.create.is_empty() {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &plan.create {
            *per.entry(c.placement.as_str()).or_default() += 1;
        }
        notes.push(event(
            EventType::Normal,
            "Created",
            format!("created {} Proxies ({})", plan.create.len(), tally(&per)),
        ));
    }
    if !plan.delete.is_empty() {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &plan.delete {
            *per.entry(d.why.as_str()).or_default() += 1;
        }
        notes.push(event(
            EventType::Normal,
            "Deleted",
            format!("deleting {} Proxies ({})", plan.delete.len(), tally(&per)),
        ));
    }
    for (placement, reason, message) in &plan.newly_failing {
        notes.push(event(
            EventType::Warning,
            "PlacementFailing",
            format!("placement {placement} skipped for now: {reason}: {message}"),
        ));
    }
    for e in notes {
        if let Err(err) = ctx.events.publish(&e, &regarding).await {
            warn!(error = %err, "publishing a pool Event failed");
        }
    }
}

fn tally(per: &BTreeMap<&str, usize>) -> String {
    per.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn event(type_: EventType, reason: &str, mut note: String) -> Event {
    // A provider's message can be longer than an Event note may be.
    crate::controller::truncate(&mut note, crate::controller::EVENT_NOTE_MAX);
    Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    }
}

/// The reason of a spec the controller cannot act on.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// A spec the controller cannot act on: Progressing=False, InvalidSpec, with `message`
/// (the field, its value, the limit), a Warning Event and a log line; nothing else changes
/// (the Proxies there are stay). The Event and the log line come once per new message, when
/// the condition changes, not on every pass.
async fn report_invalid(
    ctx: &Ctx,
    pool: &DynamicObject,
    current: &ProxyPoolStatus,
    generation: i64,
    message: &str,
) -> Result<(), PoolError> {
    let mut status = current.clone();
    status.observed_generation = Some(generation);
    set_condition(
        &mut status.conditions,
        pool_condition::PROGRESSING,
        "False",
        INVALID_SPEC,
        message,
        generation,
        &Time(k8s_openapi::jiff::Timestamp::now()),
    );
    if status == *current {
        return Ok(());
    }
    warn!(
        generation,
        reason = INVALID_SPEC,
        "pool spec refused: {message}"
    );
    let note = event(EventType::Warning, INVALID_SPEC, message.to_string());
    if let Err(err) = ctx
        .events
        .publish(&note, &pool.object_ref(&ctx.resource))
        .await
    {
        warn!(error = %err, "publishing a pool Event failed");
    }
    write_status(ctx, pool, &status).await
}

/// The whole status, with server-side apply under the operator's field manager.
async fn write_status(
    ctx: &Ctx,
    pool: &DynamicObject,
    status: &ProxyPoolStatus,
) -> Result<(), PoolError> {
    let patch = serde_json::json!({
        "apiVersion": ProxyPool::api_version(&()),
        "kind": ProxyPool::kind(&()),
        "status": status,
    });
    Api::<ProxyPool>::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default())
        .patch_status(
            &pool.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
        .map_err(PoolError::Status)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, HourlyPrice, Placement, PoolPlacement, ProxyPoolSpec, ProxySpec};
    use crate::registry::ProviderRegistry;
    use crate::testing::fake_provider::FakeProvider;

    /// Prices a pool can know without calling a provider: the provider's own (here the
    /// fake's configured price), else what the pool's Proxies on a placement cost; a
    /// placement neither knows stays unpriced.
    #[test]
    fn known_prices_come_from_the_provider_or_the_pools_own_proxies() {
        let template = ProxySpec {
            provider: "fake".into(),
            placement: Placement::new("r1", "", "small", "img"),
            cloud_init: CloudInit::default(),
            port: 3128,
            auth: Default::default(),
            ip_family: Default::default(),
        };
        let mut spec = ProxyPoolSpec::new(3, template);
        spec.placements = ["a", "b", "c"]
            .iter()
            .map(|z| PoolPlacement {
                zone: Some((*z).into()),
                ..Default::default()
            })
            .collect();
        let resolved = Resolved::from_spec(&spec).unwrap();
        let fake = FakeProvider::new("fake");
        fake.set_known_price(
            "a",
            egress_plugin_host::provider::Price {
                currency: "EUR".into(),
                micros_per_hour: 7_000,
            },
        );
        let registry = ProviderRegistry::new([std::sync::Arc::new(fake) as _]);
        let child = Child {
            name: "p-b".into(),
            uid: "u".into(),
            created: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            deleting: false,
            ready: true,
            spec: resolved.placements[1].2.clone(),
            placement: Some("b".into()),
            failure: None,
            price: Some(HourlyPrice {
                currency: "EUR".into(),
                per_hour: "0.009".into(),
            }),
        };
        let prices = known_prices(&resolved, &[child], Some(&registry));
        let micros: Vec<(&str, u64)> = prices
            .iter()
            .map(|(n, p)| (n.as_str(), p.micros_per_hour))
            .collect();
        assert_eq!(micros, [("a", 7_000), ("b", 9_000)]);
    }
}
