//! Requests a plugin never declared it can serve, refused by [`export_provider!`] before
//! the plugin's own code runs.
//!
//! Why in the SDK rather than in each plugin: a field added to the contract reaches every
//! plugin whether or not its author read it. A plugin that ignores `ip-family` would create
//! an IPv4-only instance for an IPv6 Proxy (which then never becomes usable), and one that
//! ignores `capacity` would bill on-demand prices for a spot request. Declaring support is
//! one constant; forgetting it costs a clear permanent error, not a wrong instance.
//!
//! [`export_provider!`]: crate::export_provider

use crate::{CreateRequest, Placement, Provider, ProviderError};

/// Code of the errors below: the request asks for something this plugin cannot give.
pub const CODE: &str = egress_contract::codes::UNSUPPORTED;

/// Why `create` of `req` cannot be served by `P`, if it cannot.
#[cfg(not(feature = "contract-v0-1"))]
pub fn create<P: Provider + ?Sized>(req: &CreateRequest) -> Option<ProviderError> {
    if req.ip_family == crate::IpFamily::Ipv6 && !P::IPV6 {
        return Some(refuse::<P>(
            "ipFamily IPv6",
            "cannot give an instance a public IPv6 address",
        ));
    }
    placement::<P>(&req.placement)
}

/// Why a request for `placement` cannot be served by `P`, if it cannot.
#[cfg(not(feature = "contract-v0-1"))]
pub fn placement<P: Provider + ?Sized>(placement: &Placement) -> Option<ProviderError> {
    (placement.capacity == crate::Capacity::Spot && !P::SPOT).then(|| {
        refuse::<P>(
            "placement.capacity Spot",
            "has no spot or preemptible capacity",
        )
    })
}

/// Contract 0.1.0 has neither field: nothing to refuse.
#[cfg(feature = "contract-v0-1")]
pub fn create<P: Provider + ?Sized>(_req: &CreateRequest) -> Option<ProviderError> {
    None
}

/// See [`create`].
#[cfg(feature = "contract-v0-1")]
pub fn placement<P: Provider + ?Sized>(_placement: &Placement) -> Option<ProviderError> {
    None
}

#[cfg(not(feature = "contract-v0-1"))]
fn refuse<P: Provider + ?Sized>(field: &str, what: &str) -> ProviderError {
    ProviderError::permanent(format!(
        "{field}: the {} provider {what}; use another provider or leave the field unset",
        P::info().type_name
    ))
    .with_code(CODE)
}

#[cfg(all(test, not(feature = "contract-v0-1")))]
mod tests {
    use super::*;
    use crate::{Capacity, Instance, IpFamily, PluginInfo};

    /// A plugin declaring what `IPV6` and `SPOT` say; it never runs (only `info` is read).
    struct Plugin<const IPV6: bool, const SPOT: bool>;

    impl<const V6: bool, const S: bool> Provider for Plugin<V6, S> {
        const OUTCOMES: crate::outcome::Outcomes = crate::outcome::Outcomes::new("acme");
        const IPV6: bool = V6;
        const SPOT: bool = S;
        fn info() -> PluginInfo {
            PluginInfo::new("acme", "1.0.0")
        }
        fn validate_config(_: &str) -> Result<(), ProviderError> {
            unreachable!()
        }
        fn create(_: CreateRequest) -> Result<String, ProviderError> {
            unreachable!()
        }
        fn get(_: &str) -> Result<Instance, ProviderError> {
            unreachable!()
        }
        fn delete(_: &str) -> Result<(), ProviderError> {
            unreachable!()
        }
        fn list_by_tag(_: &str) -> Result<Vec<Instance>, ProviderError> {
            unreachable!()
        }
    }

    fn request(family: IpFamily, capacity: Capacity) -> CreateRequest {
        CreateRequest {
            name: "proxy-x".into(),
            uid: "u".into(),
            namespace: "default".into(),
            proxy_name: "p".into(),
            installation: "i".into(),
            placement: Placement {
                capacity,
                ..Placement::new("r", "", "m", "img")
            },
            cloud_init: Vec::new(),
            port: 3128,
            ip_family: family,
        }
    }

    #[test]
    fn what_a_plugin_did_not_declare_is_refused_naming_the_field() {
        use {Capacity::*, IpFamily::*};
        for (family, capacity, refused_for) in [
            (Ipv4, OnDemand, [None, None, None, None]),
            (
                Ipv6,
                OnDemand,
                [Some("ipFamily IPv6"), None, Some("ipFamily IPv6"), None],
            ),
            (
                Ipv4,
                Spot,
                [
                    Some("placement.capacity Spot"),
                    Some("placement.capacity Spot"),
                    None,
                    None,
                ],
            ),
        ] {
            let req = request(family, capacity);
            // Plugins declaring: nothing, IPv6, spot, both.
            let got = [
                create::<Plugin<false, false>>(&req),
                create::<Plugin<true, false>>(&req),
                create::<Plugin<false, true>>(&req),
                create::<Plugin<true, true>>(&req),
            ];
            for (got, want) in got.into_iter().zip(refused_for) {
                match (got, want) {
                    (None, None) => {}
                    (Some(e), Some(field)) => {
                        assert_eq!(e.class, crate::ErrorClass::Permanent);
                        assert_eq!(e.code.as_deref(), Some(CODE));
                        assert!(
                            e.message.starts_with(field) && e.message.contains("acme"),
                            "{}",
                            e.message
                        );
                    }
                    (got, want) => panic!("{family:?} {capacity:?}: {got:?}, want {want:?}"),
                }
            }
        }
        let spot = request(Ipv4, Spot).placement;
        assert!(placement::<Plugin<true, false>>(&spot).is_some());
        assert!(placement::<Plugin<false, true>>(&spot).is_none());
    }
}
