//! Issue 27, items 1 to 3 and the confused deputy: a Proxy's credentials never leave
//! through a plugin, in any form, to anyone; and a Proxy cannot borrow a Secret that was
//! not meant for it.
//!
//! The leak test runs the real `proxy-operator run` binary under the Deployment's limits
//! ([`crate::harness::hostile_operator`]): what it checks is everything a replica writes or
//! serves (the Proxies' status, Events, `ProviderHealth`, `/metrics`, its own log), and
//! only the real process has all of them wired as in production (the provider check
//! monitor publishing `ProviderHealth`, the metrics registry, the log format). The hostile
//! plugin is its only provider, so every reconcile of every Proxy is an attack.
//!
//! The Secret-label test runs the controller in process against fake-kube, with the
//! discovery API served with authentication on: the real binary in these tests serves
//! discovery without authentication, which never hands out credentials at all, so it
//! could not show that an unlabelled Secret's are withheld from a caller who would
//! otherwise get them.

use crate::harness::{HostileOperator, hostile_operator, wait_for};
use crate::support;

use egress_plugin_host::provider::{Op, Provider};
use fake_kube::{AccessRule, FakeApi, UserInfo};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxy_operator::api::{self, ProviderHealth, Proxy, condition};
use proxy_operator::controller::decide::{event, reason};
use proxy_operator::controller::{self, Context, proxy_auth};
use proxy_operator::discovery::{self, Auth, AuthSettings};
use proxy_operator::registry::ProviderRegistry;
use proxy_operator::testing::fake_provider::FakeProvider;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The samples' tinyproxy line: what the hostile plugin reads the credentials from.
const TEMPLATE: &str = "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port {{egress.port}}\n      BasicAuth {{egress.username}} {{egress.password}}\n";

/// A user's password that JSON-escaping and percent-encoding change (a quote, a
/// backslash, a slash, a plus, a percent), so those forms differ from the raw one.
const GIVEN_USER: &str = "SENTINELuser7c1e";
const GIVEN_PASS: &str = "pa\"ss\\w0rd/SENT+INEL%41=9a4f";

/// The base64 characters of `v` inside any encoded text: for each of the three
/// alignments, the characters that depend on `v`'s bytes alone.
fn base64_inside(alphabet: &data_encoding::Encoding, v: &[u8]) -> Vec<String> {
    (0..3usize)
        .map(|offset| {
            let mut buf = vec![b'x'; offset];
            buf.extend_from_slice(v);
            let enc = alphabet.encode(&buf);
            let first = (8 * offset).div_ceil(6);
            let last = (8 * (offset + v.len())) / 6;
            enc[first..last].to_string()
        })
        .collect()
}

fn percent(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every form of one Proxy's credentials a plugin might print, each with what it is.
fn forms(user: &str, pass: &str) -> Vec<(String, String)> {
    let pair = format!("{user}:{pass}");
    let mut out = vec![
        ("username".to_string(), user.to_string()),
        ("password".into(), pass.into()),
        ("user:password".into(), pair.clone()),
        (
            "Basic".into(),
            data_encoding::BASE64.encode(pair.as_bytes()),
        ),
        ("password percent-encoded".into(), percent(pass)),
        ("pair percent-encoded".into(), percent(&pair)),
    ];
    for v in [pass, &pair] {
        let json = serde_json::to_string(v).unwrap();
        out.push(("JSON-escaped".into(), json[1..json.len() - 1].to_string()));
    }
    for (name, alphabet) in [
        ("base64", &data_encoding::BASE64),
        ("url-safe base64", &data_encoding::BASE64URL),
    ] {
        for v in [user, pass, &pair] {
            for (offset, enc) in base64_inside(alphabet, v.as_bytes())
                .into_iter()
                .enumerate()
            {
                out.push((format!("{name} at offset {offset}"), enc));
            }
        }
    }
    out
}

/// The username and password in a Secret.
async fn credentials_in(secrets: &Api<Secret>, name: &str) -> (String, String) {
    let s = secrets.get(name).await.unwrap();
    let data = s.data.unwrap();
    let v = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    (v("username"), v("password"))
}

fn proxy(name: &str, machine: &str, auth: serde_json::Value) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"provider": "hostile",
                 "placement": {"region": "r1", "machineType": machine},
                 "cloudInit": {"inline": TEMPLATE}, "port": 3128, "auth": auth},
    }))
    .unwrap()
}

