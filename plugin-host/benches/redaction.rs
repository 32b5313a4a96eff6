//! Redaction of a fleet's generated credentials: the same 10,000 usernames and passwords
//! matched by automaton (`Unit::Value`, how they were held before) and by table
//! (`Unit::Token`), side by side in one run: memory, and the time to scrub what a plugin
//! prints (a 64 KiB base64 body, a JSON list of 300 servers, a log line).
//!
//! `cargo bench -p egress-plugin-host --bench redaction` (release). Prints a table.

use egress_plugin_host::redact::{Patterns, Redactor, Unit};
use std::time::{Duration, Instant};

const PROXIES: usize = 10_000;
const ROUNDS: usize = 30;

/// Credentials like the operator's (24 and 32 letters and digits), different per `i`.
fn generated_like(i: usize) -> (String, String) {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
    };
    let user = (0..24).map(|_| next()).collect();
    let pass = (0..32).map(|_| next()).collect();
    (user, pass)
}

fn build(unit: fn(Vec<u8>) -> Unit) -> (Redactor, Duration) {
    let started = Instant::now();
    let mut p = Patterns::default();
    for i in 0..PROXIES {
        let (user, pass) = generated_like(i);
        p.add(&unit(user.into_bytes()));
        p.add(&unit(pass.into_bytes()));
    }
    let r = p.build();
    (r, started.elapsed())
}

fn main() {
    let (automaton, automaton_build) = build(Unit::Value);
    let (table, table_build) = build(Unit::Token);
    let body: Vec<u8> = (0u32..49_152)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let servers: Vec<String> = (0..300)
        .map(|i| {
            format!(
                r#"{{"id":{i},"name":"proxy-{i}","status":"running","public_net":{{"ipv4":{{"ip":"203.0.113.7"}}}},"labels":{{"egress-proxy/owner":"a1b2c3"}}}}"#
            )
        })
        .collect();
    let (user, pass) = generated_like(PROXIES / 2);
    let texts = [
        ("64 KiB base64 body", data_encoding::BASE64.encode(&body)),
        (
            "JSON list of 300 servers",
            format!(r#"{{"servers":[{}]}}"#, servers.join(",")),
        ),
        (
            "log line with a password",
            format!("created server proxy-42 for {user} with {pass} in fsn1"),
        ),
    ];
    println!("| | automaton | table | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| memory, {PROXIES} Proxies' credentials | {:.1} MiB | {:.1} MiB | {:.1}x less |",
        automaton.memory_usage() as f64 / 1048576.0,
        table.memory_usage() as f64 / 1048576.0,
        automaton.memory_usage() as f64 / table.memory_usage() as f64
    );
    println!(
        "| build | {:.0} ms | {:.0} ms | {:.1}x |",
        automaton_build.as_secs_f64() * 1e3,
        table_build.as_secs_f64() * 1e3,
        automaton_build.as_secs_f64() / table_build.as_secs_f64()
    );
    for (what, text) in &texts {
        assert_eq!(automaton.scrub(text), table.scrub(text), "{what}");
        // Interleaved, best of the rounds: the machine is shared.
        let (mut a, mut t) = (Duration::MAX, Duration::MAX);
        for _ in 0..ROUNDS {
            let s = Instant::now();
            std::hint::black_box(automaton.scrub(text));
            a = a.min(s.elapsed());
            let s = Instant::now();
            std::hint::black_box(table.scrub(text));
            t = t.min(s.elapsed());
        }
        println!(
            "| scrub: {what} ({} B) | {:.1} µs | {:.1} µs | {:.1}x faster |",
            text.len(),
            a.as_secs_f64() * 1e6,
            t.as_secs_f64() * 1e6,
            a.as_secs_f64() / t.as_secs_f64()
        );
    }
}
