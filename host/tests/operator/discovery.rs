//! The discovery API end to end: the real router served over HTTP on 127.0.0.1, its store
//! filled by a reflector watching the in-memory Kubernetes API (fake-kube), and auth
//! reviews answered by fake-kube's programmed TokenReview and SubjectAccessReview.

use crate::support;

use fake_kube::{AccessRule, ApiError, FakeApi, UserInfo};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxy_operator::api::{self, CloudInit, Placement, Proxy, ProxySpec};
use proxy_operator::discovery::{self, Auth, AuthSettings};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

const ADMIN: &str = "admin-token-0123456789";
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// A tiny HTTP client

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Value,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

async fn call(addr: SocketAddr, path: &str, token: Option<&str>) -> Answer {
    call_with(addr, path, token.map(|t| format!("Bearer {t}")).as_deref()).await
}

async fn call_with(addr: SocketAddr, path: &str, authorization: Option<&str>) -> Answer {
    let a = support::http::request(addr, path, authorization).await;
    let body = serde_json::from_str(&a.body).unwrap_or_else(|_| {
        panic!(
            "{path}: {} with a body that is not JSON: {:?}",
            a.status, a.body
        )
    });
    Answer {
        status: a.status,
        headers: a.headers,
        body,
    }
}

fn names(a: &Answer) -> Vec<String> {
    assert_eq!(a.status, 200, "{a:?}");
    a.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap(),
                p["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// `namespace`, `name` and the rest of a query string, percent-encoded where needed.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// A fake cluster with proxies

#[derive(Clone)]
struct Seed {
    ns: &'static str,
    name: &'static str,
    provider: &'static str,
    region: &'static str,
    zone: &'static str,
    labels: &'static [(&'static str, &'static str)],
    /// Ready condition status, ip; None: no status at all.
    status: Option<(&'static str, Option<&'static str>)>,
}

fn seed(
    ns: &'static str,
    name: &'static str,
    provider: &'static str,
    region: &'static str,
    zone: &'static str,
) -> Seed {
    Seed {
        ns,
        name,
        provider,
        region,
        zone,
        labels: &[],
        status: Some(("True", Some("192.0.2.10"))),
    }
}

impl Seed {
    fn labels(mut self, l: &'static [(&'static str, &'static str)]) -> Self {
        self.labels = l;
        self
    }
    fn status(mut self, ready: &'static str, ip: Option<&'static str>) -> Self {
        self.status = Some((ready, ip));
        self
    }
    fn no_status(mut self) -> Self {
        self.status = None;
        self
    }
}

struct Env {
    api: FakeApi,
    addr: SocketAddr,
    client: kube::Client,
}

const T0: &str = "2026-11-01T10:00:00Z";

impl Env {
    /// A fake cluster with the CRDs, namespaces team-a and team-b, tokens for admin (may
    /// get/list proxies anywhere), alice (team-a only) and bob (nothing), and the discovery
    /// API served with auth on.
    async fn start() -> Env {
        Self::start_with(|client| {
            Auth::Kubernetes(
                client,
                AuthSettings {
                    ttl: Duration::from_secs(60),
                    ..Default::default()
                },
            )
        })
        .await
    }

    async fn start_with(auth: impl FnOnce(kube::Client) -> Auth) -> Env {
        let api = FakeApi::new();
        let client = api.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (_, crd) in api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let nss: Api<Namespace> = Api::all(client.clone());
        for ns in ["team-a", "team-b"] {
            let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
            nss.create(&PostParams::default(), &n).await.unwrap();
        }
        api.add_token(ADMIN, UserInfo::new("admin"));
        api.add_token(ALICE, UserInfo::new("alice"));
        api.add_token(BOB, UserInfo::new("bob"));
        api.allow(AccessRule::user("admin", ["get", "list"], ["proxies"]));
        api.allow(AccessRule {
            users: vec!["alice".into()],
            verbs: vec!["get".into(), "list".into()],
            api_groups: vec![api::GROUP.into()],
            resources: vec!["proxies".into()],
            namespaces: vec!["team-a".into()],
            ..Default::default()
        });
        let (cache, reflect) = discovery::proxy_reflector(client.clone());
        tokio::spawn(reflect);
        let auth = auth(client.clone());
        let router = discovery::router(cache, auth);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(discovery::serve(listener, router, std::future::pending()));
        Env { api, addr, client }
    }

    async fn add(&self, s: &Seed) {
        let proxies: Api<Proxy> = Api::namespaced(self.client.clone(), s.ns);
        let mut p = Proxy::new(
            s.name,
            ProxySpec {
                provider: s.provider.into(),
                placement: Placement {
                    region: s.region.into(),
                    zone: s.zone.into(),
                    machine_type: "small".into(),
                    image: "debian-12".into(),
                    capacity: Default::default(),
                },
                cloud_init: CloudInit {
                    inline: Some("#cloud-config\n".into()),
                    secret_key_ref: None,
                },
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some(s.ns.into());
        p.metadata.labels = Some(
            s.labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
        if let Some((ready, ip)) = s.status {
            let healthy = ready;
            let cond = |t: &str, st: &str, reason: &str, msg: &str| {
                json!({"type": t, "status": st, "reason": reason, "message": msg,
                       "lastTransitionTime": T0, "observedGeneration": 1})
            };
            let mut status = json!({
                "providerID": format!("id-{}", s.name),
                "port": 3128,
                "state": if ready == "True" { "Running" } else { "Provisioning" },
                "conditions": [
                    cond("Provisioned", "True", "Running", ""),
                    cond("Healthy", healthy, if healthy == "True" { "ProbeSucceeded" } else { "ProbeFailed" }, ""),
                    cond("Ready", ready,
                         if ready == "True" { "Ready" } else { "Unhealthy" },
                         if ready == "True" { "" } else { "CONNECT through the proxy timed out" }),
                ],
                "lastProbe": if ready == "True" {
                    json!({"time": T0, "latencyMs": 42})
                } else {
                    json!({"time": T0, "error": "timeout"})
                },
            });
            if let Some(ip) = ip {
                status["ip"] = json!(ip);
            }
            proxies
                .patch_status(
                    s.name,
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(json!({
                        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
                        "kind": "Proxy",
                        "status": status,
                    })),
                )
                .await
                .unwrap();
        }
    }

    /// Polls `path` as admin until `f` accepts the answer.
    async fn until(&self, path: &str, f: impl Fn(&Answer) -> bool) -> Answer {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let a = call(self.addr, path, Some(ADMIN)).await;
            if f(&a) {
                return a;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path}: gave up waiting; last answer {a:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Adds the seeds and waits until the API shows `ready` Ready proxies.
    async fn fill(&self, seeds: &[Seed], ready: usize) {
        for s in seeds {
            self.add(s).await;
        }
        self.until("/v1/proxies", |a| {
            a.status == 200 && a.body["items"].as_array().unwrap().len() == ready
        })
        .await;
    }

    fn reviews(&self, resource: &str) -> usize {
        self.api
            .requests()
            .iter()
            .filter(|r| r.resource.as_deref() == Some(resource) && r.verb == "create")
            .count()
    }
}

/// The standard cluster: five Ready proxies and five that must not be listed.
fn standard() -> (Vec<Seed>, usize) {
    let seeds = vec![
        seed("team-a", "a1", "hetzner", "eu", "fsn1")
            .labels(&[("tier", "gold"), ("egress.example.com/pool", "scraping")]),
        seed("team-a", "a2", "hetzner", "eu", "nbg1").labels(&[("tier", "silver")]),
        seed("team-a", "a3", "ec2", "us-east-1", "us-east-1a")
            .labels(&[("tier", "gold"), ("rank", "7")]),
        seed("team-b", "b1", "ec2", "eu-west-1", "eu-west-1a")
            .labels(&[("tier", "bronze"), ("rank", "2")]),
        seed("team-b", "b2", "hetzner", "eu", "fsn1"),
        // Not Ready: unhealthy, no status yet, Ready without an IP, Unknown.
        seed("team-a", "x-unhealthy", "hetzner", "eu", "fsn1")
            .labels(&[("tier", "gold")])
            .status("False", Some("192.0.2.99")),
        seed("team-a", "x-new", "hetzner", "eu", "fsn1").no_status(),
        seed("team-b", "x-noip", "ec2", "eu-west-1", "eu-west-1a").status("True", None),
        seed("team-b", "x-unknown", "ec2", "eu-west-1", "eu-west-1a").status("Unknown", None),
    ];
    (seeds, 5)
}

async fn standard_env() -> Env {
    let env = Env::start().await;
    let (seeds, ready) = standard();
    env.fill(&seeds, ready).await;
    env
}

// ---------------------------------------------------------------------------------------
// Listing, filters, selectors

#[tokio::test]
async fn lists_only_ready_proxies_sorted_with_their_fields() {
    let env = standard_env().await;
    let a = call(env.addr, "/v1/proxies", Some(ADMIN)).await;
    assert_eq!(
        names(&a),
        [
            "team-a/a1",
            "team-a/a2",
            "team-a/a3",
            "team-b/b1",
            "team-b/b2"
        ]
    );
    assert_eq!(a.headers["content-type"], "application/json");
    assert_eq!(a.headers["cache-control"], "no-store");
    assert_eq!(
        a.body["items"][0],
        json!({
            "namespace": "team-a",
            "name": "a1",
            "provider": "hetzner",
            "region": "eu",
            "zone": "fsn1",
            "ip": "192.0.2.10",
            "port": 3128,
            "address": "192.0.2.10:3128",
            "ipFamily": "IPv4",
            "ready": true,
            "healthy": true,
            "state": "Running",
            "lastProbe": {"time": T0, "latencyMs": 42},
        })
    );

    // A Proxy being deleted leaves the list at once (its instance is about to go away).
    let proxies: Api<Proxy> = Api::namespaced(env.client.clone(), "team-b");
    proxies
        .patch(
            "b2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["test/hold"]}})),
        )
        .await
        .unwrap();
    proxies
        .delete("b2", &DeleteParams::default())
        .await
        .unwrap();
    let a = env
        .until("/v1/proxies", |a| {
            a.body["items"].as_array().is_some_and(|i| i.len() == 4)
        })
        .await;
    assert!(!names(&a).contains(&"team-b/b2".to_string()));
    let one = call(env.addr, "/v1/proxies/team-b/b2", Some(ADMIN)).await;
    assert_eq!(
        (one.status, &one.body["ready"], &one.body["reason"]),
        (200, &json!(false), &json!("Deleting"))
    );
}

#[tokio::test]
async fn filters_combine() {
    let env = standard_env().await;
    let table: &[(&str, &[&str])] = &[
        ("namespace=team-a", &["team-a/a1", "team-a/a2", "team-a/a3"]),
        ("namespace=team-b", &["team-b/b1", "team-b/b2"]),
        ("namespace=nowhere", &[]),
        ("provider=hetzner", &["team-a/a1", "team-a/a2", "team-b/b2"]),
        ("region=eu", &["team-a/a1", "team-a/a2", "team-b/b2"]),
        ("zone=fsn1", &["team-a/a1", "team-b/b2"]),
        (
            "namespace=team-a&provider=hetzner&region=eu&zone=nbg1",
            &["team-a/a2"],
        ),
        ("provider=ec2&region=eu-west-1", &["team-b/b1"]),
        // Empty values mean "no filter".
        (
            "namespace=&zone=",
            &[
                "team-a/a1",
                "team-a/a2",
                "team-a/a3",
                "team-b/b1",
                "team-b/b2",
            ],
        ),
    ];
    for (q, want) in table {
        let a = call(env.addr, &format!("/v1/proxies?{q}"), Some(ADMIN)).await;
        assert_eq!(names(&a), *want, "{q}");
    }
}

#[tokio::test]
async fn label_selectors_follow_kubernetes_and_malformed_ones_are_400() {
    let env = standard_env().await;
    let table: &[(&str, &[&str])] = &[
        ("tier=gold", &["team-a/a1", "team-a/a3"]),
        ("tier==gold", &["team-a/a1", "team-a/a3"]),
        ("tier!=gold", &["team-a/a2", "team-b/b1", "team-b/b2"]),
        (
            "tier in (gold, bronze)",
            &["team-a/a1", "team-a/a3", "team-b/b1"],
        ),
        ("tier notin (gold,bronze)", &["team-a/a2", "team-b/b2"]),
        (
            "tier",
            &["team-a/a1", "team-a/a2", "team-a/a3", "team-b/b1"],
        ),
        ("!tier", &["team-b/b2"]),
        ("rank>5", &["team-a/a3"]),
        ("rank<5", &["team-b/b1"]),
        ("tier=gold,rank", &["team-a/a3"]),
        ("egress.example.com/pool=scraping", &["team-a/a1"]),
        ("tier in (gold),!rank", &["team-a/a1"]),
        (
            "",
            &[
                "team-a/a1",
                "team-a/a2",
                "team-a/a3",
                "team-b/b1",
                "team-b/b2",
            ],
        ),
    ];
    for (sel, want) in table {
        let path = format!("/v1/proxies?labelSelector={}", enc(sel));
        let a = call(env.addr, &path, Some(ADMIN)).await;
        assert_eq!(names(&a), *want, "{sel:?}");
    }
    // Combined with the other filters.
    let a = call(
        env.addr,
        &format!(
            "/v1/proxies?namespace=team-a&labelSelector={}",
            enc("tier=gold")
        ),
        Some(ADMIN),
    )
    .await;
    assert_eq!(names(&a), ["team-a/a1", "team-a/a3"]);

    for (sel, needle) in [
        ("tier in (gold", "expected a value"),
        ("tier in ()", "empty"),
        ("tier gold", "operator"),
        ("=gold", "label key"),
        ("Bad_Prefix.Example/x=y", "invalid label key"),
        ("rank>high", "integer"),
    ] {
        let a = call(
            env.addr,
            &format!("/v1/proxies?labelSelector={}", enc(sel)),
            Some(ADMIN),
        )
        .await;
        assert_eq!(a.status, 400, "{sel:?}: {a:?}");
        assert_eq!(a.body["error"], "BadRequest");
        assert_eq!(a.body["parameter"], "labelSelector");
        assert_eq!(a.body["value"], *sel);
        let msg = a.body["message"].as_str().unwrap();
        assert!(
            msg.starts_with(&format!("invalid labelSelector {sel:?}")) && msg.contains(needle),
            "{sel:?}: {msg}"
        );
    }
    // Other bad parameters.
    for (q, param) in [
        ("labelselector=tier", "labelselector"),
        ("zone=a&zone=b", "zone"),
        ("namespace=Team_A", "namespace"),
        ("provider=UPPER", "provider"),
    ] {
        let a = call(env.addr, &format!("/v1/proxies?{q}"), Some(ADMIN)).await;
        assert_eq!(
            (a.status, a.body["parameter"].as_str()),
            (400, Some(param)),
            "{q}: {a:?}"
        );
    }
    let a = call(
        env.addr,
        "/v1/proxies:pick?labelSelector=a%20in%20(",
        Some(ADMIN),
    )
    .await;
    assert_eq!(
        (a.status, &a.body["parameter"]),
        (400, &json!("labelSelector"))
    );
}

// ---------------------------------------------------------------------------------------
// One Proxy

#[tokio::test]
async fn get_one_answers_ready_or_not_and_404_when_absent() {
    let env = standard_env().await;
    let a = call(env.addr, "/v1/proxies/team-a/a3", Some(ADMIN)).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        (
            &a.body["ready"],
            &a.body["ip"],
            &a.body["provider"],
            &a.body["zone"]
        ),
        (
            &json!(true),
            &json!("192.0.2.10"),
            &json!("ec2"),
            &json!("us-east-1a")
        )
    );
    assert!(a.body.get("reason").is_none());

    let a = call(env.addr, "/v1/proxies/team-a/x-unhealthy", Some(ADMIN)).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        a.body,
        json!({
            "namespace": "team-a", "name": "x-unhealthy", "provider": "hetzner",
            "region": "eu", "zone": "fsn1", "ip": "192.0.2.99", "port": 3128,
            "address": "192.0.2.99:3128", "ipFamily": "IPv4",
            "ready": false, "healthy": false, "state": "Provisioning",
            "reason": "Unhealthy", "message": "CONNECT through the proxy timed out",
            "lastProbe": {"time": T0, "latencyMs": null, "error": "timeout"},
        })
    );
    let a = call(env.addr, "/v1/proxies/team-a/x-new", Some(ADMIN)).await;
    assert_eq!(
        (
            a.status,
            &a.body["ready"],
            &a.body["reason"],
            &a.body["ip"],
            &a.body["state"]
        ),
        (
            200,
            &json!(false),
            &json!("NotReconciled"),
            &Value::Null,
            &Value::Null
        )
    );
    let a = call(env.addr, "/v1/proxies/team-b/x-noip", Some(ADMIN)).await;
    assert_eq!(
        (&a.body["ready"], &a.body["reason"]),
        (&json!(false), &json!("NoAddress"))
    );

    for path in ["/v1/proxies/team-a/nope", "/v1/proxies/team-c/a1"] {
        let a = call(env.addr, path, Some(ADMIN)).await;
        assert_eq!(
            (a.status, &a.body["error"]),
            (404, &json!("NotFound")),
            "{path}"
        );
    }
    let a = call(env.addr, "/v1/proxies/team-a/a1?zone=x", Some(ADMIN)).await;
    assert_eq!((a.status, &a.body["parameter"]), (400, &json!("zone")));
    let a = call(env.addr, "/v2/nothing", Some(ADMIN)).await;
    assert_eq!(a.status, 404);
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .contains("no route GET /v2/nothing")
    );
}

// ---------------------------------------------------------------------------------------
// Pick

#[tokio::test]
async fn pick_spreads_load_least_recently_given() {
    let env = standard_env().await;
    // Over a fixed set: strict rotation in name order, each proxy equally often.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut order = Vec::new();
    for _ in 0..30 {
        let a = call(env.addr, "/v1/proxies:pick", Some(ADMIN)).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.headers["cache-control"], "no-store");
        assert_eq!(a.body["ready"], true);
        let n = format!(
            "{}/{}",
            a.body["namespace"].as_str().unwrap(),
            a.body["name"].as_str().unwrap()
        );
        *counts.entry(n.clone()).or_default() += 1;
        order.push(n);
    }
    assert_eq!(counts.len(), 5, "{counts:?}");
    assert!(counts.values().all(|&c| c == 6), "{counts:?}");
    assert_eq!(
        &order[..5],
        [
            "team-a/a1",
            "team-a/a2",
            "team-a/a3",
            "team-b/b1",
            "team-b/b2"
        ]
    );
    for w in order.chunks(5) {
        assert_eq!(w, &order[..5], "every round goes in the same order");
    }

    // With a filter: only matching ones, still spread evenly.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..12 {
        let a = call(
            env.addr,
            "/v1/proxies:pick?region=eu&labelSelector=tier",
            Some(ADMIN),
        )
        .await;
        *counts
            .entry(a.body["name"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("a1".to_string(), 6), ("a2".to_string(), 6)])
    );

    // A proxy that becomes Ready is handed out next.
    env.add(&seed("team-b", "b3", "hetzner", "eu", "fsn1"))
        .await;
    env.until("/v1/proxies?namespace=team-b", |a| {
        a.body["items"].as_array().is_some_and(|i| i.len() == 3)
    })
    .await;
    let a = call(env.addr, "/v1/proxies:pick", Some(ADMIN)).await;
    assert_eq!(a.body["name"], "b3");

    // Nothing matches: 404.
    let a = call(env.addr, "/v1/proxies:pick?provider=gcp", Some(ADMIN)).await;
    assert_eq!(
        (a.status, &a.body["error"]),
        (404, &json!("NotFound")),
        "{a:?}"
    );
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .contains("no Ready proxy")
    );
}

// ---------------------------------------------------------------------------------------
// Auth

#[tokio::test]
async fn missing_or_invalid_tokens_are_401_with_www_authenticate() {
    let env = standard_env().await;
    for (auth, invalid) in [
        (None, false),
        (Some("Bearer"), false),
        (Some("Bearer "), false),
        (Some("Basic YWRtaW46YWRtaW4="), false),
        (Some("Bearer not-a-known-token"), true),
    ] {
        for path in [
            "/v1/proxies",
            "/v1/proxies/team-a/a1",
            "/v1/proxies:pick",
            "/v1/proxies?labelSelector=%3D",
        ] {
            let a = call_with(env.addr, path, auth).await;
            assert_eq!(a.status, 401, "{auth:?} {path}: {a:?}");
            assert_eq!(a.body["error"], "Unauthorized");
            let www = a.headers["www-authenticate"].to_str().unwrap();
            assert!(www.starts_with("Bearer realm="), "{www}");
            assert_eq!(www.contains("invalid_token"), invalid, "{www}");
        }
    }
    // The OpenAPI document needs no token.
    assert_eq!(call(env.addr, "/openapi.json", None).await.status, 200);
}

#[tokio::test]
async fn access_is_decided_by_subject_access_review_per_namespace() {
    let env = standard_env().await;
    // bob is authenticated but allowed nothing: 403 carrying the review's reason.
    let a = call(env.addr, "/v1/proxies", Some(BOB)).await;
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(a.body["error"], "Forbidden");
    assert_eq!(a.body["reason"], "no fake-kube rule allows it");
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .contains("User \"bob\" cannot list resource \"proxies\""),
        "{a:?}"
    );

    // alice may list and get in team-a only.
    let cases: &[(&str, u16)] = &[
        ("/v1/proxies", 403),
        ("/v1/proxies?namespace=team-a", 200),
        ("/v1/proxies?namespace=team-b", 403),
        ("/v1/proxies:pick", 403),
        ("/v1/proxies:pick?namespace=team-a", 200),
        ("/v1/proxies/team-a/a1", 200),
        ("/v1/proxies/team-a/missing", 404),
        ("/v1/proxies/team-b/b1", 403),
        // Not allowed to know whether it exists.
        ("/v1/proxies/team-b/missing", 403),
    ];
    for (path, want) in cases {
        let a = call(env.addr, path, Some(ALICE)).await;
        assert_eq!(a.status, *want, "{path}: {a:?}");
    }
    let a = call(env.addr, "/v1/proxies?namespace=team-a", Some(ALICE)).await;
    assert_eq!(names(&a), ["team-a/a1", "team-a/a2", "team-a/a3"]);
    let a = call(env.addr, "/v1/proxies", Some(ALICE)).await;
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .contains("all namespaces"),
        "{a:?}"
    );

    // A SAR answer is per verb: get-only rights do not allow listing.
    env.api
        .add_token("carol-token-0123456789", UserInfo::new("carol"));
    env.api
        .allow(AccessRule::user("carol", ["get"], ["proxies"]));
    let carol = Some("carol-token-0123456789");
    assert_eq!(
        call(env.addr, "/v1/proxies/team-b/b1", carol).await.status,
        200
    );
    assert_eq!(
        call(env.addr, "/v1/proxies?namespace=team-b", carol)
            .await
            .status,
        403
    );

    // Group membership counts, as with RBAC.
    env.api.add_token(
        "dave-token-0123456789",
        UserInfo::new("dave").with_groups(["system:authenticated", "proxy-readers"]),
    );
    env.api.allow(AccessRule {
        groups: vec!["proxy-readers".into()],
        verbs: vec!["list".into()],
        resources: vec!["proxies".into()],
        ..Default::default()
    });
    assert_eq!(
        call(env.addr, "/v1/proxies", Some("dave-token-0123456789"))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn reviews_are_cached_per_token_within_the_ttl() {
    const TTL: Duration = Duration::from_secs(3);
    let env = Env::start_with(|client| {
        Auth::Kubernetes(
            client,
            AuthSettings {
                ttl: TTL,
                ..Default::default()
            },
        )
    })
    .await;
    let (seeds, ready) = standard();
    env.fill(&seeds, ready).await;
    // `fill` used the admin token only; alice's and the wrong token are fresh.
    env.api.clear_requests();
    let started = std::time::Instant::now();

    for _ in 0..10 {
        assert_eq!(call(env.addr, "/v1/proxies", Some(ALICE)).await.status, 403);
        assert_eq!(
            call(env.addr, "/v1/proxies?namespace=team-a", Some(ALICE))
                .await
                .status,
            200
        );
        assert_eq!(
            call(env.addr, "/v1/proxies/team-a/a1", Some(ALICE))
                .await
                .status,
            200
        );
        assert_eq!(
            call(env.addr, "/v1/proxies:pick?namespace=team-a", Some(ALICE))
                .await
                .status,
            200
        );
        assert_eq!(
            call(env.addr, "/v1/proxies", Some("wrong-token"))
                .await
                .status,
            401
        );
    }
    assert!(
        started.elapsed() < TTL,
        "the machine is too slow for this test: 50 calls took longer than the TTL"
    );

    // One TokenReview per token (alice, and the wrong one: negative answers are cached
    // too); one SubjectAccessReview per distinct (verb, namespace, name): list at the
    // cluster scope, list in team-a (collection and pick share it), get team-a/a1; and
    // whether alice may have credentials: in team-a (collection and pick share it), for
    // team-a/a1 (the refused cluster-scope list never gets that far).
    assert_eq!(env.reviews("tokenreviews"), 2);
    assert_eq!(env.reviews("subjectaccessreviews"), 5);
    // Nothing else reached the API server: answers come from the watch cache.
    let other: Vec<_> = env
        .api
        .requests()
        .into_iter()
        .filter(|r| {
            !matches!(
                r.resource.as_deref(),
                Some("tokenreviews" | "subjectaccessreviews")
            )
        })
        .filter(|r| r.verb != "watch")
        .collect();
    assert!(other.is_empty(), "{other:?}");

    // After the TTL, the reviews are made again.
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    assert_eq!(
        call(env.addr, "/v1/proxies?namespace=team-a", Some(ALICE))
            .await
            .status,
        200
    );
    assert_eq!(env.reviews("tokenreviews"), 3);
    assert_eq!(env.reviews("subjectaccessreviews"), 7);
}

#[tokio::test]
async fn review_failures_are_503_and_not_cached() {
    let env = standard_env().await;
    env.api.inject_error(
        "create",
        "tokenreviews",
        ApiError::new(500, "InternalError", "etcd is sad"),
        1,
    );
    let a = call(env.addr, "/v1/proxies", Some(BOB)).await;
    assert_eq!(
        (a.status, &a.body["error"]),
        (503, &json!("ServiceUnavailable")),
        "{a:?}"
    );
    env.api.inject_error(
        "create",
        "subjectaccessreviews",
        ApiError::new(500, "InternalError", "etcd is sad"),
        1,
    );
    let a = call(env.addr, "/v1/proxies", Some(BOB)).await;
    assert_eq!(a.status, 503, "{a:?}");
    let a = call(env.addr, "/v1/proxies", Some(BOB)).await;
    assert_eq!(a.status, 403, "{a:?}");
}

#[tokio::test]
async fn tokens_never_reach_the_logs() {
    let (_guard, logs) = proxy_operator::testing::capture();
    let env = standard_env().await;
    let tokens = [ADMIN, ALICE, BOB, "some-unknown-token-xyz"];
    for t in tokens {
        call(env.addr, "/v1/proxies?namespace=team-a", Some(t)).await;
        call(env.addr, "/v1/proxies/team-a/a1", Some(t)).await;
    }
    let text = logs.all_text();
    assert!(text.contains("access reviewed"), "debug logs were captured");
    for t in tokens {
        assert!(!text.contains(t), "token {t} appears in the logs");
    }
}

#[tokio::test]
async fn auth_can_be_disabled_with_a_loud_warning() {
    let (_guard, logs) = proxy_operator::testing::capture();
    let env = Env::start_with(|_| Auth::DisabledInsecure).await;
    assert!(
        logs.events().iter().any(|e| e.level == tracing::Level::WARN
            && e.message().contains("AUTHENTICATION IS DISABLED")),
        "no startup warning"
    );
    let (seeds, _) = standard();
    for s in &seeds {
        env.add(s).await;
    }
    let a = env
        .until("/v1/proxies", |a| {
            a.body["items"].as_array().is_some_and(|i| i.len() == 5)
        })
        .await;
    assert_eq!(names(&a).len(), 5);
    for path in ["/v1/proxies", "/v1/proxies:pick", "/v1/proxies/team-b/b1"] {
        assert_eq!(call(env.addr, path, None).await.status, 200, "{path}");
        assert_eq!(
            call(env.addr, path, Some("garbage")).await.status,
            200,
            "{path}"
        );
    }
    assert_eq!(
        env.reviews("tokenreviews") + env.reviews("subjectaccessreviews"),
        0
    );
}

#[tokio::test]
async fn an_unsynced_cache_answers_503_not_an_empty_list() {
    let (store, writer) = kube::runtime::reflector::store::<Proxy>();
    let (mark, synced) = proxy_operator::proxy_cache::channel();
    let router = discovery::router(
        discovery::ProxyCache { store, synced },
        Auth::DisabledInsecure,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(discovery::serve(listener, router, std::future::pending()));
    for path in ["/v1/proxies", "/v1/proxies:pick", "/v1/proxies/a/b"] {
        let a = call(addr, path, None).await;
        assert_eq!(
            (a.status, &a.body["error"]),
            (503, &json!("ServiceUnavailable")),
            "{path}"
        );
    }
    drop((writer, mark));
}

// ---------------------------------------------------------------------------------------
// OpenAPI

#[tokio::test]
async fn committed_openapi_document_matches_the_served_one() {
    let env = Env::start_with(|_| Auth::DisabledInsecure).await;
    let served = call(env.addr, "/openapi.json", None).await;
    assert_eq!(served.status, 200);
    assert_eq!(served.headers["content-type"], "application/json");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(discovery::openapi::COMMITTED_PATH);
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, discovery::openapi::document_text()).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == discovery::openapi::document_text()
            && serde_json::from_str::<Value>(&committed).ok() == Some(served.body),
        "{} is out of date with the served document; regenerate it with `{}`",
        path.display(),
        discovery::openapi::REGENERATE
    );
}

