//! Leader election: two operator instances (two `Leadership` claims with different
//! identities) against one in-memory Kubernetes API (fake-kube), and the helper that runs
//! leader-only loops.

use fake_kube::FakeApi;
use k8s_openapi::api::coordination::v1::Lease;
use proxy_operator::leader::{
    Leadership, LeaseSettings, Step, TimingError, decide, lease_params_secs, retry_delay,
    run_while_leader,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const LEASE: &str = "proxy-operator-leader";
const DURATION: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(1);

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: NS.into(),
        lease_name: LEASE.into(),
        identity: identity.into(),
        duration: DURATION,
        renew: RENEW,
    }
}

#[test]
fn lease_timings_table() {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    type Case = (Duration, Duration, Result<(u64, u64), TimingError>);
    let cases: &[Case] = &[
        // (duration, renew) -> kube-lease-manager (duration, grace)
        (s(15), s(5), Ok((15, 10))),
        (s(2), s(1), Ok((2, 1))),
        (s(30), s(29), Ok((30, 1))),
        (
            s(5),
            s(5),
            Err(TimingError::RenewNotShorter {
                renew: s(5),
                duration: s(5),
            }),
        ),
        (
            s(5),
            s(10),
            Err(TimingError::RenewNotShorter {
                renew: s(10),
                duration: s(5),
            }),
        ),
        (
            s(1),
            ms(200),
            Err(TimingError::NotWholeSeconds("renew interval", ms(200))),
        ),
        (
            ms(1500),
            s(1),
            Err(TimingError::NotWholeSeconds("duration", ms(1500))),
        ),
        (s(0), s(0), Err(TimingError::TooShort("duration"))),
        (s(3), s(0), Err(TimingError::TooShort("renew interval"))),
    ];
    for (duration, renew, want) in cases {
        assert_eq!(
            &lease_params_secs(*duration, *renew),
            want,
            "{duration:?}/{renew:?}"
        );
    }
}

#[test]
fn step_down_table() {
    let cases: &[(Result<bool, &str>, Step)] = &[
        (Ok(true), Step::Publish(true)),
        (Ok(false), Step::Publish(false)),
        // Whatever we believed: an error means we cannot prove we hold the Lease.
        (Err("conflict"), Step::StepDown),
    ];
    for (result, want) in cases {
        assert_eq!(decide(result), *want, "{result:?}");
    }
    let delays: Vec<u64> = (1..=7).map(|n| retry_delay(n).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
    assert_eq!(retry_delay(u32::MAX), Duration::from_secs(30));
}

#[test]
fn bad_timings_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let api = FakeApi::new();
        let mut s = settings("a");
        s.renew = s.duration;
        assert!(Leadership::new(api.client(), s).is_err());
    });
}

/// One replica: its leadership channel and a counter loop started through
/// `run_while_leader`.
struct Replica {
    leadership: Option<Leadership>,
    leader: watch::Receiver<bool>,
    ticks: Arc<AtomicU64>,
    /// Cancellation tokens of the leader-only loops, one per term.
    terms: Arc<std::sync::Mutex<Vec<CancellationToken>>>,
    runner: tokio::task::JoinHandle<()>,
}

fn replica(api: &FakeApi, identity: &str) -> Replica {
    let leadership = Leadership::new(api.client(), settings(identity)).unwrap();
    let leader = leadership.subscribe();
    let (ticks, terms) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(std::sync::Mutex::new(vec![])),
    );
    let runner = tokio::spawn(counter_loop(
        leader.clone(),
        CancellationToken::new(),
        ticks.clone(),
        terms.clone(),
    ));
    Replica {
        leadership: Some(leadership),
        leader,
        ticks,
        terms,
        runner,
    }
}

async fn counter_loop(
    leader: watch::Receiver<bool>,
    shutdown: CancellationToken,
    ticks: Arc<AtomicU64>,
    terms: Arc<std::sync::Mutex<Vec<CancellationToken>>>,
) {
    run_while_leader(leader, shutdown, Duration::from_secs(1), move |token| {
        terms.lock().unwrap().push(token.clone());
        let ticks = ticks.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tick.tick() => { ticks.fetch_add(1, Ordering::SeqCst); }
                }
            }
        }
    })
    .await
}

