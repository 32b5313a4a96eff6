//! The JSON shapes of the API reference: servers, locations (and the datacenters of the
//! old shape), Primary IPs, actions.
//! Kept apart from the state rules so the wire format can be compared with the reference
//! in one place.

use serde_json::{Value, json};

use super::LocationSpec;
use super::ServerTypeSpec;
use super::state::{Backend, IpKind, PrimaryIp, Server, rfc3339};

impl Backend {
    pub(crate) fn server_json_by_id(&self, id: u64) -> Option<Value> {
        self.servers.get(&id).map(|s| self.server_json(s))
    }

    pub(super) fn server_json(&self, s: &Server) -> Value {
        let ipv4 = s.ipv4.and_then(|i| self.ips.get(&i)).map(|ip| {
            json!({"id": ip.id, "ip": ip.ip, "blocked": false, "dns_ptr": reverse_dns(&ip.ip)})
        });
        let ipv6 = s
            .ipv6
            .and_then(|i| self.ips.get(&i))
            .map(|ip| json!({"id": ip.id, "ip": ip.ip, "blocked": false, "dns_ptr": []}));
        let st = &s.server_type;
        let mut server = json!({
            "id": s.id,
            "name": s.name,
            "status": s.status,
            "created": rfc3339(s.created),
            "public_net": {"ipv4": ipv4, "ipv6": ipv6, "floating_ips": [], "firewalls": []},
            "private_net": [],
            "server_type": self.server_type_json(st),
            "image": {
                "id": s.image.id, "type": "system", "status": "available",
                "name": s.image.name, "description": s.image.description,
                "image_size": null, "disk_size": 5, "created": rfc3339(1_700_000_000),
                "created_from": null, "bound_to": null, "os_flavor": s.image.os_flavor,
                "os_version": s.image.os_version, "rapid_deploy": true,
                "protection": {"delete": false}, "deprecated": null, "deleted": null,
                "labels": {}, "architecture": st.architecture,
            },
            "iso": null,
            "rescue_enabled": false,
            "locked": s.locked,
            "backup_window": null,
            "outgoing_traffic": 0,
            "ingoing_traffic": 0,
            "included_traffic": 21_990_232_555_520u64,
            "protection": {"delete": false, "rebuild": false},
            "labels": s.labels,
            "volumes": [],
            "load_balancers": [],
            "primary_disk_size": st.disk_gb,
            "placement_group": null,
        });
        self.place(&mut server, &s.location);
        server
    }

    /// Where a server or Primary IP is: a top-level `location` since the datacenter
    /// phase-out (hcloud-go v2.45.0), `datacenter` with its `location` before it.
    fn place(&self, v: &mut Value, l: &LocationSpec) {
        match self.cfg.legacy_datacenter {
            true => v["datacenter"] = self.datacenter_json(l),
            false => v["location"] = location_json(l),
        }
    }

    /// A server type as `GET /server_types` and a server show it, with a price per location
    /// that offers it (`prices[].price_hourly.net`/`gross`, EUR, as ten-decimal strings).
    pub(super) fn server_type_json(&self, st: &ServerTypeSpec) -> Value {
        let net: f64 = st.price_hourly_net.parse().unwrap_or_default();
        let text = |v: f64| format!("{v:.10}");
        let prices: Vec<Value> = self
            .cfg
            .locations
            .iter()
            .filter(|l| st.available_in(&l.name))
            .map(|l| {
                json!({
                    "location": l.name,
                    "price_hourly": {"net": st.price_hourly_net, "gross": text(net * 1.19)},
                    "price_monthly": {"net": text(net * 730.0), "gross": text(net * 730.0 * 1.19)},
                    "included_traffic": 21_990_232_555_520u64,
                    "price_per_tb_traffic": {"net": "1.0000000000", "gross": "1.1900000000"},
                })
            })
            .collect();
        json!({
            "id": st.id, "name": st.name, "description": st.name.to_uppercase(),
            "cores": st.cores, "memory": st.memory_gb, "disk": st.disk_gb,
            "deprecated": false, "deprecation": null, "prices": prices, "storage_type": "local",
            "cpu_type": st.cpu_type, "architecture": st.architecture,
        })
    }

    /// `GET /server_types`, filtered by `name` (one page: the catalogue is small).
    pub(crate) fn list_server_types(&self, query: &[(String, String)]) -> Value {
        let name = query.iter().find(|(k, _)| k == "name").map(|(_, v)| v.as_str());
        let types: Vec<Value> = self
            .cfg
            .server_types
            .iter()
            .filter(|t| name.is_none_or(|n| t.name == n))
            .map(|t| self.server_type_json(t))
            .collect();
        let n = types.len();
        json!({
            "server_types": types,
            "meta": {"pagination": {"page": 1, "per_page": 50, "previous_page": null,
                                    "next_page": null, "last_page": 1, "total_entries": n}},
        })
    }

    fn datacenter_json(&self, l: &LocationSpec) -> Value {
        let types: Vec<u64> = self
            .cfg
            .server_types
            .iter()
            .filter(|t| t.available_in(&l.name))
            .map(|t| t.id)
            .collect();
        json!({
            "id": l.datacenter_id(),
            "name": l.datacenter,
            "description": format!("{} datacenter", l.city),
            "location": location_json(l),
            "server_types": {"supported": types, "available": types, "available_for_migration": types},
        })
    }

    pub(super) fn ip_json(&self, ip: &PrimaryIp) -> Value {
        let dns_ptr = match ip.kind {
            IpKind::V4 => json!([{"ip": ip.ip, "dns_ptr": reverse_dns(&ip.ip)}]),
            IpKind::V6 => json!([]),
        };
        let mut v = json!({
            "id": ip.id,
            "name": ip.name,
            "labels": ip.labels,
            "created": rfc3339(ip.created),
            "blocked": false,
            "ip": ip.ip,
            "dns_ptr": dns_ptr,
            "protection": {"delete": false},
            "type": ip.kind.as_str(),
            "auto_delete": ip.auto_delete,
            "assignee_type": "server",
            "assignee_id": ip.assignee,
        });
        self.place(&mut v, &ip.location);
        v
    }

    pub(super) fn action_json(&self, id: u64) -> Value {
        let Some(a) = self.actions.get(&id) else {
            return Value::Null;
        };
        let resources: Vec<Value> =
            a.resources.iter().map(|(id, kind)| json!({"id": id, "type": kind})).collect();
        json!({
            "id": a.id,
            "command": a.command,
            "status": a.status,
            "progress": if a.status == "running" { 0 } else { 100 },
            "started": rfc3339(a.started),
            "finished": a.finished.map(rfc3339),
            "resources": resources,
            "error": a.error.as_ref().map(|(code, message)| json!({"code": code, "message": message})),
        })
    }
}

/// A location as `GET /v1/locations` and every resource placed in one show it.
fn location_json(l: &LocationSpec) -> Value {
    json!({
        "id": l.id, "name": l.name, "description": l.description, "country": l.country,
        "city": l.city, "latitude": l.latitude, "longitude": l.longitude,
        "network_zone": l.network_zone,
    })
}

/// The PTR Hetzner sets for its IPv4 addresses.
fn reverse_dns(ip: &str) -> String {
    let mut parts: Vec<&str> = ip.split('.').collect();
    parts.reverse();
    format!("static.{}.clients.your-server.de", parts.join("."))
}
