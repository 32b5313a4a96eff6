//! The clouds the demo runs besides Hetzner and EC2 (`--clouds`): for each, its emulator in
//! real-proxy mode, its plugin's entry in the providers file, and one Proxy on it, made from
//! the first sample Proxy. The default story keeps to two clouds so it stays short; this is
//! how a user sees any shipped provider work end to end without an account.

use anyhow::{Context, Result, ensure};
use egress_emulators::azure::{self, AzureConfig, AzureEmulator};
use egress_emulators::control::Emulator;
use egress_emulators::digitalocean::{self, DigitalOceanConfig, DigitalOceanEmulator};
use egress_emulators::gce::{GceConfig, GceEmulator};
use egress_emulators::linode::{LinodeConfig, LinodeEmulator};
use egress_emulators::proxmox::{self, ProxmoxConfig, ProxmoxEmulator};
use egress_emulators::real_proxy::{ProxyKind, RealProxies};
use egress_emulators::scaleway::{self, ScalewayConfig, ScalewayEmulator};
use egress_emulators::vultr::{VultrConfig, VultrEmulator};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;

/// Every cloud `--clouds` accepts besides the two the story always runs.
pub const CLOUDS: [&str; 7] = [
    "digitalocean",
    "vultr",
    "linode",
    "scaleway",
    "gce",
    "proxmox",
    "azure",
];
/// The clouds the story always runs; `--clouds` may name them, to no effect.
const ALWAYS: [&str; 2] = ["hetzner", "ec2"];
/// The token the Vultr and Linode emulators accept (theirs, not a real one).
const TOKEN: &str = "demo-cloud-token";
/// Azure wants an SSH key for a Linux VM; nobody holds the private half of this one.
const DEMO_SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEsaFYgsJ8DSVcIXjOuAOfaZ5RgAwVTVBvTdBGf6XuBd egress-demo";

/// The clouds of `--clouds`, in [`CLOUDS`] order, each once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Clouds(pub Vec<&'static str>);

impl std::ops::Deref for Clouds {
    type Target = [&'static str];
    fn deref(&self) -> &[&'static str] {
        &self.0
    }
}

/// `--clouds`: a comma-separated list of [`CLOUDS`] (and `hetzner`, `ec2`), or `all`.
pub fn parse(list: &str) -> Result<Clouds, String> {
    let mut out = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word == "all" {
            out.extend(CLOUDS);
        } else if let Some(c) = CLOUDS.iter().find(|c| **c == word) {
            out.push(*c);
        } else if !ALWAYS.contains(&word) {
            return Err(format!(
                "--clouds: {word:?} is not a cloud the demo runs; choose from all, {}, {}",
                ALWAYS.join(", "),
                CLOUDS.join(", ")
            ));
        }
    }
    out.sort_by_key(|c| CLOUDS.iter().position(|k| k == c));
    out.dedup();
    Ok(Clouds(out))
}

/// One more cloud: its emulator (stopped when dropped), the proxies behind its instances,
/// and its providers-file entry.
pub struct Cloud {
    pub name: &'static str,
    pub emulator: Box<dyn Emulator>,
    pub proxies: Arc<RealProxies>,
    /// YAML at the indentation of the providers file's list.
    pub entry: String,
}

