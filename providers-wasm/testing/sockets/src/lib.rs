//! A plugin that imports `wasi:sockets` (through std's `TcpStream`), which the WIT world
//! does not offer: the host must refuse to load it rather than link sockets in. Never
//! deploy it.

use egress_guest_sdk::*;

struct Sockets;
export_provider!(Sockets);

impl Provider for Sockets {
    const OUTCOMES: egress_guest_sdk::outcome::Outcomes =
        egress_guest_sdk::outcome::Outcomes::new("sockets");

    fn info() -> PluginInfo {
        PluginInfo::new("sockets", env!("CARGO_PKG_VERSION"))
    }

    fn validate_config(_config: &str) -> Result<(), ProviderError> {
        Ok(())
    }

    fn create(_req: CreateRequest) -> Result<String, ProviderError> {
        Err(ProviderError::permanent("sockets plugin creates nothing"))
    }

    /// The raw socket the sandbox must never hand out.
    fn get(id: &str) -> Result<Instance, ProviderError> {
        match std::net::TcpStream::connect("127.0.0.1:9") {
            Ok(s) => Ok(Instance {
                id: id.to_string(),
                ip: s.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
                state: State::Running,
                uid: String::new(),
                created_at: None,
                ..Instance::empty()
            }),
            Err(e) => Err(ProviderError::transient(e.to_string()).with_code("SocketError")),
        }
    }

    fn delete(_id: &str) -> Result<(), ProviderError> {
        Ok(())
    }

    fn list_by_tag(_installation: &str) -> Result<Vec<Instance>, ProviderError> {
        Ok(Vec::new())
    }
}
