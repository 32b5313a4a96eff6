//! kube-rs and kube-runtime against the fake, in-process.

use fake_kube::{AccessRule, ApiError, FakeApi, UserInfo};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Discovery;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema, PartialEq)]
#[kube(
    group = "test.fake-kube.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    shortname = "wd"
)]
struct WidgetSpec {
    size: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    color: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, JsonSchema, PartialEq, Default)]
struct WidgetStatus {
    ready: bool,
}

/// A kind with a scale subresource, as a ProxyPool has.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema, PartialEq)]
#[kube(
    group = "test.fake-kube.dev",
    version = "v1",
    kind = "Pool",
    namespaced,
    status = "PoolStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
struct PoolSpec {
    #[schemars(range(min = 0))]
    replicas: i32,
    #[serde(default)]
    image: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, JsonSchema, PartialEq, Default)]
struct PoolStatus {
    replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    selector: Option<String>,
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn install_widget_crd(client: &kube::Client) -> Api<Widget> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Widget::crd())
        .await
        .unwrap();
    let crd = crds.get("widgets.test.fake-kube.dev").await.unwrap();
    let established = crd
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established, "a CRD is established at once");
    Api::namespaced(client.clone(), "default")
}

fn widget(name: &str, size: i32) -> Widget {
    let mut w = Widget::new(name, WidgetSpec { size, color: None });
    w.metadata.namespace = Some("default".into());
    w
}

