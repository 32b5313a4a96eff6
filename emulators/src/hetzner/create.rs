//! The create-server request: field validation with Hetzner's `invalid_input` details,
//! before any catalogue lookup.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::error::HetznerError;
use super::labels;

/// Cloud-init user data limit from the create-server reference.
const USER_DATA_MAX: usize = 32 * 1024;

/// RFC 1123 hostname: dot-separated labels of letters, digits and `-`, as the reference
/// requires of server names.
pub(super) fn check_hostname(name: &str, errs: &mut Vec<(String, String)>) {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if !ok {
        errs.push(("name".into(), "is not a valid hostname".into()));
    }
}

pub(super) fn check_labels(labels: &BTreeMap<String, String>, errs: &mut Vec<(String, String)>) {
    for (k, v) in labels {
        if let Err(e) = labels::validate_key(k).and_then(|_| labels::validate_value(v)) {
            errs.push(("labels".into(), e));
            return;
        }
    }
}

/// The create body after field validation; catalogue lookups come later.
pub(super) struct CreateRequest {
    pub(super) name: String,
    pub(super) server_type: String,
    pub(super) image: String,
    pub(super) location: Option<String>,
    pub(super) datacenter: Option<String>,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) user_data: Option<String>,
    pub(super) start_after_create: bool,
    pub(super) has_ssh_keys: bool,
    pub(super) enable_ipv4: bool,
    pub(super) enable_ipv6: bool,
    pub(super) ipv4: Option<u64>,
    pub(super) ipv6: Option<u64>,
}

const MISSING: &str = "Missing data for required field.";

impl CreateRequest {
    pub(super) fn parse(obj: &Map<String, Value>) -> Result<CreateRequest, HetznerError> {
        let mut errs: Vec<(String, String)> = Vec::new();

        let name = match obj.get("name") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => {
                bad(&mut errs, "name", MISSING);
                String::new()
            }
            Some(_) => {
                bad(&mut errs, "name", "Not a valid string.");
                String::new()
            }
        };
        let server_type = id_or_name(obj, "server_type", true, &mut errs).unwrap_or_default();
        let image = id_or_name(obj, "image", true, &mut errs).unwrap_or_default();
        let location = id_or_name(obj, "location", false, &mut errs);
        let datacenter = id_or_name(obj, "datacenter", false, &mut errs);
        let start_after_create =
            flag(obj.get("start_after_create"), "start_after_create", &mut errs);
        let user_data = match obj.get("user_data") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.len() > USER_DATA_MAX => {
                bad(&mut errs, "user_data", "is too long");
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                bad(&mut errs, "user_data", "Not a valid string.");
                None
            }
        };
        let mut labels = BTreeMap::new();
        match obj.get("labels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    match v {
                        Value::String(v) => {
                            labels.insert(k.clone(), v.clone());
                        }
                        _ => bad(
                            &mut errs,
                            "labels",
                            &format!("label value for '{k}' is not a string"),
                        ),
                    }
                }
            }
            Some(_) => bad(&mut errs, "labels", "Not a valid mapping type."),
        }
        let has_ssh_keys = match obj.get("ssh_keys") {
            None | Some(Value::Null) => false,
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => {
                bad(&mut errs, "ssh_keys", "Not a valid list.");
                false
            }
        };
        let (mut enable_ipv4, mut enable_ipv6, mut ipv4, mut ipv6) = (true, true, None, None);
        match obj.get("public_net") {
            None | Some(Value::Null) => {}
            Some(Value::Object(pn)) => {
                enable_ipv4 = flag(pn.get("enable_ipv4"), "public_net.enable_ipv4", &mut errs);
                enable_ipv6 = flag(pn.get("enable_ipv6"), "public_net.enable_ipv6", &mut errs);
                ipv4 = ip_id(pn.get("ipv4"), "public_net.ipv4", &mut errs);
                ipv6 = ip_id(pn.get("ipv6"), "public_net.ipv6", &mut errs);
            }
            Some(_) => bad(&mut errs, "public_net", "Not a valid mapping type."),
        }
        if location.is_some() && datacenter.is_some() {
            // Mutually exclusive fields are reported together, as in a captured answer.
            errs.push(("location".into(), "mutually exclusive with datacenter".into()));
            errs.push(("datacenter".into(), "mutually exclusive with location".into()));
        }
        if !name.is_empty() {
            check_hostname(&name, &mut errs);
        }
        check_labels(&labels, &mut errs);
        if !errs.is_empty() {
            return Err(HetznerError::invalid_fields(&errs));
        }
        Ok(CreateRequest {
            name,
            server_type,
            image,
            location,
            datacenter,
            labels,
            user_data,
            start_after_create,
            has_ssh_keys,
            enable_ipv4,
            enable_ipv6,
            ipv4,
            ipv6,
        })
    }
}

fn bad(errs: &mut Vec<(String, String)>, field: &str, msg: &str) {
    errs.push((field.to_string(), msg.to_string()));
}

/// "ID or name" fields: a string, or an integer ID.
fn id_or_name(
    obj: &Map<String, Value>,
    field: &str,
    required: bool,
    err: &mut Vec<(String, String)>,
) -> Option<String> {
    match obj.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) if n.is_u64() => Some(n.to_string()),
        None | Some(Value::Null) => {
            if required {
                bad(err, field, MISSING);
            }
            None
        }
        Some(_) => {
            bad(err, field, "Not a valid string.");
            None
        }
    }
}

/// Booleans that default to true in the reference (`start_after_create`, `enable_ipv*`).
fn flag(v: Option<&Value>, field: &str, err: &mut Vec<(String, String)>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            bad(err, field, "Not a valid boolean.");
            true
        }
    }
}

fn ip_id(v: Option<&Value>, field: &str, err: &mut Vec<(String, String)>) -> Option<u64> {
    match v {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.is_u64() => n.as_u64(),
        Some(_) => {
            bad(err, field, "Not a valid integer.");
            None
        }
    }
}