impl Cloud {
    /// Starts `name`'s emulator and writes its credential under `secrets`.
    pub fn start(name: &'static str, kind: ProxyKind, secrets: &Path) -> Result<Cloud> {
        let proxies = RealProxies::with_own_addresses(kind);
        let real = Some(proxies.clone());
        let secret = |file: &str, value: &str| -> Result<String> {
            let path = secrets.join(file);
            crate::stack::write_private(&path, value)?;
            Ok(path.display().to_string())
        };
        let (emulator, secret_key, secret_path, config): (Box<dyn Emulator>, _, _, _) = match name {
            "digitalocean" => {
                let e = DigitalOceanEmulator::start(DigitalOceanConfig {
                    real_proxies: real,
                    ..DigitalOceanConfig::new(digitalocean::EMULATOR_TOKEN)
                });
                let token = secret("digitalocean-token", digitalocean::EMULATOR_TOKEN)?;
                let config = format!(
                    "{{endpoint: '{}/v2', regions: [ams3], sizes: [s-1vcpu-512mb-10gb], images: [debian-12-x64]}}",
                    e.url()
                );
                (Box::new(e) as Box<dyn Emulator>, "token", token, config)
            }
            "vultr" => {
                let e = VultrEmulator::start(VultrConfig {
                    real_proxies: real,
                    ..VultrConfig::new(TOKEN)
                });
                let token = secret("vultr-token", TOKEN)?;
                let config = format!(
                    "{{endpoint: '{}/v2', regions: [ewr], plans: [vc2-1c-1gb], images: {{debian-12: 2136}}}}",
                    e.url()
                );
                (Box::new(e) as Box<dyn Emulator>, "token", token, config)
            }
            "linode" => {
                let e = LinodeEmulator::start(LinodeConfig {
                    real_proxies: real,
                    ..LinodeConfig::new(TOKEN)
                });
                let token = secret("linode-token", TOKEN)?;
                let config = format!(
                    "{{endpoint: '{}/v4', regions: [us-east], types: [g6-nanode-1], images: [linode/debian12]}}",
                    e.url()
                );
                (Box::new(e) as Box<dyn Emulator>, "token", token, config)
            }
            "scaleway" => {
                let e = ScalewayEmulator::start(ScalewayConfig {
                    real_proxies: real,
                    ..ScalewayConfig::new(scaleway::EMULATOR_SECRET_KEY)
                });
                let key = secret("scaleway-secret-key", scaleway::EMULATOR_SECRET_KEY)?;
                let config = format!(
                    "{{endpoint: '{}', projectId: {}, zones: [fr-par-1], commercialTypes: [DEV1-S], images: [ubuntu_noble]}}",
                    e.url(),
                    scaleway::EMULATOR_PROJECT
                );
                (Box::new(e) as Box<dyn Emulator>, "secretKey", key, config)
            }
            "gce" => {
                let e = GceEmulator::start(GceConfig {
                    real_proxies: real,
                    ..GceConfig::default()
                });
                // The emulator's own throwaway service account; its token endpoint is the emulator.
                let key = secret("gce-service-account.json", &e.test_key_json())?;
                let config = format!(
                    "{{endpoint: '{}/compute/v1', project: {}, zones: [europe-west1-b], machineTypes: [e2-micro], images: {{debian: projects/debian-cloud/global/images/family/debian-12}}}}",
                    e.url(),
                    egress_emulators::gce::EMULATOR_PROJECT
                );
                (
                    Box::new(e) as Box<dyn Emulator>,
                    "serviceAccountKey",
                    key,
                    config,
                )
            }
            "proxmox" => {
                let e = ProxmoxEmulator::start(ProxmoxConfig {
                    real_proxies: real,
                    ..ProxmoxConfig::default()
                });
                // The emulator's own API token; the VMs' addresses are the guest agent's.
                let token = secret("proxmox-token-secret", proxmox::EMULATOR_TOKEN_SECRET)?;
                let config = format!(
                    "{{endpoint: '{}', tokenId: '{}', nodes: [pve1], templates: {{debian-12: 9000}}}}",
                    e.url(),
                    proxmox::EMULATOR_TOKEN_ID
                );
                (
                    Box::new(e) as Box<dyn Emulator>,
                    "tokenSecret",
                    token,
                    config,
                )
            }
            "azure" => {
                let e = AzureEmulator::start(AzureConfig {
                    real_proxies: real,
                    ..AzureConfig::default()
                });
                // The emulator's own service principal; its token endpoint, ARM and prices
                // are all the emulator.
                let secret_path = secret("azure-client-secret", azure::EMULATOR_CLIENT_SECRET)?;
                let subnet = format!(
                    "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/virtualNetworks/egress-vnet/subnets/default",
                    azure::EMULATOR_SUBSCRIPTION,
                    azure::EMULATOR_RESOURCE_GROUP
                );
                let config = format!(
                    "{{tenantId: {}, clientId: {}, subscriptionId: {}, resourceGroup: {}, locations: {{westeurope: '{subnet}'}}, vmSizes: [Standard_B1s], images: {{ubuntu: 'Canonical:ubuntu-24_04-lts:server:latest'}}, sshPublicKey: '{DEMO_SSH_KEY}', authorityHost: '{url}', armEndpoint: '{url}', pricesEndpoint: '{url}'}}",
                    azure::EMULATOR_TENANT,
                    azure::EMULATOR_CLIENT_ID,
                    azure::EMULATOR_SUBSCRIPTION,
                    azure::EMULATOR_RESOURCE_GROUP,
                    url = e.url()
                );
                (
                    Box::new(e) as Box<dyn Emulator>,
                    "clientSecret",
                    secret_path,
                    config,
                )
            }
            other => anyhow::bail!("--clouds: the demo has no emulator for {other:?}"),
        };
        let entry = entry(name, &emulator.url(), secret_key, &secret_path, &config);
        Ok(Cloud {
            name,
            emulator,
            proxies,
            entry,
        })
    }

