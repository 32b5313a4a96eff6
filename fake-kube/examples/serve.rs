//! Runs the fake API server on 127.0.0.1 for manual kubectl sessions:
//! `cargo run -p fake-kube --example serve -- /tmp/fake.kubeconfig`, then
//! `kubectl --kubeconfig /tmp/fake.kubeconfig get ns`. Stops on Ctrl-C.

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fake-kube.kubeconfig".into());
    let api = fake_kube::FakeApi::new();
    let addr = api.serve("127.0.0.1:0").await?;
    api.write_kubeconfig(addr, std::path::Path::new(&path))?;
    println!("serving on http://{addr}; kubeconfig written to {path}");
    tokio::signal::ctrl_c().await?;
    for r in api.requests() {
        println!(
            "{} {} {}?{} -> {}",
            r.verb, r.method, r.path, r.query, r.code
        );
    }
    Ok(())
}
