//! kubectl against `FakeApi::serve`. Skipped, loudly, where kubectl is missing; under
//! `CI=true` a missing kubectl fails the test instead, so CI cannot pass without running it.

use fake_kube::FakeApi;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

fn find_kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl and returns stdout; panics with stderr on failure.
    async fn ok(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.test.fake-kube.dev
spec:
  group: test.fake-kube.dev
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, shortNames: [gd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
          status: {type: object, properties: {ready: {type: boolean}}}
"#;

/// A served fake and a kubectl pointed at it; None (after a loud notice) where kubectl is
/// missing, a panic instead under `CI=true`.
async fn start(test: &str) -> Option<(FakeApi, Kubectl, tempfile::TempDir)> {
    let Some(bin) = find_kubectl() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("kubectl is not on PATH, and CI=true requires the kubectl test {test} to run");
        }
        eprintln!("\n!!! SKIPPED {test}: kubectl is not on PATH !!!\n");
        return None;
    };
    let api = FakeApi::new();
    let addr = api.serve("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(addr, &kubeconfig).unwrap();
    let k = Kubectl {
        bin,
        kubeconfig,
        cache: dir.path().join("cache"),
    };
    Some((api, k, dir))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_create_apply_delete_watch() {
    let Some((api, k, dir)) = start("kubectl_get_create_apply_delete_watch").await else {
        return;
    };

    let ns = k.ok(&["get", "namespaces"]).await;
    assert!(ns.contains("default") && ns.contains("Active"), "{ns}");

    // create -f (kubectl validates through the server: fieldValidation=Strict).
    let cm = write(
        dir.path(),
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\ndata:\n  a: \"1\"\n",
    );
    assert!(
        k.ok(&["create", "-f", &cm])
            .await
            .contains("configmap/demo created")
    );
    assert_eq!(
        api.object("configmaps", Some("default"), "demo").unwrap()["data"]["a"],
        "1"
    );

    // apply -f: a CRD, then a custom resource created and changed through it.
    let crd = write(dir.path(), "crd.yaml", CRD);
    k.ok(&["apply", "-f", &crd]).await;
    let gd = write(
        dir.path(),
        "gd.yaml",
        "apiVersion: test.fake-kube.dev/v1\nkind: Gadget\nmetadata:\n  name: g1\nspec:\n  size: 3\n",
    );
    assert!(
        k.ok(&["apply", "-f", &gd])
            .await
            .contains("gadget.test.fake-kube.dev/g1 created")
    );
    std::fs::write(&gd, "apiVersion: test.fake-kube.dev/v1\nkind: Gadget\nmetadata:\n  name: g1\nspec:\n  size: 4\n").unwrap();
    assert!(k.ok(&["apply", "-f", &gd]).await.contains("configured"));
    assert!(k.ok(&["apply", "-f", &gd]).await.contains("unchanged"));
    assert!(
        k.ok(&["apply", "--server-side", "-f", &gd])
            .await
            .contains("serverside-applied")
    );
    let g = api.object("gadgets", Some("default"), "g1").unwrap();
    assert_eq!(g["spec"]["size"], 4);
    assert_eq!(g["metadata"]["generation"], 2);

    // get uses the server's table, including the CRD's printer columns and short name.
    let table = k.ok(&["get", "gd"]).await;
    assert!(table.contains("SIZE") && table.contains("g1"), "{table}");
    let yaml = k.ok(&["get", "gadget", "g1", "-o", "yaml"]).await;
    assert!(yaml.contains("size: 4"), "{yaml}");

    // Imperative generators post protobuf.
    k.ok(&["create", "configmap", "imperative", "--from-literal=x=y"])
        .await;
    k.ok(&["create", "secret", "generic", "s1", "--from-literal=p=q"])
        .await;
    k.ok(&["label", "configmap", "imperative", "team=a"]).await;
    assert_eq!(
        api.object("configmaps", Some("default"), "imperative")
            .unwrap()["metadata"]["labels"]["team"],
        "a"
    );

    // get -w: events made by another client show up, and the watch ends at the timeout.
    let mut watch = k.command(&[
        "get",
        "configmaps",
        "-w",
        "--output-watch-events",
        "--request-timeout=8s",
    ]);
    let watch = watch.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let watching = async {
        while !api
            .requests()
            .iter()
            .any(|r| r.verb == "watch" && r.resource.as_deref() == Some("configmaps"))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), watching)
        .await
        .expect("kubectl started watching");
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let mut w1 = ConfigMap::default();
    w1.metadata.name = Some("watched".into());
    cms.create(&PostParams::default(), &w1).await.unwrap();
    cms.delete("watched", &DeleteParams::default())
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), watch.wait_with_output())
        .await
        .expect("the watch ends at its timeout")
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ADDED") && l.contains("watched")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("DELETED") && l.contains("watched")),
        "{out}"
    );

    // delete, by file and by name; deleting a CRD removes its objects.
    assert!(k.ok(&["delete", "-f", &cm]).await.contains("deleted"));
    assert!(api.object("configmaps", Some("default"), "demo").is_none());
    k.ok(&["delete", "-f", &crd]).await;
    assert!(api.objects("gadgets.test.fake-kube.dev").is_empty());
    assert!(k.ok(&["get", "crd"]).await.is_empty());
}