/// A small checker for the subset of OpenAPI 3.0 schemas the document uses: `$ref`,
/// `allOf`, `type`, `nullable`, `enum`, `required`, `properties`,
/// `additionalProperties: false`, `items`.
fn check(doc: &Value, schema: &Value, v: &Value, at: &str) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/components/schemas/");
        return check(doc, &doc["components"]["schemas"][name], v, at);
    }
    if v.is_null() {
        assert!(schema["nullable"] == true, "{at}: null but not nullable");
        return;
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            check(doc, s, v, at);
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        assert!(e.contains(v), "{at}: {v} not in {e:?}");
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => assert!(v.is_string(), "{at}: {v} is not a string"),
        Some("integer") => assert!(v.is_i64(), "{at}: {v} is not an integer"),
        Some("boolean") => assert!(v.is_boolean(), "{at}: {v} is not a boolean"),
        Some("array") => {
            for (i, item) in v.as_array().expect(at).iter().enumerate() {
                check(doc, &schema["items"], item, &format!("{at}[{i}]"));
            }
        }
        Some("object") => {
            let obj = v
                .as_object()
                .unwrap_or_else(|| panic!("{at}: {v} is not an object"));
            let props = schema["properties"].as_object();
            for req in schema["required"].as_array().into_iter().flatten() {
                let req = req.as_str().unwrap();
                assert!(obj.contains_key(req), "{at}: required {req} missing in {v}");
            }
            for (k, val) in obj {
                match props.and_then(|p| p.get(k)) {
                    Some(s) => check(doc, s, val, &format!("{at}.{k}")),
                    None => assert!(
                        schema["additionalProperties"] != false,
                        "{at}: {k} is not in the schema"
                    ),
                }
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn answers_match_the_openapi_schemas() {
    let env = standard_env().await;
    let doc = discovery::openapi::document();
    let paths = &doc["paths"];
    let cases: &[(&str, &str, Option<&str>, u16)] = &[
        ("/v1/proxies", "/v1/proxies", Some(ADMIN), 200),
        (
            "/v1/proxies",
            "/v1/proxies?labelSelector=a%20in",
            Some(ADMIN),
            400,
        ),
        ("/v1/proxies", "/v1/proxies", None, 401),
        ("/v1/proxies", "/v1/proxies", Some(BOB), 403),
        ("/v1/proxies:pick", "/v1/proxies:pick", Some(ADMIN), 200),
        (
            "/v1/proxies:pick",
            "/v1/proxies:pick?zone=none",
            Some(ADMIN),
            404,
        ),
        (
            "/v1/proxies/{namespace}/{name}",
            "/v1/proxies/team-a/a1",
            Some(ADMIN),
            200,
        ),
        (
            "/v1/proxies/{namespace}/{name}",
            "/v1/proxies/team-a/x-unhealthy",
            Some(ADMIN),
            200,
        ),
        (
            "/v1/proxies/{namespace}/{name}",
            "/v1/proxies/team-a/x-new",
            Some(ADMIN),
            200,
        ),
        (
            "/v1/proxies/{namespace}/{name}",
            "/v1/proxies/team-a/none",
            Some(ADMIN),
            404,
        ),
        (
            "/v1/proxies/{namespace}/{name}",
            "/v1/proxies/team-b/b1",
            Some(ALICE),
            403,
        ),
    ];
    for (template, path, token, status) in cases {
        let a = call(env.addr, path, *token).await;
        assert_eq!(a.status, *status, "{path}: {a:?}");
        let resp = &paths[template]["get"]["responses"][status.to_string()];
        assert!(resp.is_object(), "{template} documents no {status}");
        let schema = &resp["content"]["application/json"]["schema"];
        check(&doc, schema, &a.body, path);
    }
    // Every documented parameter is accepted.
    for p in doc["components"]["parameters"].as_object().unwrap().keys() {
        let a = call(env.addr, &format!("/v1/proxies?{p}="), Some(ADMIN)).await;
        assert_eq!(a.status, 200, "{p}");
    }
}

// ---------------------------------------------------------------------------------------
// Credentials

const CAROL: &str = "carol-token-0123456789";
const DAVE: &str = "dave-token-0123456789";

/// A Secret with `username` and `password`, as the operator generates for a Proxy: named
/// `<proxy>-credentials` and controlled by the Proxy (discovery gives no other's).
async fn put_credentials(client: &kube::Client, ns: &str, name: &str, user: &str, pass: &str) {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    let proxy = name.strip_suffix("-credentials").unwrap();
    let uid = Api::<Proxy>::namespaced(client.clone(), ns)
        .get(proxy)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let s = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "egress.proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "name": proxy, "uid": uid, "controller": true,
        }]},
        "stringData": {"username": user, "password": pass},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
}

