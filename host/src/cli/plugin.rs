//! `proxy-operator plugin`: review a plugin before installing it (`inspect`), and put it in
//! a registry signed (`push`, `keygen`, `sign`) without oras or cosign.

use super::args::RuntimeArgs;
use anyhow::Context;
use egress_plugin_host::config::oci_ref::OciRef;
use egress_plugin_host::config::verify::{Approved, PublicKey};
use egress_plugin_host::config::{ProviderEntry, ProvidersFile};
use egress_plugin_host::plugin::Runtime;
use proxy_operator::oci;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Load a plugin and print what it declares and asks for, for review before installing:
    /// world version, type, version, the default hosts it wants (each marked usable or not:
    /// a plugin may only name public DNS hosts), the interfaces it imports, behaviour
    /// profile, size and digest. PLUGIN is a file or an `oci://` reference (pulled, and
    /// its signature checked when the entry given by --providers/--provider asks for one).
    /// With --provider, also what it asks for beyond that entry's `approved`.
    Inspect {
        plugin: String,
        /// Print only the `approved` block that covers this plugin, to paste into its
        /// providers-file entry.
        #[arg(long)]
        approve: bool,
        /// A providers file, and the entry in it to review the plugin against.
        #[arg(long, requires = "provider")]
        providers: Option<PathBuf>,
        #[arg(long, requires = "providers")]
        provider: Option<String>,
        #[command(flatten)]
        registry: RegistryClientArgs,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
    /// Push a plugin file to a registry as a CNCF Wasm OCI artifact; prints the reference
    /// pinned to its manifest digest.
    Push {
        file: PathBuf,
        /// `oci://registry/repository:tag`.
        reference: String,
        #[command(flatten)]
        registry: RegistryClientArgs,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
    /// Write a new ECDSA P-256 key pair for `plugin sign`: PREFIX.key (PKCS#8, mode 0600)
    /// and PREFIX.pub (the PEM public key for `verify.publicKeys`).
    Keygen { prefix: PathBuf },
    /// Sign a plugin in its registry as cosign does (the `sha256-<hex>.sig` manifest), so
    /// that entries with `verify.publicKeys` load it. A `:tag` is resolved to its digest
    /// first, and the digest is what is signed.
    Sign {
        reference: String,
        /// The private key: PKCS#8 PEM (`plugin keygen`, or openssl's). cosign's own
        /// encrypted keys: use `cosign sign --key cosign.key`.
        #[arg(long)]
        key: PathBuf,
        #[command(flatten)]
        registry: RegistryClientArgs,
    },
}

/// How to reach a registry from the command line.
#[derive(clap::Args)]
pub struct RegistryClientArgs {
    /// PEM CA bundle to trust for the registry, instead of the system roots.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// A docker config file with credentials for the registry (`auths`).
    #[arg(long, env = "REGISTRY_AUTH_FILE")]
    pub registry_auth_file: Option<PathBuf>,
}

impl RegistryClientArgs {
    fn client(&self, registry: &str) -> anyhow::Result<oci::client::Client> {
        let tls = egress_plugin_host::plugin::tls_config(self.ca_file.as_deref(), false)
            .map_err(|e| anyhow::anyhow!("--ca-file: {e}"))?;
        let credentials = match &self.registry_auth_file {
            None => None,
            Some(path) => {
                let bytes = std::fs::read(path)
                    .with_context(|| format!("--registry-auth-file {}", path.display()))?;
                oci::auth::credentials_for(&bytes, registry)
                    .map_err(|e| anyhow::anyhow!("--registry-auth-file {}: {e}", path.display()))?
            }
        };
        Ok(oci::client::Client::new(registry, tls, credentials)?)
    }
}

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Inspect {
            plugin,
            approve,
            providers,
            provider,
            registry,
            runtime,
        } => inspect(plugin, approve, providers, provider, registry, runtime).await,
        Command::Push {
            file,
            reference,
            registry,
            runtime,
        } => {
            let reference = parse_reference(&reference)?;
            let wasm =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let rt = Runtime::new(runtime.options(&ProvidersFile::default()))?;
            // Only a plugin this operator loads is pushed, and its imports go in the config.
            let loaded = rt.load_plugin(&file).await?;
            let annotations = BTreeMap::from([
                (
                    "org.opencontainers.image.title".to_string(),
                    loaded.info.type_name.clone(),
                ),
                (
                    "org.opencontainers.image.version".to_string(),
                    loaded.info.version.clone(),
                ),
            ]);
            let client = registry.client(&reference.registry)?;
            let digest =
                oci::push_plugin(&client, &reference, &wasm, &loaded.imports(), annotations)
                    .await
                    .with_context(|| format!("pushing {} to {reference}", file.display()))?;
            println!("{}", reference.pinned(&digest));
            Ok(())
        }
        Command::Keygen { prefix } => {
            let (private, public) = oci::SigningKey::generate();
            let key = prefix.with_extension("key");
            let public_path = prefix.with_extension("pub");
            write_private(&key, private.as_bytes())?;
            std::fs::write(&public_path, public.to_pem())
                .with_context(|| format!("writing {}", public_path.display()))?;
            println!(
                "wrote {} (keep it secret) and {} (key {})",
                key.display(),
                public_path.display(),
                public.fingerprint()
            );
            Ok(())
        }
        Command::Sign {
            reference,
            key,
            registry,
        } => {
            let reference = parse_reference(&reference)?;
            let pem = std::fs::read(&key).with_context(|| format!("--key {}", key.display()))?;
            let signing = oci::SigningKey::from_pem(&pem)
                .map_err(|e| anyhow::anyhow!("--key {}: {e}", key.display()))?;
            let client = registry.client(&reference.registry)?;
            let digest = match &reference.digest {
                Some(d) => d.clone(),
                None => {
                    let tag = reference.tag.as_deref().unwrap_or_default();
                    client
                        .manifest(&reference.repository, tag)
                        .await?
                        .with_context(|| format!("{reference}: the registry has no such tag"))?
                        .1
                }
            };
            oci::sign(&client, &reference, &digest, &signing)
                .await
                .with_context(|| format!("signing {reference}"))?;
            println!(
                "signed {} with key {}",
                reference.pinned(&digest),
                signing.public().fingerprint()
            );
            Ok(())
        }
    }
}

