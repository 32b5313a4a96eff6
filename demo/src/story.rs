//! The story the demo tells, one step at a time. Each step waits for what it shows, with
//! a timeout, and fails saying what it saw instead.

use crate::Args;
use crate::stack::{GC_INTERVAL, GC_MIN_AGE, INSTALLATION, Stack};
use crate::watch::{Views, Watch};
use anyhow::{Context, Result, bail, ensure};
use egress_emulators::control::{Emulator, Plant};
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const STEPS: usize = 6;
const FIELD_MANAGER: &str = "egress-demo";

fn step(n: usize, title: &str) {
    println!("\n[{n}/{STEPS}] {title}");
}

fn key_of(doc: &Value) -> String {
    format!(
        "{}/{}",
        doc["metadata"]["namespace"].as_str().unwrap_or("default"),
        doc["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Server-side apply of every document, as `kubectl apply --server-side` would.
async fn apply(client: &kube::Client, docs: &[Value]) -> Result<()> {
    for doc in docs {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"]
            .as_str()
            .with_context(|| format!("a {kind} without metadata.name"))?;
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("the API has no kind {kind} in {api_version}"))?;
        let api: kube::Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => kube::Api::namespaced_with(
                client.clone(),
                doc["metadata"]["namespace"].as_str().unwrap_or("default"),
                &ar,
            ),
            Scope::Cluster => kube::Api::all_with(client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(doc),
        )
        .await
        .with_context(|| format!("applying {kind} {}", key_of(doc)))?;
    }
    Ok(())
}

fn emulator<'a>(stack: &'a Stack, provider: &str) -> Result<&'a dyn Emulator> {
    match provider {
        "hetzner" => Ok(&stack.hetzner),
        "ec2" => Ok(&stack.ec2),
        other => match stack.clouds.iter().find(|c| c.name == other) {
            Some(c) => Ok(c.emulator.as_ref()),
            None => bail!(
                "spec.provider {other:?}: the demo runs hetzner, ec2 and the clouds of --clouds"
            ),
        },
    }
}

/// The backend ID inside a provider ID (`fsn1/4200001` -> `4200001`).
fn backend_id(provider_id: &str) -> &str {
    provider_id.rsplit('/').next().unwrap_or(provider_id)
}

fn instance_exists(emu: &dyn Emulator, id: &str) -> bool {
    emu.dump().instances.iter().any(|i| i.id == id)
}

