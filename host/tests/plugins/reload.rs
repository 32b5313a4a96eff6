//! Reloading providers when the providers file or a plugin file changes on disk: only the
//! affected provider is rebuilt, and a broken new version leaves the old one serving.

use crate::support;

use proxy_operator::reload::{Reason, ReloadMetrics, Reloader};
use std::path::Path;
use std::sync::Arc;

fn write_file(path: &Path, endpoint: &str, regions: &str) {
    std::fs::write(
        path,
        format!(
            "providers:\n\
             - name: ex\n  plugin: example.wasm\n  config: {{endpoint: '{endpoint}', regions: [{regions}]}}\n\
             - name: other\n  plugin: example.wasm\n  config: {{endpoint: 'http://127.0.0.1:2', regions: [b]}}\n"
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_what_changed_and_keeps_the_old_version_when_the_new_one_breaks() {
    let plugins = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let wasm = std::fs::read(plugins.join("example.wasm")).unwrap();
    std::fs::write(plugin_dir.join("example.wasm"), &wasm).unwrap();
    let file = dir.path().join("providers.yaml");
    write_file(&file, "http://127.0.0.1:1", "a");

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ReloadMetrics::register(&mut registry);
    let mut r = Reloader::new(support::runtime(), &plugin_dir, &file, metrics.clone());
    let c = r.poll().await.expect("first poll loads everything");
    assert_eq!(c.loaded, ["ex", "other"]);
    assert!(r.poll().await.is_none(), "nothing changed on disk");
    let ex = r.providers()["ex"].clone();
    let other = r.providers()["other"].clone();

    // One entry's config changes: only that provider is rebuilt.
    write_file(&file, "http://127.0.0.1:1", "a, a2");
    let c = r.poll().await.unwrap();
    assert_eq!(
        (c.loaded.as_slice(), c.failed.len()),
        (&["ex".to_string()][..], 0)
    );
    assert!(!Arc::ptr_eq(&ex, &r.providers()["ex"]));
    assert!(Arc::ptr_eq(&other, &r.providers()["other"]));
    let ex = r.providers()["ex"].clone();

    // A config the plugin rejects: the old version keeps serving, the error is kept.
    write_file(&file, "ftp://nope", "a");
    let c = r.poll().await.unwrap();
    assert!(
        c.failed["ex"].contains("config.endpoint \"ftp://nope\""),
        "{:?}",
        c.failed
    );
    assert!(Arc::ptr_eq(&ex, &r.providers()["ex"]));
    assert!(r.errors().contains_key("ex"));
    assert_eq!(metrics.errors("ex", Reason::Config), 1);
    assert!(
        r.poll().await.is_none(),
        "a broken version is not retried until the disk changes"
    );

    // Fixed: loads, and the error is cleared.
    write_file(&file, "http://127.0.0.1:1", "a");
    assert_eq!(r.poll().await.unwrap().loaded, ["ex"]);
    assert!(r.errors().is_empty());
    let ex = r.providers()["ex"].clone();
    let other = r.providers()["other"].clone();

    // A corrupt plugin file: both providers using it keep their old version.
    std::fs::write(plugin_dir.join("example.wasm"), b"\0asm garbage").unwrap();
    let c = r.poll().await.unwrap();
    assert_eq!(c.failed.keys().collect::<Vec<_>>(), ["ex", "other"]);
    assert!(Arc::ptr_eq(&ex, &r.providers()["ex"]));
    assert!(Arc::ptr_eq(&other, &r.providers()["other"]));
    // Reverted to the bytes that are running: nothing to rebuild, nothing wrong.
    std::fs::write(plugin_dir.join("example.wasm"), &wasm).unwrap();
    let c = r.poll().await.unwrap();
    assert!(c.loaded.is_empty() && c.failed.is_empty(), "{c:?}");
    assert!(r.errors().is_empty(), "{:?}", r.errors());

    // An unparseable file changes nothing, and is reported once.
    std::fs::write(&file, "providers: [ {name: ").unwrap();
    let c = r.poll().await.unwrap();
    assert!(c.failed.contains_key(""), "{:?}", c.failed);
    assert_eq!(r.providers().len(), 2);
    assert!(r.poll().await.is_none());
    assert_eq!(metrics.errors("", Reason::File), 1);

    // An entry removed from the file stops.
    std::fs::write(
        &file,
        "providers:\n- name: other\n  plugin: example.wasm\n  config: {endpoint: 'http://127.0.0.1:2', regions: [b]}\n",
    )
    .unwrap();
    let c = r.poll().await.unwrap();
    assert_eq!(c.removed, ["ex"]);
    assert!(c.loaded.is_empty(), "other is unchanged: {:?}", c.loaded);
    assert_eq!(r.providers().keys().collect::<Vec<_>>(), ["other"]);
}

/// A providers file that does not fit the pod is refused like one that does not parse:
/// every provider keeps its current version, and the error (naming the provider, the
/// fields and the numbers) is kept for `/readyz` and `ProviderHealth.status.loadError`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_does_not_fit_the_pod_is_refused() {
    use egress_plugin_host::config::fit::MIB;
    let plugins = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::copy(
        plugins.join("example.wasm"),
        plugin_dir.join("example.wasm"),
    )
    .unwrap();
    let file = dir.path().join("providers.yaml");
    write_file(&file, "http://127.0.0.1:1", "a");

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ReloadMetrics::register(&mut registry);
    let budget = egress_plugin_host::config::PodResources {
        memory_bytes: Some(328 * MIB),
        reserve_bytes: 96 * MIB,
        scratch_bytes: Some(64 * MIB),
        descriptors: None,
    };
    let mut r =
        Reloader::new(support::runtime(), &plugin_dir, &file, metrics.clone()).with_budget(budget);
    assert_eq!(r.poll().await.unwrap().loaded, ["ex", "other"]);
    let ex = r.providers()["ex"].clone();

    std::fs::write(
        &file,
        "providers:\n\
         - name: ex\n  plugin: example.wasm\n  limits: {memoryMib: 512, concurrency: 8}\n  config: {endpoint: 'http://127.0.0.1:1', regions: [a]}\n\
         - name: other\n  plugin: example.wasm\n  config: {endpoint: 'http://127.0.0.1:2', regions: [b]}\n",
    )
    .unwrap();
    let c = r.poll().await.unwrap();
    let why = &c.failed[""];
    assert!(
        why.contains("ex: limits.concurrency 8 x (limits.memoryMib 512 + ")
            && why.contains("leaves 232 MiB"),
        "{why}"
    );
    assert!(c.loaded.is_empty());
    assert!(Arc::ptr_eq(&ex, &r.providers()["ex"]), "the old ex serves");
    assert_eq!(r.errors()[""], *why);
    assert_eq!(metrics.errors("", Reason::File), 1);
    assert!(r.poll().await.is_none(), "reported once");

    // Back within the budget: nothing to rebuild, the error is gone.
    write_file(&file, "http://127.0.0.1:1", "a");
    let c = r.poll().await.unwrap();
    assert!(c.failed.is_empty() && c.loaded.is_empty(), "{c:?}");
    assert!(r.errors().is_empty(), "{:?}", r.errors());
}

/// The reload loop as `proxy-operator run` wires it: what serves reaches the provider
/// registry (instrumented, with each provider's plugin type) and `/readyz`'s load report;
/// a change on disk swaps the registry's set and announces it; a broken file only reports
/// its error; cancelling ends the loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reload_loop_keeps_the_registry_and_readiness_in_step_with_the_disk() {
    use futures::StreamExt;
    use proxy_operator::readiness::Readiness;
    use proxy_operator::reload::Serving;
    use std::time::Duration;
    let plugins = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::copy(
        plugins.join("example.wasm"),
        plugin_dir.join("example.wasm"),
    )
    .unwrap();
    let file = dir.path().join("providers.yaml");
    write_file(&file, "http://127.0.0.1:1", "a");

    let mut r = Reloader::new(support::runtime(), &plugin_dir, &file, Default::default());
    r.poll().await.expect("first poll loads everything");
    let readiness = Readiness::default();
    let serving = Serving::first(&r, readiness.clone(), Default::default());
    let registry = serving.registry.clone();
    let types = |names: &[&str]| {
        names
            .iter()
            .map(|n| (n.to_string(), "example".to_string()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(registry.plugin_types(), types(&["ex", "other"]));
    assert_eq!(readiness.verdict().0, 503, "the Proxy cache has not synced");
    readiness.set_cache_synced();
    let (code, body) = readiness.verdict();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("2 provider(s) serving (ex, other)"), "{body}");

    let mut changes = Box::pin(registry.changes());
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(r.run(Duration::from_millis(50), cancel.clone(), serving));

    // `other` leaves the file: the set is swapped and announced, its type goes with it.
    std::fs::write(
        &file,
        "providers:\n- name: ex\n  plugin: example.wasm\n  config: {endpoint: 'http://127.0.0.1:1', regions: [a]}\n",
    )
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("the swap is announced")
        .expect("stream open");
    assert_eq!(registry.plugin_types(), types(&["ex"]));
    assert!(registry.get("other").is_none());

    // A file that does not parse: reported, every provider kept.
    std::fs::write(&file, "providers: [").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !readiness.load_errors().contains_key("") {
        assert!(
            std::time::Instant::now() < deadline,
            "the broken file was not reported"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(registry.get("ex").is_some(), "ex keeps serving");
    assert!(
        readiness.verdict().1.contains("providers file"),
        "{:?}",
        readiness.verdict()
    );

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the loop ends on cancel")
        .unwrap();
}
