//! `proxy-operator provider call`: one provider operation through the sandbox, its answer
//! as JSON.

use crate::cli::args::{RuntimeArgs, parse_placement};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{
    Class, CreateRequest, Instance, IpFamily, Op, Placement, Provider, ProviderError, name_from_uid,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The providers file (YAML).
    #[arg(long, alias = "providers")]
    config: PathBuf,
    /// The provider entry to call.
    #[arg(long)]
    provider: String,
    /// Directory holding the plugin components (`*.wasm`).
    #[arg(
        long,
        env = "PLUGIN_DIR",
        default_value = "/etc/proxy-operator/plugins"
    )]
    plugin_dir: PathBuf,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(subcommand)]
    op: CallOp,
}

/// One provider operation, as the operator's loops call it.
#[derive(clap::Subcommand)]
enum CallOp {
    /// Create (or find, by the name derived from --uid) an instance; prints its ID.
    Create {
        /// Where: `region/zone/machineType/image`.
        #[arg(long, value_parser = parse_placement)]
        placement: Placement,
        /// The owner's UID; the instance name derives from it, so a repeat call with the
        /// same UID returns the same instance.
        #[arg(long)]
        uid: String,
        /// User data file (cloud-init); empty when not given.
        #[arg(long)]
        cloud_init: Option<PathBuf>,
        #[arg(long, default_value_t = 3128)]
        port: u16,
        #[arg(long, default_value = "egress-cli")]
        installation: String,
        /// Ask for a public IPv6 address, as a Proxy with `ipFamily: IPv6` does.
        #[arg(long)]
        ipv6: bool,
    },
    /// The instance behind an ID.
    Get { id: String },
    /// Delete the instance behind an ID (deleting something gone succeeds).
    Delete { id: String },
    /// Every managed instance of an installation.
    List {
        #[arg(long, default_value = "egress-cli")]
        installation: String,
    },
    /// The provider's health check.
    Check,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let p = crate::cli::load::provider(
        &args.config,
        &args.provider,
        &args.plugin_dir,
        &args.runtime,
        true,
    )
    .await?;
    match call(&p, args.op).await {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        Err(e) => {
            let v = serde_json::json!({
                "error": {"class": format!("{:?}", e.class), "code": e.code, "message": e.message}
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
            anyhow::bail!("{e}")
        }
    }
}

/// One provider call, its answer as JSON.
async fn call(p: &WasmProvider, op: CallOp) -> Result<serde_json::Value, ProviderError> {
    let instance = |i: &Instance| {
        serde_json::json!({
            "id": i.id,
            "ip": i.ip,
            "ipv6": i.ipv6,
            "state": i.state.as_str(),
            "uid": i.uid,
            "createdAt": i.created_at.map(|t| humantime::format_rfc3339_seconds(t).to_string()),
        })
    };
    Ok(match op {
        CallOp::Create {
            placement,
            uid,
            cloud_init,
            port,
            installation,
            ipv6,
        } => {
            let cloud_init = match cloud_init {
                Some(path) => std::fs::read(&path).map_err(|e| {
                    ProviderError::new(
                        Class::Permanent,
                        Op::Create,
                        p.name(),
                        "",
                        format!("reading --cloud-init {}: {e}", path.display()),
                    )
                })?,
                None => Vec::new(),
            };
            let req = CreateRequest {
                name: name_from_uid(&uid),
                uid,
                namespace: "cli".into(),
                proxy_name: "cli".into(),
                installation,
                placement,
                cloud_init,
                port,
                ip_family: if ipv6 { IpFamily::V6 } else { IpFamily::V4 },
            };
            serde_json::json!({"id": p.create(&req).await?, "name": req.name})
        }
        CallOp::Get { id } => instance(&p.get(&id).await?),
        CallOp::Delete { id } => {
            p.delete(&id).await?;
            serde_json::json!({"deleted": id})
        }
        CallOp::List { installation } => serde_json::Value::Array(
            p.list_by_tag(&installation)
                .await?
                .iter()
                .map(instance)
                .collect(),
        ),
        CallOp::Check => match p.check().await {
            None => serde_json::json!({"supported": false}),
            Some(targets) => serde_json::json!({
                "supported": true,
                "targets": targets.iter().map(|t| serde_json::json!({
                    "target": t.target, "ready": t.ready, "reason": t.reason, "message": t.message,
                })).collect::<Vec<_>>(),
            }),
        },
    })
}