    /// A Proxy on this cloud, made from `template` (a sample Proxy): named `<cloud>-demo` in
    /// the template's namespace, placed where the emulator offers, listening on `port`, with
    /// the template's cloud-init moved to that port (the emulator runs the proxy on the
    /// `Port` line's port): by the operator's template when it says `Port {{egress.port}}`,
    /// else by rewriting its `Port N` line.
    pub fn proxy(&self, template: &Value, port: u16) -> Result<Value> {
        let old = template["spec"]["port"]
            .as_u64()
            .context("the template Proxy has no spec.port")?;
        let cloud_init = template["spec"]["cloudInit"]["inline"]
            .as_str()
            .context("the template Proxy has no spec.cloudInit.inline")?;
        let templated = cloud_init.contains("Port {{egress.port}}\n");
        let line = format!("Port {old}\n");
        ensure!(
            templated || cloud_init.contains(&line),
            "the template Proxy's cloud-init has no {:?} line to move to port {port}",
            line.trim()
        );
        let placement = match self.name {
            "digitalocean" => ("ams3", "", "s-1vcpu-512mb-10gb", "debian-12-x64"),
            "vultr" => ("ewr", "", "vc2-1c-1gb", "debian-12"),
            "linode" => ("us-east", "", "g6-nanode-1", "linode/debian12"),
            "scaleway" => ("fr-par", "fr-par-1", "DEV1-S", "ubuntu_noble"),
            "proxmox" => ("", "pve1", "", "debian-12"),
            "azure" => ("westeurope", "", "Standard_B1s", "ubuntu"),
            _ => ("europe-west1", "europe-west1-b", "e2-micro", "debian"),
        };
        let mut doc = template.clone();
        doc["metadata"] = json!({
            "name": format!("{}-demo", self.name),
            "namespace": template["metadata"]["namespace"],
        });
        doc["spec"]["provider"] = json!(self.name);
        doc["spec"]["placement"] = json!({
            "region": placement.0, "zone": placement.1,
            "machineType": placement.2, "image": placement.3,
        });
        doc["spec"]["port"] = json!(port);
        if !templated {
            doc["spec"]["cloudInit"]["inline"] =
                json!(cloud_init.replace(&line, &format!("Port {port}\n")));
        }
        Ok(doc)
    }
}