/// Callers get `ip:port`; the credentials only those a SubjectAccessReview allows `get` on
/// `proxies/credentials`: carol in team-a, dave for the Proxy a1 only (so a1's own answer,
/// not lists or picks). A Proxy with `spec.auth.type: None` has none to give. Every
/// review of the credentials permission names the subresource.
#[tokio::test]
async fn credentials_only_for_callers_allowed_proxies_credentials() {
    let env = standard_env().await;
    env.api.add_token(CAROL, UserInfo::new("carol"));
    env.api.add_token(DAVE, UserInfo::new("dave"));
    for user in ["carol", "dave"] {
        env.api.allow(AccessRule {
            users: vec![user.into()],
            verbs: vec!["get".into(), "list".into()],
            resources: vec!["proxies".into()],
            namespaces: vec!["team-a".into()],
            ..Default::default()
        });
    }
    env.api.allow(AccessRule {
        users: vec!["carol".into()],
        verbs: vec!["get".into()],
        api_groups: vec![api::GROUP.into()],
        resources: vec!["proxies/credentials".into()],
        namespaces: vec!["team-a".into()],
        ..Default::default()
    });
    env.api.allow(AccessRule {
        users: vec!["dave".into()],
        verbs: vec!["get".into()],
        resources: vec!["proxies/credentials".into()],
        namespaces: vec!["team-a".into()],
        names: vec!["a1".into()],
        ..Default::default()
    });
    for (name, user, pass) in [
        ("a1", "u-a1", "p-a1"),
        ("a2", "u-a2", "p-a2"),
        ("a3", "u-a3", "p-a3"),
    ] {
        put_credentials(
            &env.client,
            "team-a",
            &format!("{name}-credentials"),
            user,
            pass,
        )
        .await;
    }
    // a3 is open: no credentials even for carol.
    let proxies: Api<Proxy> = Api::namespaced(env.client.clone(), "team-a");
    proxies
        .patch(
            "a3",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"auth": {"type": "None"}}})),
        )
        .await
        .unwrap();
    // The spec change reaches the discovery cache: carol stops getting a3's credentials.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let a = call(env.addr, "/v1/proxies/team-a/a3", Some(CAROL)).await;
        if a.status == 200 && a.body.get("credentials").is_none() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{a:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let creds = |name: &str, a: &Value| -> Value {
        a.get("credentials").cloned().unwrap_or_else(|| {
            assert!(a.get("ip").is_some(), "{name}: {a}");
            Value::Null
        })
    };
    let pair = |u: &str, p: &str| json!({"username": u, "password": p});

    // One Proxy.
    for (token, name, want) in [
        (CAROL, "a1", pair("u-a1", "p-a1")),
        (CAROL, "a2", pair("u-a2", "p-a2")),
        (CAROL, "a3", Value::Null),
        (DAVE, "a1", pair("u-a1", "p-a1")),
        (DAVE, "a2", Value::Null),
        (ALICE, "a1", Value::Null),
        (ADMIN, "a1", Value::Null),
    ] {
        let a = call(env.addr, &format!("/v1/proxies/team-a/{name}"), Some(token)).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.body["ip"], json!("192.0.2.10"), "{token} {name}");
        assert_eq!(creds(name, &a.body), want, "{token} {name}");
    }

    // A list and a pick in team-a: credentials for carol, not for dave (allowed one Proxy
    // only) nor alice.
    let a = call(env.addr, "/v1/proxies?namespace=team-a", Some(CAROL)).await;
    let items = a.body["items"].as_array().unwrap().clone();
    assert_eq!(
        items.iter().map(|i| creds("", i)).collect::<Vec<_>>(),
        [pair("u-a1", "p-a1"), pair("u-a2", "p-a2"), Value::Null]
    );
    for token in [DAVE, ALICE] {
        let a = call(env.addr, "/v1/proxies?namespace=team-a", Some(token)).await;
        assert!(
            a.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .all(|i| i.get("credentials").is_none()),
            "{token}: {a:?}"
        );
        let a = call(env.addr, "/v1/proxies:pick?namespace=team-a", Some(token)).await;
        assert!(
            a.status == 200 && a.body.get("credentials").is_none(),
            "{a:?}"
        );
    }
    let a = call(
        env.addr,
        "/v1/proxies:pick?namespace=team-a&zone=fsn1",
        Some(CAROL),
    )
    .await;
    assert_eq!(creds("pick", &a.body), pair("u-a1", "p-a1"));
    // Outside the namespace carol may read credentials in: a 403 for the list itself.
    assert_eq!(call(env.addr, "/v1/proxies", Some(CAROL)).await.status, 403);

    // (The reviews name the subresource: alice may `get` proxies in team-a, so a review
    // without it would have given her the credentials.)
    // The status page never shows them.
    let page = support::http::get(env.addr, "/status/fragment", Some(ADMIN)).await;
    assert_eq!(page.status, 200);
    for secret in ["u-a1", "p-a1", "u-a2", "p-a2"] {
        assert!(!page.body.contains(secret), "{secret} on the status page");
    }
}

/// With authentication disabled, nobody is known to be allowed credentials: none are
/// handed out.
#[tokio::test]
async fn credentials_are_never_given_with_auth_disabled() {
    let env = Env::start_with(|_| Auth::DisabledInsecure).await;
    env.add(&seed("team-a", "a1", "hetzner", "eu", "fsn1"))
        .await;
    put_credentials(&env.client, "team-a", "a1-credentials", "u", "p").await;
    let a = env
        .until("/v1/proxies/team-a/a1", |a| a.status == 200)
        .await;
    assert!(a.body.get("credentials").is_none(), "{a:?}");
    let a = call(env.addr, "/v1/proxies", None).await;
    assert!(
        a.body["items"][0].get("ip").is_some() && a.body["items"][0].get("credentials").is_none(),
        "{a:?}"
    );
}
