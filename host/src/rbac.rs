//! Every Kubernetes API call the operator makes, as RBAC rules: the one place that says
//! what the operator's service account may do.
//!
//! `config/rbac/role.yaml` is generated from [`RULES`] (`proxy-operator rbac`), a test
//! fails when the committed file drifts, and another (host/tests/operator/rbac.rs) runs every loop
//! of the operator against the in-memory API server and checks both directions: every
//! request it made is allowed by a rule, and every verb of every rule was used. A new API
//! call therefore fails a test until it is added here, and a permission nothing uses
//! fails a test until it is removed.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::ObjectMeta;

/// Name of the ServiceAccount, the ClusterRole, the Role and their bindings.
pub const NAME: &str = "proxy-operator";
/// Where the generated manifests are committed, relative to the repository root.
pub const COMMITTED_PATH: &str = "config/rbac/role.yaml";
/// How to rewrite the committed copy.
pub const REGENERATE: &str = "cargo run -p proxy-operator -- rbac > config/rbac/role.yaml \
     (or UPDATE_RBAC=1 cargo test --workspace --test operator rbac::committed_rbac)";

/// Where a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (or a cluster-scoped resource): a ClusterRole rule.
    Cluster,
    /// Only the operator's own namespace: a Role rule.
    OperatorNamespace,
}

/// One permission and the code that needs it.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// API group, `""` for core.
    pub group: &'static str,
    /// `resource` or `resource/subresource`.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// When not empty, the rule only covers these object names.
    pub names: &'static [&'static str],
    pub scope: Scope,
    /// Who makes the call, for the generated YAML's comment and review.
    pub why: &'static str,
}

const GROUP: &str = crate::api::GROUP;

/// The operator's permissions. Keep each rule to one resource, so the tests can say which
/// verb of which resource is unused.
pub const RULES: &[Rule] = &[
    Rule {
        group: GROUP,
        resource: "proxies",
        verbs: &["get", "list", "watch", "patch", "create", "delete"],
        names: &[],
        scope: Scope::Cluster,
        why: "reconciler (watch, finalizer patches, get: the server's copy before each Create, so a watch that lags sends no second Create), orphan GC (list), discovery API cache (list, watch), ProxyPool controller (create, delete the pool's Proxies)",
    },
    Rule {
        group: GROUP,
        resource: "proxies/status",
        verbs: &["patch"],
        names: &[],
        scope: Scope::Cluster,
        why: "reconciler and health engine: conditions, IP, last probe (server-side apply)",
    },
    Rule {
        group: GROUP,
        resource: "proxypools",
        verbs: &["list", "watch"],
        names: &[],
        scope: Scope::Cluster,
        why: "ProxyPool controller: its trigger and cache",
    },
    Rule {
        group: GROUP,
        resource: "proxypools/status",
        verbs: &["patch"],
        names: &[],
        scope: Scope::Cluster,
        why: "ProxyPool controller: counts, placements, conditions (server-side apply)",
    },
    Rule {
        group: GROUP,
        resource: "providerhealths",
        verbs: &["get", "list", "watch", "patch"],
        names: &[],
        scope: Scope::Cluster,
        why: "provider health monitor (get, apply), status page cache (list, watch)",
    },
    Rule {
        group: GROUP,
        resource: "providerhealths/status",
        verbs: &["patch"],
        names: &[],
        scope: Scope::Cluster,
        why: "provider health monitor: check results (server-side apply)",
    },
    Rule {
        group: "",
        resource: "secrets",
        verbs: &["get", "list", "watch", "create", "delete"],
        names: &[],
        scope: Scope::Cluster,
        why: "reconciler: a Proxy's cloudInit.secretKeyRef and credentials Secret (get, in the Proxy's namespace, only referenced Secrets, once per change); list and watch are metadata-only (PartialObjectMetadata: names and resourceVersions, no values) to know when a Secret changed; create and delete: the Secret of a Proxy's generated credentials (spec.auth.type Generated), owned by the Proxy; discovery API: get of a Proxy's credentials Secret, only for callers allowed get on proxies/credentials",
    },
    Rule {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        names: &[],
        scope: Scope::Cluster,
        why: "reconciler and ProxyPool controller: Events on Proxies and pools (create, then patch to count repeats)",
    },
    Rule {
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        names: &["kube-system"],
        scope: Scope::Cluster,
        why: "installation identity: kube-system's UID (not needed with --installation)",
    },
    Rule {
        group: "authentication.k8s.io",
        resource: "tokenreviews",
        verbs: &["create"],
        names: &[],
        scope: Scope::Cluster,
        why: "discovery API: authenticates bearer tokens",
    },
    Rule {
        group: "authorization.k8s.io",
        resource: "subjectaccessreviews",
        verbs: &["create"],
        names: &[],
        scope: Scope::Cluster,
        why: "discovery API: authorises callers like `kubectl get proxies`",
    },
    Rule {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "patch"],
        names: &[],
        scope: Scope::OperatorNamespace,
        why: "leader election (kube-lease-manager: get, create when missing, server-side apply)",
    },
];