const SCALABLE_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: proxypools.test.fake-kube.dev
spec:
  group: test.fake-kube.dev
  scope: Namespaced
  names: {plural: proxypools, singular: proxypool, kind: ProxyPool}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {replicas: {type: integer, minimum: 0}, image: {type: string}}}
          status: {type: object, properties: {replicas: {type: integer}, selector: {type: string}}}
"#;

/// `kubectl scale` finds the scale subresource through discovery and patches it; with
/// `--current-replicas` it reads the Scale and PUTs it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_custom_resource() {
    let Some((api, k, dir)) = start("kubectl_scale_custom_resource").await else {
        return;
    };
    let crd = write(dir.path(), "crd.yaml", SCALABLE_CRD);
    k.ok(&["apply", "-f", &crd]).await;
    let pool = write(
        dir.path(),
        "pool.yaml",
        "apiVersion: test.fake-kube.dev/v1\nkind: ProxyPool\nmetadata:\n  name: x\nspec:\n  replicas: 2\n  image: squid\n",
    );
    k.ok(&["apply", "-f", &pool]).await;

    let out = k.ok(&["scale", "proxypool/x", "--replicas=5"]).await;
    assert!(
        out.contains("proxypool.test.fake-kube.dev/x scaled"),
        "{out}"
    );
    let replicas = k
        .ok(&["get", "proxypool", "x", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(replicas, "5");
    let scale = k
        .ok(&[
            "get",
            "proxypool",
            "x",
            "--subresource=scale",
            "-o",
            "jsonpath={.kind} {.spec.replicas}",
        ])
        .await;
    assert_eq!(scale, "Scale 5");
    // The server's table for the subresource: desired and available replicas.
    let table = k
        .ok(&["get", "proxypool", "x", "--subresource=scale"])
        .await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "DESIRED", "AVAILABLE", "AGE"], "{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..3], ["x", "5", "0"], "{table}");
    let obj = api.object("proxypools", Some("default"), "x").unwrap();
    assert_eq!(obj["metadata"]["generation"], 2);
    assert_eq!(obj["spec"]["image"], "squid");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.verb == "patch" && r.rbac_resource().as_deref() == Some("proxypools/scale")),
        "kubectl patched the scale subresource"
    );

    // A precondition kubectl checks against the Scale it reads, then an update.
    k.ok(&[
        "scale",
        "proxypool/x",
        "--current-replicas=5",
        "--replicas=3",
    ])
    .await;
    assert_eq!(
        api.object("proxypools", Some("default"), "x").unwrap()["spec"]["replicas"],
        3
    );
    let stale = k
        .command(&[
            "scale",
            "proxypool/x",
            "--current-replicas=5",
            "--replicas=1",
        ])
        .output()
        .await
        .unwrap();
    assert!(!stale.status.success(), "the current size is 3, not 5");

    let scale_verbs: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.rbac_resource().as_deref() == Some("proxypools/scale"))
        .map(|r| r.verb.clone())
        .collect();
    assert_eq!(scale_verbs, ["patch", "get", "get", "get", "update", "get"]);
}
