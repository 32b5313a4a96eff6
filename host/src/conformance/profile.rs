//! The behaviour profile a plugin declares in `info`: one answer per axis of the provider
//! contract. The answers are not decoration: the suite uses them to decide what a passing
//! behaviour is (a `fail-whole` list must fail when a scope is down, an `omit-unreachable`
//! one must answer without it), so an unknown or missing answer is a failure of its own.

use std::collections::BTreeMap;

/// Every axis and the answers it allows, in the order the contract lists them.
pub const AXES: &[(&str, &[&str])] = &[
    ("readiness", &["immediate", "provisioning-window"]),
    ("create-return", &["submit", "blocking"]),
    ("delete-return", &["returns-early", "waits"]),
    ("ip-source", &["assigned-at-create", "discovered"]),
    (
        "gc-mark",
        &["native-labels", "written-metadata", "mark-window"],
    ),
    ("created-at", &["backend-timestamp", "written-at-create"]),
    ("list-partial", &["fail-whole", "omit-unreachable"]),
    ("quota", &["detected", "absent"]),
    ("not-found", &["status-404", "error-code", "list-and-miss"]),
    ("primary-key", &["name-is-key", "allocated-id"]),
    ("provisioning-state", &["native", "create-blocks", "marker"]),
    ("async-ops", &["none", "task-handle", "backend-lock"]),
    ("secondary-resources", &["none", "cascade", "explicit"]),
    (
        "credentials",
        &["mounted-files", "environment", "workload-identity"],
    ),
    (
        "client-kind",
        &["vendor-sdk", "thin-client", "rpc-over-ssh"],
    ),
    ("timeouts", &["per-call", "ctx-only"]),
    ("logging", &["tiered", "outcome-only", "none"]),
    (
        "child-spans",
        &[
            "sdk-instrumentation",
            "transport-wrapper",
            "span-decorator",
            "none",
        ],
    ),
    (
        "backend-test",
        &["cluster-e2e", "integration-tag", "manual-runbook"],
    ),
];

/// A profile as `info` returns it, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile(BTreeMap<String, String>);

impl Profile {
    pub fn new(pairs: &[(String, String)]) -> Self {
        Profile(pairs.iter().cloned().collect())
    }

    pub fn get(&self, axis: &str) -> Option<&str> {
        self.0.get(axis).map(String::as_str)
    }

    /// Every problem with the profile, one line each: a missing axis, an answer the axis
    /// does not allow, an axis the contract does not have, an axis answered twice.
    pub fn problems(pairs: &[(String, String)]) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (axis, value) in pairs {
            if !seen.insert(axis.as_str()) {
                out.push(format!("axis {axis:?} is answered more than once"));
            }
            match AXES.iter().find(|(a, _)| a == axis) {
                None => out.push(format!("{axis:?} is not an axis of the contract")),
                Some((_, allowed)) if !allowed.contains(&value.as_str()) => out.push(format!(
                    "{axis}={value:?} is not one of {}",
                    allowed.join(", ")
                )),
                Some(_) => {}
            }
        }
        for (axis, allowed) in AXES {
            if !seen.contains(axis) {
                out.push(format!(
                    "axis {axis:?} is not answered (one of {})",
                    allowed.join(", ")
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Vec<(String, String)> {
        AXES.iter()
            .map(|(a, allowed)| (a.to_string(), allowed[0].to_string()))
            .collect()
    }

    #[test]
    fn a_complete_profile_has_no_problems() {
        assert_eq!(Profile::problems(&full()), Vec::<String>::new());
        assert_eq!(
            Profile::new(&full()).get("list-partial"),
            Some("fail-whole")
        );
    }

    #[test]
    fn each_kind_of_mistake_is_named() {
        type Mutation = Box<dyn Fn(&mut Vec<(String, String)>)>;
        let cases: Vec<(&str, Mutation, &str)> = vec![
            (
                "missing",
                Box::new(|p| p.retain(|(a, _)| a != "quota")),
                "axis \"quota\" is not answered (one of detected, absent)",
            ),
            (
                "unknown value",
                Box::new(|p| p[0].1 = "sometimes".into()),
                "readiness=\"sometimes\" is not one of immediate, provisioning-window",
            ),
            (
                "unknown axis",
                Box::new(|p| p.push(("colour".into(), "blue".into()))),
                "\"colour\" is not an axis of the contract",
            ),
            (
                "twice",
                Box::new(|p| p.push(("quota".into(), "absent".into()))),
                "axis \"quota\" is answered more than once",
            ),
        ];
        for (name, mutate, want) in cases {
            let mut p = full();
            mutate(&mut p);
            assert_eq!(Profile::problems(&p), vec![want.to_string()], "{name}");
        }
    }
}