#[tokio::test]
async fn configmap_secret_lease_crud() {
    let api = FakeApi::new();
    let client = api.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("one".into());
    cm.data = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(
        created.metadata.generation, None,
        "ConfigMaps carry no generation on a cluster"
    );
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();

    let err = api_err(cms.create(&PostParams::default(), &cm).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));

    let mut got = cms.get("one").await.unwrap();
    got.data.as_mut().unwrap().insert("k2".into(), "v2".into());
    let replaced = cms
        .replace("one", &PostParams::default(), &got)
        .await
        .unwrap();
    assert!(replaced.resource_version().unwrap().parse::<u64>().unwrap() > rv1);

    // The stale copy now conflicts.
    let err = api_err(
        cms.replace("one", &PostParams::default(), &got)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));

    let patched = cms
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": null, "m": "n"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.data.unwrap(),
        BTreeMap::from([
            ("k2".to_string(), "v2".to_string()),
            ("m".to_string(), "n".to_string())
        ])
    );

    let mut gen_cm = ConfigMap::default();
    gen_cm.metadata.generate_name = Some("gen-".into());
    let g = cms.create(&PostParams::default(), &gen_cm).await.unwrap();
    assert!(g.name_any().starts_with("gen-") && g.name_any().len() == 9);

    let list = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    assert_eq!(
        list.metadata.resource_version.unwrap(),
        api.resource_version().to_string()
    );
    let paged = cms.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(paged.items.len(), 1);
    let token = paged.metadata.continue_.clone().unwrap();
    let rest = cms
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_ne!(rest.items[0].name_any(), paged.items[0].name_any());

    cms.delete("one", &DeleteParams::default()).await.unwrap();
    let err = api_err(cms.get("one").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));

    // Secrets: stringData becomes base64 data, like a real server.
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let mut s = Secret::default();
    s.metadata.name = Some("creds".into());
    s.string_data = Some(BTreeMap::from([(
        "token".to_string(),
        "hunter2".to_string(),
    )]));
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let s = secrets.get("creds").await.unwrap();
    assert_eq!(s.data.unwrap()["token"].0, b"hunter2");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));

    // Leases: what leader election does.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease = Lease {
        metadata: kube::core::ObjectMeta {
            name: Some("leader".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut l = leases.get("leader").await.unwrap();
    l.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("leader", &PostParams::default(), &l)
        .await
        .unwrap();
    assert_eq!(
        leases
            .get("leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("b")
    );
    assert_eq!(api.objects("leases").len(), 1);
    assert_eq!(api.objects_of::<Lease>()[0].name_any(), "leader");

    // A namespaced kind needs an existing namespace.
    let nowhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let err = api_err(
        nowhere
            .create(&PostParams::default(), &cm)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn label_and_field_selectors() {
    let api = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    for (name, tier) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some(BTreeMap::from([("tier".to_string(), tier.to_string())]));
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("tier=web"))
                .await
                .unwrap()
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("tier notin (web)"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().fields("metadata.name=b"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            cms.list(
                &ListParams::default()
                    .labels("tier in (web,db)")
                    .fields("metadata.name!=a")
            )
            .await
            .unwrap()
        ),
        ["b", "c"]
    );
    let err = api_err(
        cms.list(&ListParams::default().labels("tier in web"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
}

#[tokio::test]
async fn crd_registers_dynamic_and_typed_resources() {
    let api = FakeApi::new();
    let client = api.client();
    let widgets = install_widget_crd(&client).await;

    // Discovery shows the new kind with its status subresource and short name.
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (ar, caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("test.fake-kube.dev", "v1", "Widget"))
        .expect("Widget is discoverable");
    assert_eq!(ar.plural, "widgets");
    assert!(caps.subresources.iter().any(|(s, _)| s.plural == "status"));

    widgets
        .create(&PostParams::default(), &widget("w1", 3))
        .await
        .unwrap();

    // The same object through DynamicObject.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.fake-kube.dev", "v1", "Widget"),
        "widgets",
    );
    let dynamic: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w = dynamic.get("w1").await.unwrap();
    assert_eq!(w.data["spec"]["size"], 3);
    let mut obj = DynamicObject::new("w2", &ar).within("default");
    obj.data = json!({"spec": {"size": 5, "unknown": true}});
    dynamic.create(&PostParams::default(), &obj).await.unwrap();
    let typed = widgets.get("w2").await.unwrap();
    assert_eq!(typed.spec.size, 5);
    assert!(
        dynamic.get("w2").await.unwrap().data["spec"]
            .get("unknown")
            .is_none(),
        "fields the schema does not declare are pruned"
    );

    // Schema validation.
    let mut bad = DynamicObject::new("w3", &ar).within("default");
    bad.data = json!({"spec": {"size": "big"}});
    let err = api_err(
        dynamic
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));

    // Strict field validation rejects unknown fields instead of pruning them.
    let strict = json!({"apiVersion": "test.fake-kube.dev/v1", "kind": "Widget", "metadata": {"name": "w4"},
                        "spec": {"size": 1, "junk": 1}});
    let pp = PatchParams::apply("strict").validation(kube::api::ValidationDirective::Strict);
    let err = api_err(
        dynamic
            .patch("w4", &pp, &Patch::Apply(&strict))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    assert!(
        err.message.contains("unknown field \"spec.junk\""),
        "{}",
        err.message
    );

    // Deleting the CRD removes its objects and its API.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("widgets.test.fake-kube.dev", &DeleteParams::default())
        .await
        .unwrap();
    assert!(api.objects("widgets.test.fake-kube.dev").is_empty());
    assert_eq!(
        api_err(widgets.list(&ListParams::default()).await.unwrap_err()).code,
        404
    );
}

#[tokio::test]
async fn status_subresource_and_generation() {
    let api = FakeApi::new();
    let widgets = install_widget_crd(&api.client()).await;
    let mut w = widget("w", 1);
    w.status = Some(WidgetStatus { ready: true });
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.status, None,
        "create ignores status when a status subresource exists"
    );

    // A status write changes only status and not the generation.
    let s = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"size": 99}, "metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(s.status, Some(WidgetStatus { ready: true }));
    assert_eq!(s.spec.size, 1);
    assert!(s.metadata.labels.is_none());
    assert_eq!(s.metadata.generation, Some(1));

    // A main-resource write ignores status; a spec change bumps generation.
    let m = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": false}, "spec": {"size": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(m.status, Some(WidgetStatus { ready: true }));
    assert_eq!(m.metadata.generation, Some(2));

    // A metadata-only change leaves generation alone but moves resourceVersion.
    let l = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(l.metadata.generation, Some(2));
    assert_ne!(l.resource_version(), m.resource_version());

    // A no-op write keeps the resourceVersion.
    let same = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(same.resource_version(), l.resource_version());

    // replace_status through PUT.
    let mut cur = widgets.get("w").await.unwrap();
    cur.status = Some(WidgetStatus { ready: false });
    cur.spec.size = 50;
    let r = widgets
        .replace_status("w", &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_eq!(r.status, Some(WidgetStatus { ready: false }));
    assert_eq!(r.spec.size, 2);
}

/// `/scale` as `kubectl scale` and an HPA use it: a Scale view of the CRD's replica paths,
/// writes that land in the parent's spec like any update.
#[tokio::test]
async fn scale_subresource_round_trips() {
    let api = FakeApi::new();
    let client = api.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Pool::crd())
        .await
        .unwrap();
    let pools: Api<Pool> = Api::namespaced(client.clone(), "default");
    let mut p = Pool::new(
        "p",
        PoolSpec {
            replicas: 2,
            image: "squid".into(),
        },
    );
    p.metadata.namespace = Some("default".into());
    let created = pools.create(&PostParams::default(), &p).await.unwrap();
    pools
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 1, "selector": "app=p"}})),
        )
        .await
        .unwrap();

    // Discovery lists the subresource with its own kind, as kubectl's scale client needs.
    let list = client
        .list_api_group_resources("test.fake-kube.dev/v1")
        .await
        .unwrap();
    let entry = list
        .resources
        .iter()
        .find(|r| r.name == "pools/scale")
        .expect("pools/scale is discoverable");
    assert_eq!(
        (
            entry.group.as_deref(),
            entry.version.as_deref(),
            entry.kind.as_str()
        ),
        (Some("autoscaling"), Some("v1"), "Scale")
    );
    assert_eq!(entry.verbs, ["get", "patch", "update"]);

    let s = pools.get_scale("p").await.unwrap();
    assert_eq!(s.metadata.name.as_deref(), Some("p"));
    assert_eq!(s.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(s.metadata.uid, created.metadata.uid);
    assert_eq!(s.spec.as_ref().unwrap().replicas, Some(2));
    let status = s.status.clone().unwrap();
    assert_eq!(
        (status.replicas, status.selector.as_deref()),
        (1, Some("app=p"))
    );

    // A watcher started now sees the scale write as an ordinary modification.
    let mut events = watcher(pools.clone(), watcher::Config::default()).boxed();
    while !matches!(
        events.try_next().await.unwrap(),
        Some(watcher::Event::InitDone)
    ) {}

    let patched = pools
        .patch_scale(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().replicas, Some(5));
    let parent = pools.get("p").await.unwrap();
    assert_eq!(parent.spec.replicas, 5);
    assert_eq!(parent.spec.image, "squid", "the rest of spec stays");
    assert_eq!(parent.metadata.generation, Some(2));
    assert_eq!(
        patched.metadata.resource_version,
        parent.metadata.resource_version
    );
    assert_ne!(
        parent.metadata.resource_version,
        s.metadata.resource_version
    );
    let owner = parent
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.subresource.as_deref() == Some("scale"))
        .expect("the scale writer owns spec.replicas through the subresource");
    assert_eq!(
        owner.fields_v1.unwrap().0,
        json!({"f:spec": {"f:replicas": {}}})
    );
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.try_next().await.unwrap() {
                Some(watcher::Event::Apply(o)) if o.spec.replicas == 5 => return o,
                Some(_) => {}
                None => panic!("the watch ended"),
            }
        }
    })
    .await
    .expect("the watcher sees the scale write");
    assert_eq!(seen.metadata.generation, Some(2));

    // JSON patch and strategic merge patch apply to the Scale too.
    let j = pools
        .patch_scale(
            "p",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "replace", "path": "/spec/replicas", "value": 6}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(j.spec.unwrap().replicas, Some(6));
    let sm = pools
        .patch_scale(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"replicas": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(sm.spec.unwrap().replicas, Some(7));

    // Server-side apply owns the field under the scale subresource; the earlier writers
    // own it too, so taking it needs force, as on a cluster.
    let err = api_err(
        pools
            .patch_scale(
                "p",
                &PatchParams::apply("autoscaler"),
                &Patch::Apply(json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                     "spec": {"replicas": 8}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    let applied = pools
        .patch_scale(
            "p",
            &PatchParams::apply("autoscaler").force(),
            &Patch::Apply(json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                 "spec": {"replicas": 8}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.spec.unwrap().replicas, Some(8));
    let err = api_err(
        pools
            .patch(
                "p",
                &PatchParams::apply("someone-else"),
                &Patch::Apply(
                    json!({"apiVersion": "test.fake-kube.dev/v1", "kind": "Pool",
                                     "spec": {"replicas": 1, "image": "squid"}}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(err.message.contains("autoscaler"), "{}", err.message);

    // PUT: the current resourceVersion is a precondition; a stale one conflicts.
    let current = pools.get_scale("p").await.unwrap();
    let mut put = current.clone();
    put.spec = Some(ScaleSpec { replicas: Some(3) });
    let replaced = pools
        .replace_scale("p", &PostParams::default(), &put)
        .await
        .unwrap();
    assert_eq!(replaced.spec.unwrap().replicas, Some(3));
    assert_eq!(pools.get("p").await.unwrap().spec.replicas, 3);
    let err = api_err(
        pools
            .replace_scale("p", &PostParams::default(), &put)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    // Without a resourceVersion the write is unconditional.
    let unconditional = Scale {
        metadata: kube::core::ObjectMeta {
            name: Some("p".into()),
            ..Default::default()
        },
        spec: Some(ScaleSpec { replicas: Some(4) }),
        status: None,
    };
    pools
        .replace_scale("p", &PostParams::default(), &unconditional)
        .await
        .unwrap();
    assert_eq!(pools.get("p").await.unwrap().spec.replicas, 4);

    // The parent's schema still holds: replicas has a minimum of 0.
    let err = api_err(
        pools
            .patch_scale(
                "p",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": -1}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));

    // A dry run changes nothing.
    let dry = pools
        .patch_scale(
            "p",
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"spec": {"replicas": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(dry.spec.unwrap().replicas, Some(9));
    assert_eq!(pools.get("p").await.unwrap().spec.replicas, 4);

    // Missing object: 404.
    let err = api_err(pools.get_scale("nope").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    let err = api_err(
        pools
            .patch_scale(
                "nope",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 1}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);

    // A kind without a scale subresource has no /scale.
    let widgets = install_widget_crd(&client).await;
    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    let err = api_err(widgets.get_scale("w").await.unwrap_err());
    assert_eq!(err.code, 404);
    assert!(
        !client
            .list_api_group_resources("test.fake-kube.dev/v1")
            .await
            .unwrap()
            .resources
            .iter()
            .any(|r| r.name == "widgets/scale")
    );

    // The request log names the subresource, so RBAC checks see `pools/scale`.
    let requests = api.requests();
    let scale_calls: Vec<_> = requests
        .iter()
        .filter(|r| {
            r.subresource.as_deref() == Some("scale") && r.resource.as_deref() == Some("pools")
        })
        .collect();
    assert!(scale_calls.iter().any(|r| r.verb == "get"));
    assert!(scale_calls.iter().any(|r| r.verb == "patch"));
    assert!(scale_calls.iter().any(|r| r.verb == "update"));
    assert!(
        scale_calls
            .iter()
            .all(|r| r.rbac_resource().as_deref() == Some("pools/scale"))
    );
}

/// A custom resource without a value at `specReplicasPath` has no Scale to read (500, as
/// on a real server), but a write that sets replicas gives it one.
#[tokio::test]
async fn scale_of_a_resource_without_replicas() {
    let api = FakeApi::new();
    api.create(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "flocks.test.fake-kube.dev"},
        "spec": {"group": "test.fake-kube.dev", "scope": "Namespaced",
            "names": {"plural": "flocks", "singular": "flock", "kind": "Flock"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {
                    "specReplicasPath": ".spec.size.wanted", "statusReplicasPath": ".status.size"}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "image": {"type": "string"},
                        "size": {"type": "object", "properties": {"wanted": {"type": "integer"}}}}},
                    "status": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]},
    }))
    .unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("test.fake-kube.dev", "v1", "Flock"));
    let flocks: Api<DynamicObject> = Api::namespaced_with(api.client(), "default", &ar);
    let mut obj = DynamicObject::new("bare", &ar);
    obj.data = json!({"spec": {"image": "squid"}});
    flocks.create(&PostParams::default(), &obj).await.unwrap();

    let err = api_err(flocks.get_scale("bare").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    assert!(err.message.contains(".spec.size.wanted"), "{}", err.message);
    // A patch that does not set replicas cannot invent them.
    let err = api_err(
        flocks
            .patch_scale(
                "bare",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    let s = flocks
        .patch_scale(
            "bare",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(s.spec.unwrap().replicas, Some(2));
    assert_eq!(s.status.unwrap().replicas, 0, "no status yet reads as 0");
    assert_eq!(
        api.object("flocks", Some("default"), "bare").unwrap()["spec"],
        json!({"image": "squid", "size": {"wanted": 2}})
    );
}

/// The CRD's scale paths are checked as a real server checks them.
#[tokio::test]
async fn crd_with_bad_scale_paths_is_invalid() {
    let api = FakeApi::new();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    let mut crd = Pool::crd();
    let scale = crd.spec.versions[0]
        .subresources
        .as_mut()
        .unwrap()
        .scale
        .as_mut()
        .unwrap();
    scale.spec_replicas_path = ".status.replicas".into();
    let err = api_err(crds.create(&PostParams::default(), &crd).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message
            .contains("spec.versions[0].subresources.scale.specReplicasPath"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn conflicts_stale_and_injected() {
    let api = FakeApi::new();
    let widgets = install_widget_crd(&api.client()).await;
    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    let a = widgets.get("w").await.unwrap();
    let mut b = a.clone();
    let mut a2 = a.clone();
    a2.spec.size = 2;
    widgets
        .replace("w", &PostParams::default(), &a2)
        .await
        .unwrap();
    b.spec.size = 3;
    let err = api_err(
        widgets
            .replace("w", &PostParams::default(), &b)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );

    // Custom resources refuse unconditional updates.
    b.metadata.resource_version = None;
    let err = api_err(
        widgets
            .replace("w", &PostParams::default(), &b)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);

    // A merge patch carrying a stale resourceVersion conflicts too.
    let err = api_err(
        widgets
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"resourceVersion": a.resource_version()}, "spec": {"size": 4}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);

    api.inject_conflict_once("widgets", "w");
    let err = api_err(
        widgets
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"size": 5}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .expect("the injected conflict fires once");

    api.inject_error(
        "get",
        "Widget",
        ApiError::new(500, "InternalError", "boom"),
        2,
    );
    assert_eq!(api_err(widgets.get("w").await.unwrap_err()).code, 500);
    assert_eq!(api_err(widgets.get("w").await.unwrap_err()).code, 500);
    widgets.get("w").await.unwrap();
}

#[tokio::test]
async fn server_side_apply_ownership() {
    let api = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let apply = |data: serde_json::Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": data});
    let pp_a = PatchParams::apply("manager-a");
    let first = cms
        .patch(
            "cfg",
            &pp_a,
            &Patch::Apply(apply(json!({"x": "1", "y": "2"}))),
        )
        .await
        .unwrap();
    assert_eq!(first.data.as_ref().unwrap().len(), 2);
    let mf = first.metadata.managed_fields.as_ref().unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(mf[0].manager.as_deref(), Some("manager-a"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));

    // Same manager again: updates, and a field it no longer applies goes away.
    let second = cms
        .patch("cfg", &pp_a, &Patch::Apply(apply(json!({"x": "10"}))))
        .await
        .unwrap();
    assert_eq!(
        second.data.unwrap(),
        BTreeMap::from([("x".to_string(), "10".to_string())])
    );

    // Another manager setting the same field to another value conflicts...
    let pp_b = PatchParams::apply("manager-b");
    let err = api_err(
        cms.patch("cfg", &pp_b, &Patch::Apply(apply(json!({"x": "20"}))))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(err.message.contains("manager-a"), "{}", err.message);
    // ...unless forced, which takes the field over.
    let forced = cms
        .patch(
            "cfg",
            &pp_b.clone().force(),
            &Patch::Apply(apply(json!({"x": "20"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["x"], "20");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["manager-b"]);

    // manager-a applying without x now leaves manager-b's x alone.
    let after = cms
        .patch("cfg", &pp_a, &Patch::Apply(apply(json!({"z": "3"}))))
        .await
        .unwrap();
    assert_eq!(
        after.data.unwrap(),
        BTreeMap::from([
            ("x".to_string(), "20".to_string()),
            ("z".to_string(), "3".to_string())
        ])
    );

    // Apply of a custom resource with status goes to /status only through the subresource.
    let widgets = install_widget_crd(&api.client()).await;
    let w = json!({"apiVersion": "test.fake-kube.dev/v1", "kind": "Widget", "metadata": {"name": "w"},
                   "spec": {"size": 1}, "status": {"ready": true}});
    let created = widgets
        .patch("w", &PatchParams::apply("op"), &Patch::Apply(&w))
        .await
        .unwrap();
    assert_eq!(created.status, None);
    let st = widgets
        .patch_status("w", &PatchParams::apply("op"), &Patch::Apply(&w))
        .await
        .unwrap();
    assert_eq!(st.status, Some(WidgetStatus { ready: true }));
    assert_eq!(st.metadata.generation, Some(1));
}

#[tokio::test]
async fn watcher_sees_add_modify_delete() {
    let api = FakeApi::new();
    api.set_bookmark_interval(Duration::from_millis(50));
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let mut stream = watcher(cms.clone(), watcher::Config::default().labels("app=x")).boxed();
    // Initial list: Init, InitDone.
    assert!(matches!(
        stream.try_next().await.unwrap(),
        Some(watcher::Event::Init)
    ));
    assert!(matches!(
        stream.try_next().await.unwrap(),
        Some(watcher::Event::InitDone)
    ));

    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("w".into());
    cm.metadata.labels = Some(BTreeMap::from([("app".to_string(), "x".to_string())]));
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut unrelated = ConfigMap::default();
    unrelated.metadata.name = Some("other".into());
    cms.create(&PostParams::default(), &unrelated)
        .await
        .unwrap();
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "b"}})),
    )
    .await
    .unwrap();
    cms.delete("w", &DeleteParams::default()).await.unwrap();

    macro_rules! next {
        ($s:expr) => {
            tokio::time::timeout(Duration::from_secs(5), $s.try_next())
        };
    }
    match next!(stream).await.unwrap().unwrap() {
        Some(watcher::Event::Apply(o)) => assert!(o.data.is_none()),
        other => panic!("expected the add, got {other:?}"),
    }
    match next!(stream).await.unwrap().unwrap() {
        Some(watcher::Event::Apply(o)) => assert_eq!(o.data.unwrap()["a"], "b"),
        other => panic!("expected the modification, got {other:?}"),
    }
    match next!(stream).await.unwrap().unwrap() {
        Some(watcher::Event::Delete(o)) => assert_eq!(o.name_any(), "w"),
        other => panic!("expected the delete, got {other:?}"),
    }
}

/// kube's metadata-only watch (`Api<PartialObjectMeta<K>>`, as an operator watching
/// Secrets without their values uses it): list and watch ask for PartialObjectMetadata and
/// get names, resourceVersions and the rest of `metadata`, never `data`; bookmarks come as
/// PartialObjectMetadata too.
#[tokio::test]
async fn metadata_only_list_and_watch_carry_no_data() {
    use kube::core::PartialObjectMeta;
    let sentinel = "SENTINEL-metadata-only-5f2a";
    let api = FakeApi::new();
    api.set_bookmark_interval(Duration::from_millis(50));
    let client = api.client();
    let nss: Api<Namespace> = Api::all(client.clone());
    let mut other = Namespace::default();
    other.metadata.name = Some("other".into());
    nss.create(&PostParams::default(), &other).await.unwrap();
    let secret = |name: &str| {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.string_data = Some(BTreeMap::from([("v".to_string(), sentinel.to_string())]));
        s
    };
    let in_default: Api<Secret> = Api::namespaced(client.clone(), "default");
    let in_other: Api<Secret> = Api::namespaced(client.clone(), "other");
    in_default
        .create(&PostParams::default(), &secret("listed"))
        .await
        .unwrap();

    let metas: Api<PartialObjectMeta<Secret>> = Api::all(client.clone());
    let mut stream = watcher(metas.clone(), watcher::Config::default()).boxed();
    macro_rules! next {
        () => {
            tokio::time::timeout(Duration::from_secs(5), stream.try_next())
                .await
                .unwrap()
                .unwrap()
                .unwrap()
        };
    }
    assert!(matches!(next!(), watcher::Event::Init));
    match next!() {
        watcher::Event::InitApply(m) => {
            assert_eq!(
                (m.metadata.namespace.as_deref(), m.name_any().as_str()),
                (Some("default"), "listed")
            );
            assert!(m.metadata.resource_version.is_some() && m.metadata.uid.is_some());
        }
        other => panic!("expected the listed Secret, got {other:?}"),
    }
    assert!(matches!(next!(), watcher::Event::InitDone));

    let created = in_other
        .create(&PostParams::default(), &secret("watched"))
        .await
        .unwrap();
    let patched = in_other
        .patch(
            "watched",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"v": format!("{sentinel}-2")}})),
        )
        .await
        .unwrap();
    in_other
        .delete("watched", &DeleteParams::default())
        .await
        .unwrap();
    let mut seen = vec![];
    while seen.len() < 3 {
        match next!() {
            watcher::Event::Apply(m) => seen.push(("apply", m)),
            watcher::Event::Delete(m) => seen.push(("delete", m)),
            other => panic!("unexpected {other:?}"),
        }
    }
    let kinds: Vec<_> = seen.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["apply", "apply", "delete"]);
    assert_eq!(
        seen[0].1.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(
        seen[1].1.metadata.resource_version,
        patched.metadata.resource_version
    );
    assert!(
        seen.iter()
            .all(|(_, m)| m.metadata.namespace.as_deref() == Some("other"))
    );

    // What went over the wire: the raw answers to the same requests hold no value, and the
    // request log says they were metadata-only.
    for (uri, needle) in [
        ("/api/v1/secrets", "PartialObjectMetadataList"),
        (
            "/api/v1/secrets?watch=true&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=1",
            "PartialObjectMetadata",
        ),
    ] {
        let req = http::Request::get(uri)
            .header(
                http::header::ACCEPT,
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            )
            .body(Vec::new())
            .unwrap();
        let text = client.request_text(req).await.unwrap();
        assert!(text.contains(needle), "{uri}: {text}");
        let encoded = data_encoding::BASE64.encode(sentinel.as_bytes());
        assert!(
            !text.contains(sentinel) && !text.contains(&encoded[..16]),
            "{uri}: {text}"
        );
        if uri.contains("watch=true") {
            let events: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert!(events.iter().any(|e| e["type"] == "BOOKMARK"), "{text}");
            for e in &events {
                assert_eq!(e["object"]["kind"], "PartialObjectMetadata", "{e}");
            }
        }
    }
    let secret_reads: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| {
            r.resource.as_deref() == Some("secrets") && matches!(r.verb.as_str(), "list" | "watch")
        })
        .collect();
    assert!(secret_reads.iter().any(|r| r.verb == "watch"));
    assert!(
        secret_reads.iter().all(|r| r.metadata_only),
        "{secret_reads:?}"
    );
    // A plain list is not metadata-only.
    in_default.list(&Default::default()).await.unwrap();
    assert!(!api.requests().last().unwrap().metadata_only);
}

/// A slowed verb on one resource waits; other verbs and resources do not; zero resets it.
#[tokio::test]
async fn delay_slows_one_verb_of_one_resource() {
    let api = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("c".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    async fn timed(f: impl std::future::Future<Output = ()>) -> Duration {
        let t = tokio::time::Instant::now();
        f.await;
        t.elapsed()
    }
    api.delay("get", "configmaps", Duration::from_millis(300));
    let slow = timed(async { cms.get("c").await.map(|_| ()).unwrap() }).await;
    assert!(slow >= Duration::from_millis(300), "{slow:?}");
    let list = timed(async { cms.list(&Default::default()).await.map(|_| ()).unwrap() }).await;
    assert!(list < Duration::from_millis(300), "{list:?}");
    api.delay("get", "configmaps", Duration::ZERO);
    let fast = timed(async { cms.get("c").await.map(|_| ()).unwrap() }).await;
    assert!(fast < Duration::from_millis(300), "{fast:?}");
}

#[tokio::test]
async fn watch_resumes_and_expires() {
    let api = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("a".into());
    let a = cms.create(&PostParams::default(), &cm).await.unwrap();
    cm.metadata.name = Some("b".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();

    // Resuming after a's creation replays only b.
    let wp = kube::api::WatchParams::default().timeout(1);
    let events: Vec<_> = cms
        .watch(&wp, &a.resource_version().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    match &events[..] {
        [kube::api::WatchEvent::Added(o)] => assert_eq!(o.name_any(), "b"),
        other => panic!("expected one ADDED, got {other:?}"),
    }

    // After compaction the old resourceVersion is gone.
    api.compact();
    let events: Vec<_> = cms
        .watch(&wp, &a.resource_version().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    match &events[..] {
        [kube::api::WatchEvent::Error(e)] => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected 410 Gone, got {other:?}"),
    }

    // kube-runtime's watcher re-lists after a 410 and carries on.
    let seen = watcher(cms.clone(), watcher::Config::default().streaming_lists())
        .applied_objects()
        .take(2)
        .try_collect::<Vec<_>>();
    let seen = tokio::time::timeout(Duration::from_secs(5), seen)
        .await
        .unwrap()
        .unwrap();
    let mut names: Vec<_> = seen.iter().map(ResourceExt::name_any).collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let api = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("held".into());
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let first = cms.delete("held", &DeleteParams::default()).await.unwrap();
    let pending = first.left().expect("the object is still there");
    assert!(pending.metadata.deletion_timestamp.is_some());
    // Deleting twice is fine.
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    // No new finalizers on a deleting object.
    let err = api_err(
        cms.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "another"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(cms.get("held").await.unwrap_err()).code, 404);

    // Owner references: deleting the owner collects dependents.
    let owner = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: kube::core::ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut dep = ConfigMap::default();
    dep.metadata.name = Some("dep".into());
    dep.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.uid().unwrap(),
            ..Default::default()
        },
    ]);
    cms.create(&PostParams::default(), &dep).await.unwrap();
    // A dependent of an owner that is gone (another UID under the name) goes at once.
    let mut stray = dep.clone();
    stray.metadata.name = Some("stray".into());
    stray.metadata.owner_references.as_mut().unwrap()[0].uid = "not-the-owner".into();
    cms.create(&PostParams::default(), &stray).await.unwrap();
    assert_eq!(api_err(cms.get("stray").await.unwrap_err()).code, 404);
    assert!(cms.get("dep").await.is_ok(), "its owner is there");
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(cms.get("dep").await.unwrap_err()).code, 404);

    // Deleting a namespace deletes what is in it.
    let nss: Api<Namespace> = Api::all(api.client());
    let mut ns = Namespace::default();
    ns.metadata.name = Some("scratch".into());
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let in_ns: Api<ConfigMap> = Api::namespaced(api.client(), "scratch");
    cm.metadata.finalizers = None;
    cm.metadata.name = Some("x".into());
    in_ns.create(&PostParams::default(), &cm).await.unwrap();
    nss.delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    assert!(api.object("namespaces", None, "scratch").is_none());
    assert!(
        api.objects("configmaps")
            .iter()
            .all(|o| o["metadata"]["namespace"] != "scratch")
    );
}

#[derive(Debug)]
struct ReconcileError(String);
impl std::fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ReconcileError {}

struct Ctx {
    api: Api<Widget>,
    cleaned: tokio::sync::mpsc::UnboundedSender<String>,
}

async fn reconcile(w: Arc<Widget>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    finalizer(&ctx.api, "test.fake-kube.dev/cleanup", w, |event| async {
        match event {
            FinalizerEvent::Apply(w) => {
                let status = json!({"status": {"ready": true}});
                ctx.api
                    .patch_status(
                        &w.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(status),
                    )
                    .await
                    .map_err(|e| ReconcileError(e.to_string()))?;
                Ok(Action::await_change())
            }
            FinalizerEvent::Cleanup(w) => {
                let _ = ctx.cleaned.send(w.name_any());
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e: kube::runtime::finalizer::Error<ReconcileError>| ReconcileError(e.to_string()))
}

#[tokio::test]
async fn controller_with_finalizer() {
    let api = FakeApi::new();
    let client = api.client();
    let widgets = install_widget_crd(&client).await;
    let (tx, mut cleaned) = tokio::sync::mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        api: widgets.clone(),
        cleaned: tx,
    });
    let controller = Controller::new(widgets.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            ctx,
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);

    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    let ready = async {
        loop {
            let w = widgets.get("w").await.unwrap();
            if w.status.as_ref().is_some_and(|s| s.ready) {
                return w;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let w = tokio::time::timeout(Duration::from_secs(10), ready)
        .await
        .expect("reconciled");
    assert_eq!(w.finalizers(), ["test.fake-kube.dev/cleanup"]);

    widgets.delete("w", &DeleteParams::default()).await.unwrap();
    let name = tokio::time::timeout(Duration::from_secs(10), cleaned.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name, "w");
    let gone = async {
        while widgets.get_opt("w").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("finalizer released");
    handle.abort();

    // Every call the controller made is on record, with its RBAC verb.
    let verbs: std::collections::BTreeSet<(String, String)> = api
        .requests()
        .iter()
        .filter(|r| r.resource.is_some())
        .map(|r| (r.verb.clone(), r.rbac_resource().unwrap()))
        .collect();
    for want in [
        ("list", "widgets"),
        ("watch", "widgets"),
        ("patch", "widgets"),
        ("patch", "widgets/status"),
    ] {
        assert!(
            verbs.contains(&(want.0.to_string(), want.1.to_string())),
            "missing {want:?} in {verbs:?}"
        );
    }
}

#[tokio::test]
async fn reviews_answer_as_programmed() {
    let api = FakeApi::new();
    api.add_token("tok-1", UserInfo::new("system:serviceaccount:ns:reader"));
    api.allow(AccessRule::user(
        "system:serviceaccount:ns:reader",
        ["get"],
        ["proxies"],
    ));
    let client = api.client();
    let tr_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("authentication.k8s.io", "v1", "TokenReview"),
        "tokenreviews",
    );
    let tr: Api<DynamicObject> = Api::all_with(client.clone(), &tr_ar);
    let mut review = DynamicObject::new("", &tr_ar);
    review.metadata.name = None;
    review.data = json!({"spec": {"token": "tok-1"}});
    let answer = tr.create(&PostParams::default(), &review).await.unwrap();
    assert_eq!(answer.data["status"]["authenticated"], true);
    assert_eq!(
        answer.data["status"]["user"]["username"],
        "system:serviceaccount:ns:reader"
    );
    review.data = json!({"spec": {"token": "nope"}});
    assert_eq!(
        tr.create(&PostParams::default(), &review)
            .await
            .unwrap()
            .data["status"]["authenticated"],
        false
    );

    let sar_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("authorization.k8s.io", "v1", "SubjectAccessReview"),
        "subjectaccessreviews",
    );
    let sar: Api<DynamicObject> = Api::all_with(client, &sar_ar);
    let mut req = DynamicObject::new("", &sar_ar);
    req.metadata.name = None;
    req.data = json!({"spec": {"user": "system:serviceaccount:ns:reader",
        "resourceAttributes": {"verb": "get", "group": "egress.proxy-operator.dev", "resource": "proxies", "namespace": "a"}}});
    assert_eq!(
        sar.create(&PostParams::default(), &req).await.unwrap().data["status"]["allowed"],
        true
    );
    req.data["spec"]["resourceAttributes"]["verb"] = json!("delete");
    assert_eq!(
        sar.create(&PostParams::default(), &req).await.unwrap().data["status"]["allowed"],
        false
    );

    // Subresources are named `resource/subresource`, as in RBAC rules: a rule for
    // `proxypools/scale` allows scaling but not patching the pool itself.
    api.allow(AccessRule::user(
        "system:serviceaccount:ns:scaler",
        ["get", "patch"],
        ["proxypools/scale"],
    ));
    req.data = json!({"spec": {"user": "system:serviceaccount:ns:scaler",
        "resourceAttributes": {"verb": "patch", "group": "egress.proxy-operator.dev",
            "resource": "proxypools", "subresource": "scale", "namespace": "a", "name": "p"}}});
    assert_eq!(
        sar.create(&PostParams::default(), &req).await.unwrap().data["status"]["allowed"],
        true
    );
    req.data["spec"]["resourceAttributes"]["subresource"] = json!("");
    assert_eq!(
        sar.create(&PostParams::default(), &req).await.unwrap().data["status"]["allowed"],
        false
    );
}

#[tokio::test]
async fn two_clients_over_http_share_state() {
    let api = FakeApi::new();
    let addr = api.serve("127.0.0.1:0").await.unwrap();
    let remote = api.http_client(addr).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(remote);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("over-http".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let local: Api<ConfigMap> = Api::default_namespaced(api.client());
    assert!(local.get_opt("over-http").await.unwrap().is_some());
    let mut watch = watcher(cms, watcher::Config::default())
        .applied_objects()
        .boxed();
    let first = tokio::time::timeout(Duration::from_secs(5), watch.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.unwrap().name_any(), "over-http");
}

#[tokio::test]
async fn lease_manager_elects_one_leader() {
    use kube_lease_manager::LeaseManagerBuilder;
    let api = FakeApi::new();
    let manager = |id: &'static str| {
        LeaseManagerBuilder::new(api.client(), "leader")
            .with_identity(id)
            .with_duration(3)
            .with_grace(1)
            .build()
    };
    let a = manager("a").await.unwrap();
    let b = manager("b").await.unwrap();
    assert!(a.changed().await.unwrap(), "a takes the free lease");
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), b.changed())
            .await
            .is_err(),
        "b cannot take a held lease"
    );
    let lease = api.object("leases", Some("default"), "leader").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
    a.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), b.changed())
        .await
        .expect("b acquires");
    assert!(got.unwrap());
    let lease = api.object("leases", Some("default"), "leader").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "b");
}

#[tokio::test]
async fn runtime_recorder_publishes_events() {
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let api = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("subject".into());
    let cm = cms.create(&PostParams::default(), &cm).await.unwrap();
    let recorder = Recorder::new(
        api.client(),
        Reporter {
            controller: "fake-kube-test".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "Tested".into(),
        note: Some("first".into()),
        action: "Test".into(),
        secondary: None,
    };
    recorder.publish(&ev, &cm.object_ref(&())).await.unwrap();
    // The same event again becomes a series on the same object (a merge patch).
    recorder.publish(&ev, &cm.object_ref(&())).await.unwrap();
    let events = api.objects("events.events.k8s.io");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "Tested");
    assert_eq!(events[0]["regarding"]["name"], "subject");
    assert_eq!(events[0]["series"]["count"], 2);
}