/// Whether something answers on `ip:port` (the emulators' instances are on loopback).
fn port_open(ip: &str, port: u16) -> bool {
    let Ok(addr) = format!("{ip}:{port}").parse::<SocketAddr>() else {
        return false;
    };
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

/// The address (`ip:port`) `view` had, once nothing answers there (an error naming `what`
/// if something still does); None when it had no address.
fn address_gone(view: &crate::watch::View, what: &str) -> Result<Option<String>> {
    let (Some(ip), Some(port)) = (
        view.ip.as_deref(),
        view.port.and_then(|p| u16::try_from(p).ok()),
    ) else {
        return Ok(None);
    };
    ensure!(!port_open(ip, port), "{what} {ip}:{port} still answers");
    Ok(Some(format!("{ip}:{port}")))
}

/// A request to the echo server through the proxy at `ip:port` with `credentials`, which
/// must answer with the proxy's own address; and, to show the proxy is not open, the same
/// request without them, which it must refuse.
async fn request_through(
    stack: &Stack,
    ip: &str,
    port: u16,
    credentials: (&str, &str),
) -> Result<()> {
    let proxy: SocketAddr = format!("{ip}:{port}")
        .parse()
        .with_context(|| format!("the proxy address {ip}:{port} is not an IP and port"))?;
    let echo = SocketAddr::from(([127, 0, 0, 1], stack.echo_port));
    let refused = crate::http::get_through_proxy(proxy, echo, None).await?;
    ensure!(
        refused.status == 407 || refused.status == 401,
        "CONNECT through {proxy} without credentials answered {}, not 407: the proxy is open",
        refused.status
    );
    println!(
        "  without credentials: CONNECT answered {} (the proxy is not open)",
        refused.status
    );
    let a = crate::http::get_through_proxy(proxy, echo, Some(credentials)).await?;
    ensure!(
        a.status == 200,
        "GET http://{echo}/ through {proxy} answered {}",
        a.status
    );
    let seen = a.body.trim();
    ensure!(
        seen == ip,
        "the echo server saw the request come from {seen:?}, not from the proxy's IP {ip}"
    );
    println!(
        "  GET http://{echo}/ through {proxy} (CONNECT tunnel, Basic proxy credentials from the discovery API): 200, body {seen:?}: the request left through the proxy"
    );
    println!(
        "  try it: curl -p -x http://{}:{}@{proxy} http://{echo}/",
        credentials.0, credentials.1
    );
    Ok(())
}

/// Waits until the ProxyPool `key` (`namespace/name`) has all its replicas Ready, and says
/// where they are.
async fn pool_ready(stack: &Stack, key: &str, within: Duration) -> Result<()> {
    let (ns, name) = key.split_once('/').unwrap_or(("default", key));
    let resource = kube::discovery::ApiResource {
        group: "egress.proxy-operator.dev".into(),
        version: "v1alpha1".into(),
        api_version: "egress.proxy-operator.dev/v1alpha1".into(),
        kind: "ProxyPool".into(),
        plural: "proxypools".into(),
    };
    let api = kube::Api::<DynamicObject>::namespaced_with(stack.client.clone(), ns, &resource);
    let deadline = Instant::now() + within;
    loop {
        let pool = api
            .get(name)
            .await
            .with_context(|| format!("reading ProxyPool {key}"))?;
        let want = pool.data["spec"]["replicas"].as_i64().unwrap_or_default();
        let ready = pool.data["status"]["readyReplicas"]
            .as_i64()
            .unwrap_or_default();
        if ready == want {
            let spread: Vec<String> = pool.data["status"]["placements"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}: {}",
                        p["name"].as_str().unwrap_or("?"),
                        p["readyReplicas"]
                    )
                })
                .collect();
            println!(
                "  ProxyPool {key}: {ready} of {want} Ready ({}); list them with ?pool={name}",
                spread.join(", ")
            );
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "ProxyPool {key} has {ready} of {want} Ready after {within:?}: {}",
            pool.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The credentials of the Proxy `key` (`namespace/name`), from the discovery API, which
/// gives them to the demo's token (it may `get` `proxies/credentials`).
async fn credentials_of(stack: &Stack, key: &str) -> Result<(String, String)> {
    let path = format!("/v1/proxies/{key}");
    let a = crate::http::get(stack.discovery, &path, Some(&stack.token)).await?;
    ensure!(
        a.status == 200,
        "GET {path} answered {}: {}",
        a.status,
        a.body
    );
    let v: Value = serde_json::from_str(&a.body)
        .with_context(|| format!("GET {path} answered no JSON: {}", a.body))?;
    let field = |f: &str| {
        v["credentials"][f]
            .as_str()
            .map(String::from)
            .with_context(|| format!("GET {path} gave no credentials.{f}: {}", a.body))
    };
    Ok((field("username")?, field("password")?))
}

/// The names (`namespace/name`) among `names` that the discovery API's `items` leave out.
fn unlisted<'a>(names: &'a [String], items: &[Value]) -> Vec<&'a str> {
    names
        .iter()
        .filter(|n| {
            !items.iter().any(|i| {
                format!(
                    "{}/{}",
                    i["namespace"].as_str().unwrap_or(""),
                    i["name"].as_str().unwrap_or("")
                ) == **n
            })
        })
        .map(String::as_str)
        .collect()
}

