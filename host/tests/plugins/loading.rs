//! Loading plugins: version checks, refusals, the compile cache, and one broken plugin or
//! config stopping only its own provider.

use crate::support;

use egress_plugin_host::config::ProvidersFile;
use egress_plugin_host::plugin::{CacheOutcome, LoadError};
use egress_plugin_host::provider::Provider;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_components_and_reads_info() {
    let dir = plugins_or_skip!();
    for pooling in [true, false] {
        let rt = support::runtime_with(pooling);
        assert_eq!(rt.pooling(), pooling);
        let example = rt.load_plugin(&dir.join("example.wasm")).await.unwrap();
        assert_eq!(example.version().as_str(), "0.3.0");
        assert_eq!(example.info.type_name, "example");
        assert!(example.info.has_check);
        let hostile = rt
            .load_plugin(&dir.join("testing/hostile.wasm"))
            .await
            .unwrap();
        assert_eq!(hostile.info.type_name, "hostile");
        // A no-op call works in both allocation modes.
        let p = rt
            .provider(hostile, &support::entry("name: h\nplugin: hostile.wasm"))
            .await
            .unwrap();
        assert_eq!(p.get("ok").await.unwrap().id, "ok");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_what_is_not_a_current_provider_component() {
    let dir = plugins_or_skip!();
    let rt = support::runtime();
    let scratch = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = scratch.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let elf = write(
        "native.wasm",
        b"\x7fELF\x02\x01\x01\0rest-of-a-shared-object",
    );
    let cwasm = write("example.cwasm", b"\x7fELF\x02\x01\x01\0");
    let core = write("core.wasm", b"\0asm\x01\0\0\0");
    let junk = write("junk.wasm", b"hello world");

    let cases: Vec<(std::path::PathBuf, &[&str])> = vec![
        (
            dir.join("testing/sockets.wasm"),
            &["sockets.wasm", "wasi:sockets", "plugins get no sockets"],
        ),
        (
            dir.join("testing/future-version.wasm"),
            &[
                "future-version.wasm",
                "egress:provider@9.0.0",
                "supports egress:provider versions 0.1.0, 0.2.0, 0.3.0",
            ],
        ),
        (elf, &["native.wasm", "refusing precompiled native code"]),
        (
            cwasm,
            &["example.cwasm", "refusing precompiled native code"],
        ),
        (core, &["core.wasm", "a core WebAssembly module"]),
        (junk, &["junk.wasm", "not WebAssembly at all"]),
    ];
    for (path, needles) in cases {
        let err = rt
            .load_plugin(&path)
            .await
            .expect_err(&path.display().to_string());
        let text = err.to_string();
        for n in needles {
            assert!(text.contains(n), "{}: {text:?} lacks {n:?}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compile_cache_is_keyed_by_content() {
    let dir = plugins_or_skip!();
    let cache = tempfile::tempdir().unwrap();
    let opts = || {
        let mut o = egress_plugin_host::plugin::RuntimeOptions::for_providers(
            &ProvidersFile::default(),
            Some(cache.path().join("c")),
            std::env::temp_dir().join("egress-test-scratch"),
        );
        o.engine.max_instances = 8;
        o
    };
    let plugins = tempfile::tempdir().unwrap();
    let path = plugins.path().join("example.wasm");
    std::fs::copy(dir.join("example.wasm"), &path).unwrap();

    let rt = egress_plugin_host::plugin::Runtime::new(opts()).unwrap();
    let first = rt.load_plugin(&path).await.unwrap();
    assert_eq!(first.cache, CacheOutcome::Miss);
    let rt2 = egress_plugin_host::plugin::Runtime::new(opts()).unwrap();
    let second = rt2.load_plugin(&path).await.unwrap();
    assert_eq!(second.cache, CacheOutcome::Hit);
    assert!(
        second.load_time < first.load_time,
        "cached {:?} vs compiled {:?}",
        second.load_time,
        first.load_time
    );

    // A different file (same name) is a different key.
    std::fs::copy(dir.join("testing/hostile.wasm"), &path).unwrap();
    let third = rt2.load_plugin(&path).await.unwrap();
    assert_eq!(third.cache, CacheOutcome::Miss);
    assert_eq!(third.info.type_name, "hostile");

    // A corrupted cache entry is recompiled, not trusted. (Replaced by rename, as the
    // cache itself writes: truncating a file that live runtimes have mapped would fault.)
    for entry in std::fs::read_dir(cache.path().join("c")).unwrap().flatten() {
        let tmp = entry.path().with_extension("tmp");
        std::fs::write(&tmp, b"garbage").unwrap();
        std::fs::rename(&tmp, entry.path()).unwrap();
    }
    let fourth = egress_plugin_host::plugin::Runtime::new(opts())
        .unwrap()
        .load_plugin(&path)
        .await
        .unwrap();
    assert_eq!(fourth.cache, CacheOutcome::Miss);
}

/// The operator compiles in a child process (`proxy-operator compile-plugin`): the plugin
/// loads and runs, is cached as usual, a plugin that does not compile says why, and a child
/// that cannot run falls back to compiling in this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_compile_in_a_child_process() {
    let dir = plugins_or_skip!();
    let cache = tempfile::tempdir().unwrap();
    let opts = |exe: &str, cached: bool| {
        let mut o = egress_plugin_host::plugin::RuntimeOptions::for_providers(
            &ProvidersFile::default(),
            cached.then(|| cache.path().join("c")),
            std::env::temp_dir().join("egress-test-scratch"),
        );
        o.engine.max_instances = 8;
        o.compile_in = Some(exe.into());
        o
    };
    let exe = env!("CARGO_BIN_EXE_proxy-operator");
    let (_guard, captured) = proxy_operator::testing::capture();
    const FELL_BACK: &str = "cannot start the plugin compiler's child process";
    for cached in [true, false] {
        let rt = egress_plugin_host::plugin::Runtime::new(opts(exe, cached)).unwrap();
        let hostile = rt
            .load_plugin(&dir.join("testing/hostile.wasm"))
            .await
            .unwrap();
        let want = if cached {
            CacheOutcome::Miss
        } else {
            CacheOutcome::Uncached
        };
        assert_eq!(hostile.cache, want);
        let p = rt
            .provider(hostile, &support::entry("name: h\nplugin: hostile.wasm"))
            .await
            .unwrap();
        assert_eq!(p.get("ok").await.unwrap().id, "ok");
    }
    let cached = std::fs::read_dir(cache.path().join("c")).unwrap().count();
    assert_eq!(cached, 1, "the child's artifact is cached");

    // A component that is valid to the loader's checks but not to the compiler.
    let bad = cache.path().join("bad.wasm");
    let example = std::fs::read(dir.join("example.wasm")).unwrap();
    std::fs::write(
        &bad,
        support::bomb::with_core_module(&example, &support::bomb::invalid_module()),
    )
    .unwrap();
    let rt = egress_plugin_host::plugin::Runtime::new(opts(exe, false)).unwrap();
    match rt.load_plugin(&bad).await {
        Err(LoadError::Compile { message, .. }) => {
            assert!(
                message.contains("type mismatch") && !message.contains("exited with"),
                "{message}"
            )
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // A truncated one is refused before the compile.
    std::fs::write(&bad, &example[..example.len() / 2]).unwrap();
    match rt.load_plugin(&bad).await {
        Err(e @ LoadError::Malformed { .. }) => {
            assert!(e.to_string().contains("not a well-formed component"), "{e}")
        }
        other => panic!("expected a malformed component, got {other:?}"),
    }
    // All of the above ran in children.
    assert!(
        !captured.all_text().contains(FELL_BACK),
        "{}",
        captured.all_text()
    );

    // No such executable: compiled here instead, with a warning.
    let rt = egress_plugin_host::plugin::Runtime::new(opts("/nonexistent/proxy-operator", false))
        .unwrap();
    let example = rt.load_plugin(&dir.join("example.wasm")).await.unwrap();
    assert_eq!(example.info.type_name, "example");
    assert!(
        captured.all_text().contains(FELL_BACK),
        "{}",
        captured.all_text()
    );
}

/// A broken plugin, a missing plugin and a bad config each stop only their own provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_provider_does_not_stop_the_others() {
    let dir = plugins_or_skip!();
    let plugins = tempfile::tempdir().unwrap();
    for f in [
        "example.wasm",
        "testing/hostile.wasm",
        "testing/sockets.wasm",
    ] {
        let src = dir.join(f);
        std::fs::copy(&src, plugins.path().join(src.file_name().unwrap())).unwrap();
    }
    std::fs::write(plugins.path().join("stale.cwasm"), b"\x7fELF").unwrap();
    let file = ProvidersFile::parse(
        r#"
providers:
  - {name: good, plugin: hostile.wasm}
  - {name: example, plugin: example.wasm, config: {endpoint: "http://127.0.0.1:1", regions: []}}
  - {name: bad-config, plugin: hostile.wasm, config: {validate: loop}, limits: {fuel: 10000000}}
  - {name: no-sockets, plugin: sockets.wasm}
  - {name: missing, plugin: nope.wasm}
"#,
    )
    .unwrap();
    let rt = support::runtime();
    let report = rt.load(plugins.path(), &file).await;
    let names: Vec<_> = report
        .providers
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    assert_eq!(names, ["good", "example"]);
    let errors: Vec<_> = report
        .provider_errors
        .iter()
        .map(|e| (e.provider().to_string(), e.to_string()))
        .collect();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(
        errors[0].0 == "bad-config" && errors[0].1.contains("fuel budget"),
        "{errors:#?}"
    );
    assert!(
        errors[1].0 == "no-sockets" && errors[1].1.contains("wasi:sockets"),
        "{errors:#?}"
    );
    assert!(
        errors[2].0 == "missing" && errors[2].1.contains("nope.wasm"),
        "{errors:#?}"
    );
    assert!(
        report
            .plugin_errors
            .iter()
            .any(|e| matches!(**e, LoadError::Precompiled { .. })),
        "the .cwasm was refused"
    );
    assert_eq!(report.providers[0].get("ok").await.unwrap().id, "ok");
}

/// Where the pool's address space cannot be reserved, the runtime falls back to on-demand
/// allocation instead of failing to start. 131,072 memory slots of 4 GiB each are far more
/// than the 128 TiB of user address space x86-64 has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_to_on_demand_when_the_pool_cannot_be_reserved() {
    let dir = plugins_or_skip!();
    let mut opts = egress_plugin_host::plugin::RuntimeOptions::for_providers(
        &ProvidersFile::default(),
        None,
        std::env::temp_dir().join("egress-test-scratch"),
    );
    opts.engine.max_instances = 65_536;
    opts.engine.max_memory_bytes = 4 << 30;
    let rt = egress_plugin_host::plugin::Runtime::new(opts).expect("the runtime starts anyway");
    assert!(!rt.pooling(), "pooling cannot have reserved 512 TiB");
    let plugin = rt
        .load_plugin(&dir.join("testing/hostile.wasm"))
        .await
        .unwrap();
    let p = rt
        .provider(plugin, &support::entry("name: h\nplugin: hostile.wasm"))
        .await
        .unwrap();
    assert_eq!(p.get("ok").await.unwrap().id, "ok");
}

/// A plugin file larger than `max_plugin_bytes` is refused naming the file, its size and
/// the limit: checked on the file's size before reading, and on the read itself (a file
/// whose size says nothing, like one growing while it is read, is cut off and refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_plugin_file_over_the_size_limit() {
    let dir = plugins_or_skip!();
    let path = dir.join("example.wasm");
    let size = std::fs::metadata(&path).unwrap().len();
    let runtime = |max: u64| {
        let mut opts = egress_plugin_host::plugin::RuntimeOptions::for_providers(
            &ProvidersFile::default(),
            None,
            std::env::temp_dir().join("egress-test-scratch"),
        );
        assert_eq!(opts.max_plugin_bytes, 8 << 20, "the default");
        opts.max_plugin_bytes = max;
        egress_plugin_host::plugin::Runtime::new(opts).unwrap()
    };

    let rt = runtime(size - 1);
    let err = rt.load_plugin(&path).await.unwrap_err();
    assert!(
        matches!(&err, LoadError::TooLarge { size: s, limit, .. } if *s == size && *limit == size - 1),
        "{err:?}"
    );
    let msg = err.to_string();
    for needle in [
        path.display().to_string(),
        format!("{size} bytes"),
        format!("({} bytes, --max-plugin-bytes)", size - 1),
    ] {
        assert!(msg.contains(&needle), "{msg:?} lacks {needle:?}");
    }
    // Exactly at the limit loads.
    runtime(size).load_plugin(&path).await.unwrap();

    // The size of /dev/zero is 0, and reading it never ends: the bounded read refuses it
    // after limit + 1 bytes.
    let err = runtime(1 << 20)
        .load_plugin(std::path::Path::new("/dev/zero"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LoadError::TooLarge { size, limit, .. } if *size == (1 << 20) + 1 && *limit == 1 << 20),
        "{err:?}"
    );
}

/// A compile bomb (a real plugin with a module whose compile takes minutes and gigabytes,
/// `support::bomb`) is refused by whichever compile limit it reaches first, each named
/// with its flag, in seconds; and a bomb that is not a current provider is refused before
/// it is compiled at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compile_limits_refuse_a_compile_bomb() {
    use egress_plugin_host::plugin::compiler::{CompileLimit, CompileLimits};
    use std::time::{Duration, Instant};
    let dir = plugins_or_skip!();
    let scratch = tempfile::tempdir().unwrap();
    let write = |name: &str, base: &str| {
        let p = scratch.path().join(name);
        let plugin = std::fs::read(dir.join(base)).unwrap();
        std::fs::write(&p, support::bomb::bomb(&plugin)).unwrap();
        p
    };
    let bomb = write("bomb.wasm", "example.wasm");
    let runtime = |limits: CompileLimits| {
        let mut o = egress_plugin_host::plugin::RuntimeOptions::for_providers(
            &ProvidersFile::default(),
            None,
            std::env::temp_dir().join("egress-test-scratch"),
        );
        o.engine.max_instances = 8;
        o.compile_in = Some(env!("CARGO_BIN_EXE_proxy-operator").into());
        o.compile_limits = limits;
        egress_plugin_host::plugin::Runtime::new(o).unwrap()
    };
    let gib = 1 << 30;
    let secs = Duration::from_secs;
    for (name, limits, want) in [
        (
            "the default limits: memory first",
            CompileLimits::default(),
            CompileLimit::Memory(CompileLimits::DEFAULT_MEMORY_BYTES),
        ),
        (
            "2 s of CPU",
            CompileLimits {
                cpu: secs(2),
                memory_bytes: 2 * gib,
                wall: secs(60),
            },
            CompileLimit::Cpu(secs(2)),
        ),
        (
            "1 s of wall time",
            CompileLimits {
                cpu: secs(60),
                memory_bytes: 2 * gib,
                wall: secs(1),
            },
            CompileLimit::Wall(secs(1)),
        ),
    ] {
        let started = Instant::now();
        let err = runtime(limits).load_plugin(&bomb).await.unwrap_err();
        let took = started.elapsed();
        match &err {
            LoadError::CompileLimit { limit, .. } => assert_eq!(*limit, want, "{name}: {err}"),
            other => panic!("{name}: expected a compile limit, got {other}"),
        }
        assert!(err.to_string().contains("bomb.wasm"), "{err}");
        assert!(took < secs(15), "{name}: refused after {took:?}");
        eprintln!("{name}: {err} (after {took:?})");
    }

    // Not a current provider, or importing sockets: refused before any compile (with a
    // CPU limit of an hour, a compile would not end within the test).
    let patient = runtime(CompileLimits {
        cpu: secs(3600),
        memory_bytes: 2 * gib,
        wall: secs(3600),
    });
    for (path, needle) in [
        (
            write("future.wasm", "testing/future-version.wasm"),
            "egress:provider@9.0.0",
        ),
        (
            write("sockets.wasm", "testing/sockets.wasm"),
            "wasi:sockets",
        ),
    ] {
        let started = Instant::now();
        let err = patient.load_plugin(&path).await.unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
        assert!(started.elapsed() < secs(1), "{:?}", started.elapsed());
    }
}