/// The providers-file entry of `name`'s plugin, pointed at its emulator at `url` (allow-listed,
/// with the private addresses its instances run on).
fn entry(name: &str, url: &str, secret_key: &str, secret_path: &str, config: &str) -> String {
    format!(
        "  - name: {name}\n    plugin: {name}.wasm\n    additionalHosts: ['{url}']\n    \
         allowPrivateAddresses: true\n    secrets: {{{secret_key}: '{secret_path}'}}\n    \
         config: {config}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clouds_parse_in_a_fixed_order_and_name_the_bad_word() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("hetzner,ec2").unwrap().is_empty());
        assert_eq!(
            *parse("scaleway, vultr,vultr").unwrap(),
            ["vultr", "scaleway"]
        );
        assert_eq!(*parse("all,linode").unwrap(), CLOUDS);
        assert_eq!(*parse("gce,vultr").unwrap(), ["vultr", "gce"]);
        assert_eq!(*parse("azure,gce").unwrap(), ["gce", "azure"]);
        let err = parse("vultr,oracle").unwrap_err();
        assert!(
            err.contains("\"oracle\"") && err.contains("digitalocean") && err.contains("azure"),
            "{err}"
        );
    }

    #[test]
    fn a_cloud_proxy_moves_the_template_to_its_own_port_and_placement() {
        let template = json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "hetzner-fsn1", "namespace": "demo", "uid": "x"},
            "spec": {"provider": "hetzner", "port": 31281,
                     "placement": {"region": "fsn1", "zone": "fsn1-dc14", "machineType": "cpx11", "image": "ubuntu"},
                     "cloudInit": {"inline": "#cloud-config\nPort 31281\nListen 0.0.0.0\n"}},
        });
        let dir = tempfile::tempdir().unwrap();
        let cloud = Cloud::start("scaleway", ProxyKind::Builtin, dir.path()).unwrap();
        let doc = cloud.proxy(&template, 31295).unwrap();
        assert_eq!(
            doc["metadata"],
            json!({"name": "scaleway-demo", "namespace": "demo"})
        );
        assert_eq!(doc["spec"]["provider"], "scaleway");
        assert_eq!(doc["spec"]["placement"]["zone"], "fr-par-1");
        assert_eq!(doc["spec"]["port"], 31295);
        assert_eq!(
            doc["spec"]["cloudInit"]["inline"],
            "#cloud-config\nPort 31295\nListen 0.0.0.0\n"
        );
        assert!(
            cloud.entry.contains("plugin: scaleway.wasm"),
            "{}",
            cloud.entry
        );
        assert!(
            cloud
                .entry
                .contains(&format!("additionalHosts: ['{}']", cloud.emulator.url()))
        );
        // The credential is a private file, not in the entry.
        assert!(!cloud.entry.contains(scaleway::EMULATOR_SECRET_KEY));
        // The operator's template needs no rewriting: spec.port is what it renders.
        let mut templated = template.clone();
        templated["spec"]["cloudInit"]["inline"] =
            json!("#cloud-config\nPort {{egress.port}}\nBasicAuth {{egress.username}} x\n");
        let doc = cloud.proxy(&templated, 31296).unwrap();
        assert_eq!(doc["spec"]["port"], 31296);
        assert_eq!(
            doc["spec"]["cloudInit"]["inline"],
            templated["spec"]["cloudInit"]["inline"]
        );
        let mut no_port = template.clone();
        no_port["spec"]["cloudInit"]["inline"] = json!("#cloud-config\n");
        let err = cloud.proxy(&no_port, 31295).unwrap_err().to_string();
        assert!(err.contains("Port 31281"), "{err}");
    }

    #[test]
    fn azure_runs_on_its_emulator_with_a_client_secret_file() {
        let dir = tempfile::tempdir().unwrap();
        let cloud = Cloud::start("azure", ProxyKind::Builtin, dir.path()).unwrap();
        let url = cloud.emulator.url();
        assert!(
            cloud.entry.contains("plugin: azure.wasm"),
            "{}",
            cloud.entry
        );
        assert!(cloud.entry.contains("{clientSecret: '"), "{}", cloud.entry);
        for endpoint in ["authorityHost", "armEndpoint", "pricesEndpoint"] {
            assert!(
                cloud.entry.contains(&format!("{endpoint}: '{url}'")),
                "{}",
                cloud.entry
            );
        }
        // The credential is a private file, not in the entry.
        assert!(!cloud.entry.contains(azure::EMULATOR_CLIENT_SECRET));
        let secret = std::fs::read_to_string(dir.path().join("azure-client-secret")).unwrap();
        assert_eq!(secret.trim(), azure::EMULATOR_CLIENT_SECRET);
    }
}