pub async fn run(stack: &Stack, args: &Args, started: Instant) -> Result<()> {
    let t = args.step_timeout;
    let watch = Watch::start(stack.client.clone(), started);
    let samples = stack.samples.join("proxies.yaml");
    let proxies: Vec<&Value> = stack
        .sample_docs
        .iter()
        .filter(|d| d["kind"] == "Proxy")
        .collect();
    let names: Vec<String> = proxies.iter().map(|d| key_of(d)).collect();

    let pools: Vec<String> = stack
        .sample_docs
        .iter()
        .filter(|d| d["kind"] == "ProxyPool")
        .map(key_of)
        .collect();
    step(
        1,
        &format!(
            "Apply the sample Proxies and ProxyPool ({}): each Proxy goes Provisioning, Running, Healthy, Ready",
            samples.display()
        ),
    );
    println!(
        "  (the same as: kubectl --kubeconfig {} apply --server-side -f {})",
        stack.kubeconfig.display(),
        samples.display()
    );
    println!(
        "  (each instance the plugins create in the emulators runs a real {} proxy on a loopback address of its own, on the Proxy's port)",
        stack.proxy_kind
    );
    apply(&stack.client, &stack.sample_docs).await?;
    watch
        .until("every sample Proxy Ready", t, |v| {
            names
                .iter()
                .all(|n| v.get(n).is_some_and(|p| p.phase == "Ready"))
        })
        .await?;
    for pool in &pools {
        pool_ready(stack, pool, t).await?;
    }

    step(2, "Ask the discovery API for Ready proxies");
    println!("  {}", stack.curl_line("/v1/proxies"));
    // The discovery API answers from the operator's informer cache, which sees a status
    // change a moment after the demo's own watch does: ask until it lists every sample.
    let deadline = Instant::now() + t;
    let (answer, items) = loop {
        let a = crate::http::get(stack.discovery, "/v1/proxies", Some(&stack.token)).await?;
        ensure!(
            a.status == 200,
            "GET /v1/proxies answered {}: {}",
            a.status,
            a.body
        );
        let answer: Value = serde_json::from_str(&a.body)
            .with_context(|| format!("GET /v1/proxies answered no JSON: {}", a.body))?;
        let items = answer["items"].as_array().cloned().unwrap_or_default();
        let missing = unlisted(&names, &items);
        if missing.is_empty() {
            break (answer, items);
        }
        ensure!(
            Instant::now() < deadline,
            "the discovery API does not list the Ready Proxies {} within {t:?}: {}",
            missing.join(", "),
            a.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for line in serde_json::to_string_pretty(&answer)?.lines() {
        println!("    {line}");
    }
    let shot = stack.kubeconfig.with_file_name("status.png");
    if let Some(shot) = crate::status_page::capture(stack, &names, &shot).await? {
        println!(
            "  status page: http://{}/status#token=...  (screenshot with every sample Proxy Ready: {})",
            stack.discovery,
            shot.display()
        );
    }
    let unauthenticated = crate::http::get(stack.discovery, "/v1/proxies", None).await?;
    println!(
        "  (without the token: {}; the API checks callers with TokenReview and SubjectAccessReview)",
        unauthenticated.status
    );
    ensure!(
        unauthenticated.status == 401,
        "GET /v1/proxies without a token answered {}, not 401",
        unauthenticated.status
    );

    let first = match pools.first() {
        Some(pool) => {
            let (ns, name) = pool.split_once('/').unwrap_or(("default", pool));
            let path = format!("/v1/proxies:pick?namespace={ns}&pool={name}");
            step(
                3,
                &format!(
                    "Send one real request through a proxy of the pool {pool}, picked by the discovery API"
                ),
            );
            println!("  {}", stack.curl_line(&path));
            let a = crate::http::get(stack.discovery, &path, Some(&stack.token)).await?;
            ensure!(
                a.status == 200,
                "GET {path} answered {}: {}",
                a.status,
                a.body
            );
            serde_json::from_str::<Value>(&a.body)
                .with_context(|| format!("GET {path} answered no JSON: {}", a.body))?
        }
        None => {
            step(
                3,
                "Send one real request through a proxy the discovery API returned",
            );
            items
                .first()
                .context("the discovery API listed no proxy")?
                .clone()
        }
    };
    let first = &first;
    let ip = first["ip"]
        .as_str()
        .context("the first listed proxy has no ip")?;
    let port = first["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .context("the first listed proxy has no port")?;
    let username = first["credentials"]["username"]
        .as_str()
        .context("the discovery API gave the first proxy no credentials (the demo's token may get proxies/credentials)")?;
    let password = first["credentials"]["password"]
        .as_str()
        .context("the first proxy's credentials have no password")?;
    println!(
        "  {}/{}: {ip}:{port}, username {username}",
        first["namespace"].as_str().unwrap_or_default(),
        first["name"].as_str().unwrap_or_default()
    );
    request_through(stack, ip, port, (username, password)).await?;

    let edited = stack
        .edit_docs
        .iter()
        .find(|d| d["kind"] == "Proxy")
        .context("proxy-edit.yaml holds no Proxy")?;
    let edited_key = key_of(edited);
    let before = watch.views().get(&edited_key).cloned().with_context(|| {
        format!("proxy-edit.yaml edits {edited_key}, which proxies.yaml does not create")
    })?;
    let new_port = edited["spec"]["port"].as_i64().unwrap_or_default();
    step(
        4,
        &format!(
            "Edit {edited_key} (spec.port {} -> {new_port}): the operator replaces its instance under the same name",
            before.spec_port.unwrap_or_default()
        ),
    );
    apply(&stack.client, &stack.edit_docs).await?;
    let old_id = before.provider_id.clone().unwrap_or_default();
    let after = watch
        .until(&format!("{edited_key} replaced and Ready"), t, |v| {
            v.get(&edited_key).is_some_and(|p| {
                p.phase == "Ready"
                    && p.port == Some(new_port)
                    && p.provider_id.as_deref().is_some_and(|id| id != old_id)
            })
        })
        .await?;
    let now = &after[&edited_key];
    let provider = edited["spec"]["provider"].as_str().unwrap_or_default();
    let emu = emulator(stack, provider)?;
    ensure!(
        !instance_exists(emu, backend_id(&old_id)),
        "the old instance {old_id} of {edited_key} still exists"
    );
    if let Some(addr) = address_gone(&before, "the old proxy")? {
        println!("  old instance {old_id} is gone, and its proxy on {addr} with it");
    }
    let (username, password) = credentials_of(stack, &edited_key).await?;
    request_through(
        stack,
        now.ip.as_deref().unwrap_or_default(),
        u16::try_from(new_port).unwrap_or_default(),
        (&username, &password),
    )
    .await?;

    let deleted = proxies
        .iter()
        .rev()
        .find(|d| key_of(d) != edited_key)
        .context("proxies.yaml needs a second Proxy to delete")?;
    let deleted_key = key_of(deleted);
    step(
        5,
        &format!("Delete {deleted_key}: its instance goes first, then the object"),
    );
    let gone = watch.views().get(&deleted_key).cloned().unwrap_or_default();
    let api = kube::Api::<DynamicObject>::namespaced_with(
        stack.client.clone(),
        deleted["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default"),
        &crate::watch::proxy_resource(),
    );
    api.delete(
        deleted["metadata"]["name"].as_str().unwrap_or_default(),
        &DeleteParams::default(),
    )
    .await
    .with_context(|| format!("deleting {deleted_key}"))?;
    watch
        .until(&format!("{deleted_key} deleted"), t, |v: &Views| {
            !v.contains_key(&deleted_key)
        })
        .await?;
    let provider = deleted["spec"]["provider"].as_str().unwrap_or_default();
    let emu = emulator(stack, provider)?;
    if let Some(id) = &gone.provider_id {
        ensure!(
            !instance_exists(emu, backend_id(id)),
            "the instance {id} of the deleted {deleted_key} still exists"
        );
        println!("  instance {id} is gone from the {provider} backend");
    }
    if let Some(addr) = address_gone(&gone, "the deleted Proxy's address")? {
        println!("  nothing listens on {addr} any more");
    }

    step(
        6,
        &format!(
            "Plant an orphan: an instance with the operator's marks and installation but no Proxy; GC (every {GC_INTERVAL}, orphans older than {GC_MIN_AGE}) removes it"
        ),
    );
    let orphan = stack.hetzner.plant(Plant {
        name: "egress-orphan-demo".into(),
        scope: "fsn1".into(),
        managed: true,
        uid: Some("00000000-0000-4000-8000-00000000dead".into()),
        installation: Some(INSTALLATION.into()),
        created_at: None,
    });
    let foreign = stack.hetzner.plant(Plant {
        name: "another-installations-instance".into(),
        scope: "fsn1".into(),
        managed: true,
        uid: Some("00000000-0000-4000-8000-00000000beef".into()),
        installation: Some("another-installation".into()),
        created_at: None,
    });
    let planted = Instant::now();
    println!(
        "  planted hetzner server {orphan} (installation {INSTALLATION}, no Proxy owns it) and {foreign} (installation another-installation)"
    );
    let deadline = planted + t;
    while instance_exists(&stack.hetzner, &orphan) {
        ensure!(
            Instant::now() < deadline,
            "GC did not remove the orphan {orphan} within {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "  {:>6.1}s  GC deleted the orphan {orphan}, {:.1}s after it was planted",
        started.elapsed().as_secs_f64(),
        planted.elapsed().as_secs_f64()
    );
    ensure!(
        instance_exists(&stack.hetzner, &foreign),
        "GC deleted {foreign}, which belongs to another installation"
    );
    println!("  {foreign} of another installation is left alone");

    println!(
        "\nthe whole story took {:.1}s; {} Proxies Ready: {}",
        started.elapsed().as_secs_f64(),
        watch.views().len(),
        watch
            .views()
            .iter()
            .map(|(k, v)| format!(
                "{k} at {}:{}",
                v.ip.as_deref().unwrap_or("-"),
                v.port.unwrap_or_default()
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unlisted_names_the_proxies_the_discovery_answer_leaves_out() {
        let names = vec![
            "demo/a".to_string(),
            "demo/b".to_string(),
            "x/a".to_string(),
        ];
        let items = vec![
            json!({"namespace": "demo", "name": "a"}),
            json!({"namespace": "other", "name": "b"}),
        ];
        assert_eq!(unlisted(&names, &items), vec!["demo/b", "x/a"]);
        assert!(unlisted(&names[..1], &items).is_empty());
        assert_eq!(unlisted(&names[..1], &[]), vec!["demo/a"]);
    }
}