/// One API call, in RBAC terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    pub group: &'a str,
    /// `resource` or `resource/subresource`.
    pub resource: &'a str,
    pub verb: &'a str,
    /// None for cluster-scoped resources and for all-namespace list/watch.
    pub namespace: Option<&'a str>,
    /// None for collection calls (list, watch, create).
    pub name: Option<&'a str>,
}

/// The rule that allows `call` when the operator runs in `operator_namespace`, if any.
/// Follows the API server: a rule with names never covers a collection call
/// (list, watch or create without a name); a Role covers only its namespace.
pub fn allowing<'r>(
    rules: &'r [Rule],
    call: &Call<'_>,
    operator_namespace: &str,
) -> Option<&'r Rule> {
    rules.iter().find(|r| {
        r.group == call.group
            && r.resource == call.resource
            && r.verbs.contains(&call.verb)
            && (r.names.is_empty() || call.name.is_some_and(|n| r.names.contains(&n)))
            && match r.scope {
                Scope::Cluster => true,
                Scope::OperatorNamespace => call.namespace == Some(operator_namespace),
            }
    })
}

fn policy_rules(scope: Scope) -> Vec<PolicyRule> {
    RULES
        .iter()
        .filter(|r| r.scope == scope)
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.group.to_string()]),
            resources: Some(vec![r.resource.to_string()]),
            verbs: r.verbs.iter().map(|v| v.to_string()).collect(),
            resource_names: (!r.names.is_empty())
                .then(|| r.names.iter().map(|n| n.to_string()).collect()),
            non_resource_urls: None,
        })
        .collect()
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(
            [("app.kubernetes.io/name".to_string(), NAME.to_string())]
                .into_iter()
                .collect(),
        ),
        ..Default::default()
    }
}

/// The ClusterRole (everything cluster-wide).
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(NAME),
        rules: Some(policy_rules(Scope::Cluster)),
        aggregation_rule: None,
    }
}

/// The Role for the operator's own namespace (kustomize sets the namespace).
pub fn role() -> Role {
    Role {
        metadata: meta(NAME),
        rules: Some(policy_rules(Scope::OperatorNamespace)),
    }
}