fn holder(api: &FakeApi) -> Option<String> {
    api.objects_of::<Lease>()
        .into_iter()
        .find(|l| l.metadata.name.as_deref() == Some(LEASE))
        .and_then(|l| l.spec?.holder_identity)
}

/// Waits until `cond` holds, polling every 10 ms; returns how long it took.
async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

async fn grows(ticks: &AtomicU64) -> bool {
    let before = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    ticks.load(Ordering::SeqCst) > before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_failover_after_crash() {
    let api = FakeApi::new();
    let mut a = replica(&api, "replica-a");
    let mut b = replica(&api, "replica-b");

    let elected = until(Duration::from_secs(10), "a leader", || {
        *a.leader.borrow() || *b.leader.borrow()
    })
    .await;
    // Let both settle: exactly one leads, for several renewals.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (la, lb) = (*a.leader.borrow(), *b.leader.borrow());
        assert!(la ^ lb, "exactly one leader (a: {la}, b: {lb})");
    }
    let (leader, follower, leader_id, follower_id) = if *a.leader.borrow() {
        (&mut a, &mut b, "replica-a", "replica-b")
    } else {
        (&mut b, &mut a, "replica-b", "replica-a")
    };
    assert_eq!(holder(&api).as_deref(), Some(leader_id));
    println!("first leader {leader_id} elected after {elected:?}");

    // The leader-only loop runs on the leader only.
    assert!(grows(&leader.ticks).await, "the leader's loop runs");
    assert_eq!(
        follower.ticks.load(Ordering::SeqCst),
        0,
        "the follower's loop never ran"
    );
    assert!(!grows(&follower.ticks).await);

    // Crash: the leader stops renewing without releasing the Lease.
    let crashed = Instant::now();
    drop(leader.leadership.take());
    // Its loops stop as soon as its leadership channel closes.
    until(
        Duration::from_millis(500),
        "the crashed leader's loop to stop",
        || leader.runner.is_finished(),
    )
    .await;
    assert!(
        leader
            .terms
            .lock()
            .unwrap()
            .iter()
            .all(|t| t.is_cancelled())
    );
    let frozen = leader.ticks.load(Ordering::SeqCst);

    let took = until(
        DURATION + Duration::from_secs(3),
        "the follower to take over",
        || *follower.leader.borrow(),
    )
    .await;
    let failover = crashed.elapsed();
    println!(
        "failover to {follower_id}: {failover:?} after the crash (lease {DURATION:?}), wait {took:?}"
    );
    assert!(
        failover <= DURATION + Duration::from_secs(2),
        "failover took {failover:?}"
    );
    assert_eq!(holder(&api).as_deref(), Some(follower_id));
    assert!(grows(&follower.ticks).await, "the new leader's loop runs");
    assert_eq!(leader.ticks.load(Ordering::SeqCst), frozen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_releases_and_follower_takes_over() {
    let api = FakeApi::new();
    let a = replica(&api, "replica-a");
    until(Duration::from_secs(10), "a to lead", || *a.leader.borrow()).await;
    let b = replica(&api, "replica-b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!*b.leader.borrow());

    let Replica {
        leadership,
        mut leader,
        ..
    } = a;
    let stopped = Instant::now();
    leadership.unwrap().stop().await;
    assert!(!*leader.borrow_and_update());
    assert_eq!(holder(&api), None, "released on stop");
    let took = until(DURATION + Duration::from_secs(3), "b to take over", || {
        *b.leader.borrow()
    })
    .await;
    println!(
        "hand-over after a clean stop: {:?} ({took:?})",
        stopped.elapsed()
    );
    assert_eq!(holder(&api).as_deref(), Some("replica-b"));
    assert!(grows(&b.ticks).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_steps_down_when_the_lease_is_taken() {
    let api = FakeApi::new();
    let a = replica(&api, "replica-a");
    until(Duration::from_secs(10), "a to lead", || *a.leader.borrow()).await;
    assert!(grows(&a.ticks).await);

    // Someone else holds the Lease now (e.g. after a partition): a must notice at its next
    // renewal and stop its loops.
    let leases: kube::Api<Lease> = kube::Api::namespaced(api.client(), NS);
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = serde_json::json!({"spec": {
        "holderIdentity": "intruder",
        "acquireTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
        "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
        "leaseDurationSeconds": 30,
    }});
    let taken = Instant::now();
    leases
        .patch(
            LEASE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    until(DURATION + Duration::from_secs(1), "a to step down", || {
        !*a.leader.borrow()
    })
    .await;
    let noticed = taken.elapsed();
    until(
        Duration::from_millis(200),
        "a's loop to be cancelled",
        || a.terms.lock().unwrap().iter().all(|t| t.is_cancelled()),
    )
    .await;
    println!("lost leadership noticed after {noticed:?}");
    assert!(!grows(&a.ticks).await, "no leader-only work after the loss");
}

#[tokio::test]
async fn run_while_leader_follows_the_signal() {
    let (tx, rx) = watch::channel(false);
    let shutdown = CancellationToken::new();
    let ticks = Arc::new(AtomicU64::new(0));
    let terms = Arc::new(std::sync::Mutex::new(vec![]));
    let runner = tokio::spawn(counter_loop(
        rx,
        shutdown.clone(),
        ticks.clone(),
        terms.clone(),
    ));

    assert!(!grows(&ticks).await, "not started while following");
    for term in 1..=3 {
        tx.send_replace(true);
        assert!(grows(&ticks).await, "runs while leading (term {term})");
        let lost = Instant::now();
        tx.send_replace(false);
        until(
            Duration::from_millis(100),
            "the term's token cancelled",
            || {
                terms.lock().unwrap().len() == term
                    && terms.lock().unwrap()[term - 1].is_cancelled()
            },
        )
        .await;
        println!(
            "term {term}: loop cancelled {:?} after the loss",
            lost.elapsed()
        );
        assert!(!grows(&ticks).await, "stopped after the loss (term {term})");
    }
    tx.send_replace(true);
    assert!(grows(&ticks).await);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_millis(500), runner)
        .await
        .expect("returns on shutdown")
        .unwrap();
    assert!(!grows(&ticks).await);
}

mod controllers {
    //! Two real `controller::run` instances gated by leadership, sharing one fake cloud:
    //! only the leader calls the provider, and after the leader crashes the other one
    //! carries on reconciling.

    use super::*;
    use egress_plugin_host::provider::{
        CreateRequest, Instance, Provider, ProviderError, TargetStatus,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, PostParams};
    use proxy_operator::api::{self, Proxy};
    use proxy_operator::controller::{self, Context, Settings};
    use proxy_operator::registry::ProviderRegistry;
    use proxy_operator::testing::fake_provider::FakeProvider;

    /// The shared fake cloud, as seen by one replica: counts that replica's calls.
    struct Counted {
        inner: Arc<FakeProvider>,
        calls: Arc<AtomicU64>,
    }

    use egress_plugin_host::provider::Priority;

    #[async_trait::async_trait]
    impl Provider for Counted {
        fn name(&self) -> &str {
            self.inner.name()
        }
        async fn create_at(
            &self,
            req: &CreateRequest,
            priority: Priority,
        ) -> Result<String, ProviderError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.create_at(req, priority).await
        }
        async fn get_at(&self, id: &str, priority: Priority) -> Result<Instance, ProviderError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.get_at(id, priority).await
        }
        async fn delete_at(&self, id: &str, priority: Priority) -> Result<(), ProviderError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.delete_at(id, priority).await
        }
        async fn list_by_tag_at(
            &self,
            installation: &str,
            priority: Priority,
        ) -> Result<Vec<Instance>, ProviderError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.list_by_tag_at(installation, priority).await
        }
        async fn check(&self) -> Option<Vec<TargetStatus>> {
            self.inner.check().await
        }
    }

    fn settings() -> Settings {
        crate::support::fast_settings("install-test", 200, 300)
    }

    struct Operator {
        leadership: Option<Leadership>,
        leader: watch::Receiver<bool>,
        calls: Arc<AtomicU64>,
        runner: tokio::task::JoinHandle<()>,
    }

    fn operator(api: &FakeApi, fake: &Arc<FakeProvider>, identity: &str) -> Operator {
        let calls = Arc::new(AtomicU64::new(0));
        let registry = ProviderRegistry::new([Arc::new(Counted {
            inner: fake.clone(),
            calls: calls.clone(),
        }) as Arc<dyn Provider>]);
        let ctx = Arc::new(Context::new(api.client(), registry, settings()));
        let leadership = Leadership::new(api.client(), super::settings(identity)).unwrap();
        let leader = leadership.subscribe();
        let runner = tokio::spawn(run_while_leader(
            leader.clone(),
            CancellationToken::new(),
            Duration::from_secs(1),
            move |term| controller::run(ctx.clone(), term.cancelled_owned()),
        ));
        Operator {
            leadership: Some(leadership),
            leader,
            calls,
            runner,
        }
    }

    async fn wait_running(proxies: &Api<Proxy>, name: &str) -> Duration {
        let start = Instant::now();
        loop {
            let p = proxies.get_opt(name).await.unwrap();
            if p.and_then(|p| p.status).and_then(|s| s.state).as_deref() == Some("Running") {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{name} never ran"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_leader_reconciles_and_failover_continues() {
        let api = FakeApi::new();
        let client = api.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (_, crd) in api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let proxies: Api<Proxy> = Api::namespaced(client, NS);
        let fake = Arc::new(FakeProvider::new("fake"));
        let mut a = operator(&api, &fake, "replica-a");
        let mut b = operator(&api, &fake, "replica-b");
        until(Duration::from_secs(10), "a leader", || {
            *a.leader.borrow() || *b.leader.borrow()
        })
        .await;
        let (leader, follower) = if *a.leader.borrow() {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };

        let p1 = Proxy::new("p1", crate::support::fake_spec("z1"));
        proxies.create(&PostParams::default(), &p1).await.unwrap();
        wait_running(&proxies, "p1").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(leader.calls.load(Ordering::SeqCst) > 0);
        assert_eq!(
            follower.calls.load(Ordering::SeqCst),
            0,
            "the follower never called the cloud"
        );
        assert_eq!(fake.created(), 1);

        // Crash the leader: its claim and its controller die together.
        let crashed = Instant::now();
        drop(leader.leadership.take());
        leader.runner.abort();
        let frozen = leader.calls.load(Ordering::SeqCst);

        let p2 = Proxy::new("p2", crate::support::fake_spec("z1"));
        proxies.create(&PostParams::default(), &p2).await.unwrap();
        wait_running(&proxies, "p2").await;
        println!(
            "p2 running {:?} after the leader crashed",
            crashed.elapsed()
        );
        assert!(*follower.leader.borrow());
        assert!(
            follower.calls.load(Ordering::SeqCst) > 0,
            "the new leader reconciles"
        );
        assert_eq!(leader.calls.load(Ordering::SeqCst), frozen);
        // p1 was adopted, not created again.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(fake.created(), 2);
        let p1 = proxies.get("p1").await.unwrap();
        assert_eq!(p1.status.and_then(|s| s.state).as_deref(), Some("Running"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_steps_down_on_renewal_errors_and_recovers() {
    let api = FakeApi::new();
    let a = replica(&api, "replica-a");
    until(Duration::from_secs(10), "a to lead", || *a.leader.borrow()).await;
    assert!(grows(&a.ticks).await);

    // The API server refuses the next writes and reads of the Lease: a cannot renew, so it
    // must stop acting as leader rather than trust its last renewal.
    let unavailable = || fake_kube::ApiError::new(503, "ServiceUnavailable", "injected");
    api.inject_error("patch", "leases", unavailable(), 2);
    api.inject_error("get", "leases", unavailable(), 1);
    let failed = Instant::now();
    until(DURATION + Duration::from_secs(1), "a to step down", || {
        !*a.leader.borrow()
    })
    .await;
    let stepped = failed.elapsed();
    until(
        Duration::from_millis(200),
        "a's loop to be cancelled",
        || a.terms.lock().unwrap().iter().all(|t| t.is_cancelled()),
    )
    .await;
    // Once the API answers again it claims the Lease anew and restarts its loops.
    let back = until(Duration::from_secs(10), "a to lead again", || {
        *a.leader.borrow()
    })
    .await;
    println!(
        "stepped down {stepped:?} after the API started failing; leading again {back:?} later"
    );
    assert!(grows(&a.ticks).await);
    assert_eq!(a.terms.lock().unwrap().len(), 2, "a second term");
    assert_eq!(holder(&api).as_deref(), Some("replica-a"));
}