fn parse_reference(s: &str) -> anyhow::Result<OciRef> {
    OciRef::parse(s).map_err(|e| anyhow::anyhow!("reference {s:?}: {e}"))
}

/// Writes a private key readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (an existing key is never overwritten)",
                path.display()
            )
        })?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// The entry `name` of the providers file at `path`, and the keys it asks for.
fn entry_of(path: &Path, name: &str) -> anyhow::Result<(ProviderEntry, Option<Vec<PublicKey>>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading providers file {}", path.display()))?;
    let file = ProvidersFile::parse(&text)?;
    let entry = file
        .providers
        .iter()
        .find(|p| p.name == name)
        .with_context(|| format!("--provider {name:?} is not in {}", path.display()))?
        .clone();
    let keys = file.verify_for(&entry).map(|v| v.keys()).transpose()?;
    Ok((entry, keys))
}

async fn inspect(
    plugin: String,
    approve: bool,
    providers: Option<PathBuf>,
    provider: Option<String>,
    registry: RegistryClientArgs,
    runtime: RuntimeArgs,
) -> anyhow::Result<()> {
    let (entry, keys) = match (&providers, &provider) {
        (Some(p), Some(n)) => {
            let (e, k) = entry_of(p, n)?;
            (Some(e), k)
        }
        _ => (None, None),
    };
    let rt = Runtime::new(runtime.options(&ProvidersFile::default()))?;
    // A reference is pulled into a store of its own, gone when the command ends.
    let scratch = tempfile::tempdir()?;
    let (path, pulled) = if OciRef::is_oci(&plugin) {
        let reference = parse_reference(&plugin)?;
        let store = oci::store::Store::open(scratch.path())?;
        let ca = registry
            .ca_file
            .clone()
            .or_else(|| entry.as_ref().and_then(|e| e.tls.ca_file.clone()));
        let tls = egress_plugin_host::plugin::tls_config(ca.as_deref(), false)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let pulled = store
            .fetch(
                &reference,
                &oci::store::PullOptions {
                    tls,
                    auth_file: registry.registry_auth_file.as_deref(),
                    max_plugin_bytes: rt.max_plugin_bytes(),
                    keys: keys.as_deref(),
                },
            )
            .await?;
        (pulled.path.clone(), Some(pulled))
    } else {
        (PathBuf::from(&plugin), None)
    };
    let p = rt.load_plugin(&path).await?;
    let imports = p.imports();
    if approve {
        let approved = Approved::covering(&p.info.default_hosts, &imports);
        let yaml = serde_yaml::to_string(&serde_json::json!({"approved": {
            "hosts": approved.hosts, "imports": approved.imports,
        }}))?;
        print!("{yaml}");
        return Ok(());
    }
    let hosts: Vec<serde_json::Value> = p
        .default_host_review()
        .into_iter()
        .map(|(host, problem)| {
            serde_json::json!({
                "host": host,
                "usable": problem.is_none(),
                "problem": problem,
            })
        })
        .collect();
    let review = entry.as_ref().map(|e| match &e.approved {
        None => serde_json::json!({"provider": e.name, "approved": null,
            "note": "the entry has no approved block: any hosts and imports load"}),
        Some(a) => {
            let excess = a.excess(&p.info.default_hosts, &imports);
            serde_json::json!({
                "provider": e.name,
                "loads": excess.is_empty(),
                "hostsNotApproved": excess.hosts,
                "importsNotApproved": excess.imports,
            })
        }
    });
    let out = serde_json::json!({
        "file": if pulled.is_some() { serde_json::Value::Null } else { serde_json::json!(p.path) },
        "reference": pulled.as_ref().map(|x| x.reference.to_string()),
        "signedBy": pulled.as_ref().and_then(|x| x.signed_by.clone()),
        "sha256": p.sha256,
        "sizeBytes": p.size,
        "world": format!("egress:provider@{}", p.version()),
        "type": p.info.type_name,
        "version": p.info.version,
        "hasCheck": p.info.has_check,
        // What a provider entry without `budget` gets (0.2.0), after the host's cap.
        "defaultBudget": p.info.default_budget.map(|b| {
            let capped = egress_plugin_host::rate::cap_default(b);
            serde_json::json!({
                "requestsPerHour": capped.per_hour,
                "burst": capped.burst,
                "declared": {"requestsPerHour": b.per_hour, "burst": b.burst},
            })
        }),
        // Whether its lists of recent instances confirm rollouts (0.3.0; false before).
        "listsRecent": p.info.lists_recent,
        "defaultHosts": hosts,
        "imports": imports,
        "profile": p.info.profile.iter().cloned().collect::<BTreeMap<_, _>>(),
        "review": review,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
