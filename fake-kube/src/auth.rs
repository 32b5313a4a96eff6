//! Programmable answers for TokenReview and SubjectAccessReview.
//!
//! A service that authenticates its callers by delegating to the API server (as the
//! discovery API does) needs both reviews; tests decide who a token is and what that
//! identity may do, then check the service's decisions.

use serde_json::{Value, json};
use std::collections::BTreeMap;

/// An authenticated identity, as a TokenReview reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn new(username: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            uid: String::new(),
            groups: vec!["system:authenticated".into()],
        }
    }

    pub fn with_groups<I: IntoIterator<Item = S>, S: Into<String>>(mut self, groups: I) -> Self {
        self.groups = groups.into_iter().map(Into::into).collect();
        self
    }
}

/// One allow rule for SubjectAccessReview. Empty lists and `"*"` match anything; a rule
/// matches a subject by user name or by any of its groups.
#[derive(Debug, Clone, Default)]
pub struct AccessRule {
    pub users: Vec<String>,
    pub groups: Vec<String>,
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub namespaces: Vec<String>,
    pub names: Vec<String>,
    /// For non-resource requests (`nonResourceAttributes.path`); a trailing `*` is a prefix match.
    pub non_resource_urls: Vec<String>,
}

fn any(list: &[String], v: &str) -> bool {
    list.is_empty() || list.iter().any(|x| x == "*" || x == v)
}

impl AccessRule {
    /// Allows `verbs` on `resources` (any group, namespace and name) for the user.
    pub fn user<S: Into<String>>(
        user: impl Into<String>,
        verbs: impl IntoIterator<Item = S>,
        resources: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            users: vec![user.into()],
            verbs: verbs.into_iter().map(Into::into).collect(),
            resources: resources.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    fn subject_matches(&self, user: &str, groups: &[String]) -> bool {
        if self.users.is_empty() && self.groups.is_empty() {
            return true;
        }
        self.users.iter().any(|u| u == "*" || u == user)
            || self.groups.iter().any(|g| groups.contains(g))
    }

    fn matches(&self, spec: &Value) -> bool {
        let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
        let groups: Vec<String> = spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|g| g.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if !self.subject_matches(user, &groups) {
            return false;
        }
        if let Some(ra) = spec.get("resourceAttributes") {
            let s = |k: &str| ra.get(k).and_then(Value::as_str).unwrap_or("");
            let resource = if s("subresource").is_empty() {
                s("resource").to_string()
            } else {
                format!("{}/{}", s("resource"), s("subresource"))
            };
            return any(&self.verbs, s("verb"))
                && any(&self.api_groups, s("group"))
                && any(&self.resources, &resource)
                && any(&self.namespaces, s("namespace"))
                && any(&self.names, s("name"));
        }
        if let Some(nra) = spec.get("nonResourceAttributes") {
            let path = nra.get("path").and_then(Value::as_str).unwrap_or("");
            let verb = nra.get("verb").and_then(Value::as_str).unwrap_or("");
            return any(&self.verbs, verb)
                && !self.non_resource_urls.is_empty()
                && self
                    .non_resource_urls
                    .iter()
                    .any(|u| match u.strip_suffix('*') {
                        Some(prefix) => path.starts_with(prefix),
                        None => u == path,
                    });
        }
        false
    }
}

#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub tokens: BTreeMap<String, UserInfo>,
    pub rules: Vec<AccessRule>,
}

impl AuthConfig {
    pub fn token_review(&self, mut review: Value) -> Value {
        let token = review
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or("");
        let audiences = review.pointer("/spec/audiences").cloned();
        review["status"] = match self.tokens.get(token) {
            Some(u) => {
                let mut status = json!({
                    "authenticated": true,
                    "user": {"username": u.username, "uid": u.uid, "groups": u.groups},
                });
                if let Some(a) = audiences {
                    status["audiences"] = a;
                }
                status
            }
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        review
    }

    pub fn subject_access_review(&self, mut review: Value) -> Value {
        let spec = review.get("spec").cloned().unwrap_or(Value::Null);
        let allowed = self.rules.iter().any(|r| r.matches(&spec));
        review["status"] = if allowed {
            json!({"allowed": true, "reason": "allowed by a fake-kube rule"})
        } else {
            json!({"allowed": false, "reason": "no fake-kube rule allows it"})
        };
        review
    }
}