/// A hostile plugin reads each Proxy's generated (or given) credentials in the cloud-init
/// `create` hands it, and tries every way out: (a) the username, the password or the pair
/// (raw, `Basic`, base64, percent-encoded) as the instance ID; (b) the password base64
/// (standard and URL-safe), `Basic ...`, percent-encoded and JSON-escaped in log lines,
/// stdout, stderr, its error message and its error code; (c) all of them again in a later
/// `check`, in target names, reasons, details and messages. None of them, in any form,
/// reaches a Proxy's status, an Event, `ProviderHealth`, `/metrics` or the operator's log;
/// every ID that held one is refused with "value withheld".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_plugin_cannot_leak_proxy_credentials_in_any_form() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "tok-SENTINEL-hostile").unwrap();
    let entry = format!("  secrets: {{token: {}}}\n", token.display());
    let Some(HostileOperator { fake, client, op }) =
        hostile_operator(&plugin_dir, dir.path(), &entry, &[]).await
    else {
        return;
    };

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let given: Secret = serde_json::from_value(json!({
        "metadata": {"name": "given",
                     "labels": {proxy_auth::CREDENTIALS_LABEL: proxy_auth::CREDENTIALS_LABEL_VALUE}},
        "stringData": {"username": GIVEN_USER, "password": GIVEN_PASS},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &given)
        .await
        .unwrap();
    let generated = json!({});
    let user_secret = json!({"type": "Secret", "secretName": "given"});
    // (a): each form as the ID; (b): `creds-leak`.
    let id_forms = [
        "username",
        "password",
        "pair",
        "basic",
        "base64",
        "base64url",
        "percent",
    ];
    let mut cases: Vec<(String, String, &serde_json::Value)> = id_forms
        .iter()
        .map(|f| (format!("id-{f}"), format!("creds-id:{f}"), &generated))
        .collect();
    cases.push(("leak".into(), "creds-leak".into(), &generated));
    cases.push(("given-leak".into(), "creds-leak".into(), &user_secret));
    cases.push(("given-id".into(), "creds-id:percent".into(), &user_secret));
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    for (name, machine, auth) in &cases {
        proxies
            .create(
                &PostParams::default(),
                &proxy(name, machine, (*auth).clone()),
            )
            .await
            .unwrap();
    }

    // Every ID reply was refused as holding a secret, value withheld: in the reconcile's
    // error in the log, and (below) on the Proxy.
    for (name, machine, _) in cases.iter().filter(|(_, m, _)| m.starts_with("creds-id:")) {
        wait_for(
            &format!("{name}'s ID refused"),
            Duration::from_secs(60),
            async || {
                let log = op.log();
                log.lines()
                    .any(|l| {
                        l.contains(&format!("proxy.name=\"{name}\""))
                            && l.contains("plugin reply rejected: id holds a secret")
                            && l.contains("value withheld")
                    })
                    .then_some(())
            },
        )
        .await;
        let p = proxies.get(name).await.unwrap();
        let status = p.status.clone().unwrap_or_default();
        assert_eq!(status.provider_id, None, "{name} ({machine}): {status:?}");
    }
    // Every create failed Transient (the refused IDs, and the leaks' own errors), and a
    // Transient failure is said on the Proxy (issue 27): `Provisioned=False ProviderError`
    // naming the create and what the provider said, and a Warning Event with that text.
    // Neither holds the Proxy's credentials in any form.
    for (name, machine, auth) in &cases {
        let p = wait_for(
            &format!("{name}'s create failure on the Proxy"),
            Duration::from_secs(60),
            async || {
                let p = proxies.get(name).await.ok()?;
                let said = p
                    .condition(condition::PROVISIONED)
                    .is_some_and(|c| c.reason == reason::PROVIDER_ERROR);
                let warned = fake.objects("events.events.k8s.io").iter().any(|e| {
                    e["regarding"]["name"] == name.as_str() && e["reason"] == event::PROVIDER_ERROR
                });
                (said && warned).then_some(p)
            },
        )
        .await;
        let c = p.condition(condition::PROVISIONED).unwrap();
        assert!(
            c.status == "False" && c.message.contains("provider \"hostile\" create"),
            "{name}: {c:?}"
        );
        let told = if machine.starts_with("creds-id:") {
            c.message
                .contains("plugin reply rejected: id holds a secret")
                && c.message.contains("value withheld")
        } else {
            c.message.contains("backend refused") && c.message.contains("[REDACTED]")
        };
        assert!(told, "{name}: {c:?}");
        let notes: Vec<String> = fake
            .objects("events.events.k8s.io")
            .iter()
            .filter(|e| {
                e["regarding"]["name"] == name.as_str() && e["reason"] == event::PROVIDER_ERROR
            })
            .map(|e| {
                assert_eq!(e["type"], "Warning", "{e:#}");
                e["note"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        assert!(
            notes.iter().any(|n| c.message.starts_with(n.as_str())),
            "{name}: the Event says what the condition says: {notes:?} / {c:?}"
        );
        let (user, pass) = if auth.get("type").is_none() {
            credentials_in(&secrets, &format!("{name}-credentials")).await
        } else {
            (GIVEN_USER.to_string(), GIVEN_PASS.to_string())
        };
        for (what, form) in forms(&user, &pass) {
            for text in std::iter::once(&c.message).chain(&notes) {
                assert!(
                    !text.contains(&form),
                    "{name}: {what} of its credentials ({form}) in {text:?}"
                );
            }
        }
    }
    // The leaks reached the log, scrubbed.
    wait_for("the leaks, scrubbed", Duration::from_secs(60), async || {
        let log = op.log();
        (log.contains("backend refused") && log.contains("sending Authorization: [REDACTED]"))
            .then_some(())
    })
    .await;
    // (c): a check after the creates published the stashed credentials' targets.
    let health: Api<ProviderHealth> = Api::all(client.clone());
    let published = wait_for(
        "ProviderHealth with the check's leaks",
        Duration::from_secs(60),
        async || {
            let h = health.get_opt("hostile").await.ok()??;
            let targets = &h.status.as_ref()?.targets;
            (targets.iter().any(|t| t.target == "creds1")
                && targets
                    .iter()
                    .filter(|t| t.target.starts_with("invalid#"))
                    .count()
                    >= 4)
                .then_some(h)
        },
    )
    .await;
    let creds0 = published
        .status
        .as_ref()
        .unwrap()
        .targets
        .iter()
        .find(|t| t.target == "creds0")
        .unwrap()
        .clone();
    assert_eq!(creds0.reason, "Unknown", "{creds0:?}");
    assert_eq!(
        creds0.message,
        proxy_operator::provider_check::NOT_READY_MESSAGE,
        "no plugin text in ProviderHealth"
    );
    assert!(
        creds0.details.is_empty(),
        "every detail held a credential: {creds0:?}"
    );

    // Everything the replica wrote, published, exported and logged.
    let mut seen = String::new();
    for p in proxies.list(&Default::default()).await.unwrap() {
        seen += &serde_json::to_string(&p).unwrap();
    }
    for e in fake.objects("events.events.k8s.io") {
        seen += &e.to_string();
    }
    for e in fake.objects("events") {
        seen += &e.to_string();
    }
    for h in health.list(&Default::default()).await.unwrap() {
        seen += &serde_json::to_string(&h).unwrap();
    }
    let (code, metrics) = op.get("/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics
            .contains("proxy_operator_provider_target_up{provider=\"hostile\",target=\"creds0\"}"),
        "{metrics}"
    );
    seen += &metrics;
    seen += &op.log();

    let mut all = vec![(GIVEN_USER.to_string(), GIVEN_PASS.to_string())];
    for (name, _, auth) in &cases {
        if auth.get("type").is_none() {
            all.push(credentials_in(&secrets, &format!("{name}-credentials")).await);
        }
    }
    for (user, pass) in &all {
        for (what, form) in forms(user, pass) {
            assert!(
                !seen.contains(&form),
                "{what} of {user}'s credentials ({form}) leaked:\n{seen}"
            );
        }
    }
    assert!(
        !seen.contains("tok-SENTINEL-hostile"),
        "the provider's own secret leaked"
    );
}

/// `spec.auth: {type: Secret, secretName: X}` uses X only when X carries the label
/// `egress.proxy-operator.dev/proxy-credentials: "true"`. Unlabelled, the Proxy says why
/// (naming the Secret and the label), its values reach neither the provider (nothing is
/// created, so nothing rendered) nor a discovery caller allowed `proxies/credentials` but
/// not Secrets; and a Proxy whose generated Secret's name is someone else's Secret gets
/// no credentials from discovery either. Labelled, the same Proxy goes on and discovery
/// gives its credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_secret_labelled_for_proxies_gives_a_proxy_its_credentials() {
    const CAROL: &str = "carol-token-0123456789";
    let fake = FakeApi::new();
    let client = fake.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    // Carol may read Proxies and their credentials in team-a, and nothing else: no Secret.
    fake.add_token(CAROL, UserInfo::new("carol"));
    fake.allow(AccessRule {
        users: vec!["carol".into()],
        verbs: vec!["get".into(), "list".into()],
        resources: vec!["proxies".into(), "proxies/credentials".into()],
        namespaces: vec!["team-a".into()],
        ..Default::default()
    });
    let provider = Arc::new(FakeProvider::new("fake"));
    let ctx = Context::new(
        client.clone(),
        ProviderRegistry::new([provider.clone() as Arc<dyn Provider>]),
        support::fast_settings("install-label", 300, 300),
    );
    tokio::spawn(controller::run(Arc::new(ctx), std::future::pending::<()>()));
    let (cache, reflect) = discovery::proxy_reflector(client.clone());
    tokio::spawn(reflect);
    let router = discovery::router(
        cache,
        Auth::Kubernetes(
            client.clone(),
            AuthSettings {
                ttl: Duration::from_millis(100),
                ..Default::default()
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(discovery::serve(listener, router, std::future::pending()));

    // Someone's database credentials, and a Proxy that names them.
    const DB_USER: &str = "SENTINELdbadmin";
    const DB_PASS: &str = "SENTINELdbpass0c4f";
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "team-a");
    for name in ["db", "db-credentials"] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name},
            "stringData": {"username": DB_USER, "password": DB_PASS},
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "team-a");
    let make = |name: &str, auth: serde_json::Value| -> Proxy {
        serde_json::from_value(json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"provider": "fake", "placement": {"region": "r1"},
                     "cloudInit": {"inline": "#cloud-config\nrunpass: {{egress.password}}\n"},
                     "port": 3128, "auth": auth},
        }))
        .unwrap()
    };
    // `thief` names the Secret; `db` is a Proxy whose generated Secret would be
    // `db-credentials`, which is not its own.
    proxies
        .create(
            &PostParams::default(),
            &make("thief", json!({"type": "Secret", "secretName": "db"})),
        )
        .await
        .unwrap();
    proxies
        .create(&PostParams::default(), &make("db", json!({})))
        .await
        .unwrap();
    let condition_of = async |name: &str| {
        proxies
            .get(name)
            .await
            .ok()?
            .condition(condition::PROVISIONED)
            .cloned()
    };
    let refused = wait_for("thief refused", Duration::from_secs(30), async || {
        condition_of("thief")
            .await
            .filter(|c| c.status == "False" && c.reason == "CloudInitUnavailable")
    })
    .await;
    for part in [
        "Secret team-a/db",
        "lacks the label egress.proxy-operator.dev/proxy-credentials: \"true\"",
        "kubectl label secret -n team-a db egress.proxy-operator.dev/proxy-credentials=true",
    ] {
        assert!(refused.message.contains(part), "{part}: {refused:?}");
    }
    wait_for("db refused", Duration::from_secs(30), async || {
        condition_of("db")
            .await
            .filter(|c| c.reason == "InvalidSpec" && c.message.contains("not owned by this Proxy"))
    })
    .await;
    assert_eq!(
        provider.count_calls(Op::Create),
        0,
        "nothing was rendered or created"
    );

    // Discovery: carol gets both Proxies, without the Secrets' values.
    for name in ["thief", "db"] {
        let a = wait_for(
            &format!("discovery of {name}"),
            Duration::from_secs(30),
            async || {
                let a =
                    support::http::get(addr, &format!("/v1/proxies/team-a/{name}"), Some(CAROL))
                        .await;
                (a.status == 200).then_some(a)
            },
        )
        .await;
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        assert!(
            v.get("credentials").is_none()
                && !a.body.contains(DB_USER)
                && !a.body.contains(DB_PASS),
            "{name}: {}",
            a.body
        );
    }

    // Labelled: the Proxy goes on, and discovery gives its credentials to carol.
    secrets
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                proxy_auth::CREDENTIALS_LABEL: proxy_auth::CREDENTIALS_LABEL_VALUE
            }}})),
        )
        .await
        .unwrap();
    wait_for("thief provisioned", Duration::from_secs(30), async || {
        condition_of("thief")
            .await
            .filter(|c| c.status == "True")
            .map(drop)
    })
    .await;
    let rendered = provider.last_create_request().unwrap().cloud_init;
    assert!(
        String::from_utf8_lossy(&rendered).contains(DB_PASS),
        "the labelled Secret's password was rendered"
    );
    wait_for(
        "thief's credentials from discovery",
        Duration::from_secs(30),
        async || {
            let a = support::http::get(addr, "/v1/proxies/team-a/thief", Some(CAROL)).await;
            let v: serde_json::Value = serde_json::from_str(&a.body).ok()?;
            (v["credentials"] == json!({"username": DB_USER, "password": DB_PASS})).then_some(())
        },
    )
    .await;
}