/// `config/rbac/role.yaml`: a header naming each rule's reason, the ClusterRole and the
/// Role.
pub fn yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::from(
        "# Generated from host/src/rbac.rs by `proxy-operator rbac`; do not edit.\n\
         # Why each permission is there:\n",
    );
    for r in RULES {
        let scope = match r.scope {
            Scope::Cluster => "cluster",
            Scope::OperatorNamespace => "operator namespace",
        };
        let group = if r.group.is_empty() { "core" } else { r.group };
        out.push_str(&format!(
            "#   {} ({group}) [{}] {scope}: {}\n",
            r.resource,
            r.verbs.join(", "),
            r.why
        ));
    }
    let with_kind = |mut v: serde_json::Value, kind: &str| {
        v["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
        v["kind"] = kind.into();
        v
    };
    let cr = with_kind(
        serde_json::to_value(cluster_role()).expect("a ClusterRole serializes"),
        "ClusterRole",
    );
    let role = with_kind(
        serde_json::to_value(role()).expect("a Role serializes"),
        "Role",
    );
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(&cr)?);
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(&role)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(
        group: &'a str,
        resource: &'a str,
        verb: &'a str,
        namespace: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Call<'a> {
        Call {
            group,
            resource,
            verb,
            namespace,
            name,
        }
    }

    #[test]
    fn role_rules_cover_only_the_operator_namespace() {
        let ns = "egress-system";
        let lease = |ns| call("coordination.k8s.io", "leases", "patch", ns, Some("l"));
        assert!(allowing(RULES, &lease(Some(ns)), ns).is_some());
        assert!(allowing(RULES, &lease(Some("default")), ns).is_none());
        assert!(allowing(RULES, &lease(None), ns).is_none());
    }

    #[test]
    fn named_rules_cover_only_their_names() {
        let get = |name| call("", "namespaces", "get", None, name);
        assert!(allowing(RULES, &get(Some("kube-system")), "x").is_some());
        assert!(allowing(RULES, &get(Some("default")), "x").is_none());
        assert!(allowing(RULES, &call("", "namespaces", "list", None, None), "x").is_none());
    }

    /// Secrets: `get` reads a referenced cloud-init or credentials Secret; `list` and
    /// `watch` are there for the metadata-only watch (like cert-manager's), which tells the
    /// reconciler when a Secret changed so that it does not GET it on every reconcile. That
    /// watch asks for `PartialObjectMetadata` and gets no values; RBAC cannot tell a
    /// metadata list from a full one, so the role does allow a full list in principle: the
    /// code only ever reads values by GET, and only of Secrets a Proxy references
    /// (controller/secret_cache.rs). `create` and `delete` are for the Secret of a Proxy's
    /// generated credentials, which the operator creates once and deletes with the Proxy
    /// (only one the Proxy owns: controller/reconcile.rs). No Secret is ever changed: no
    /// update or patch (a user's Secret stays theirs), no deletecollection.
    #[test]
    fn secrets_are_read_watched_created_and_deleted_never_changed() {
        let secrets = |verb, ns, name| call("", "secrets", verb, ns, name);
        for allowed in [
            secrets("get", Some("a"), Some("s")),
            secrets("list", None, None),
            secrets("watch", None, None),
            secrets("create", Some("a"), None),
            secrets("delete", Some("a"), Some("s")),
        ] {
            assert!(allowing(RULES, &allowed, "x").is_some(), "{allowed:?}");
        }
        for verb in ["update", "patch", "deletecollection"] {
            assert!(
                allowing(RULES, &secrets(verb, Some("a"), Some("s")), "x").is_none(),
                "{verb}"
            );
        }
    }

    #[test]
    fn verbs_and_subresources_are_distinct() {
        assert!(
            allowing(
                RULES,
                &call("", "secrets", "get", Some("a"), Some("s")),
                "x"
            )
            .is_some()
        );
        // proxies may be patched, not replaced.
        assert!(
            allowing(
                RULES,
                &call(GROUP, "proxies", "update", Some("a"), Some("p")),
                "x"
            )
            .is_none()
        );
        assert!(
            allowing(
                RULES,
                &call(GROUP, "proxies/status", "update", None, Some("p")),
                "x"
            )
            .is_none()
        );
    }

    #[test]
    fn yaml_has_both_roles_and_every_rule() {
        let text = yaml().unwrap();
        let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["kind"], "ClusterRole");
        assert_eq!(docs[1]["kind"], "Role");
        let n = |d: &serde_json::Value| d["rules"].as_array().unwrap().len();
        assert_eq!(n(&docs[0]) + n(&docs[1]), RULES.len());
        assert_eq!(docs[0]["rules"][0]["apiGroups"][0], GROUP);
    }
}
