//! Loading the one provider entry the single-provider commands (conformance, provider call,
//! provider lifecycle) work with.

use super::args::RuntimeArgs;
use anyhow::Context;
use egress_plugin_host::config::ProvidersFile;
use egress_plugin_host::plugin::{Runtime, WasmProvider};
use std::path::Path;

/// Loads the one provider `name` of a providers file, or says why it did not load.
/// `default_budgets` off turns off the plugins' declared default request budgets (against an
/// emulator, far faster than a real backend allows).
pub async fn provider(
    file_path: &Path,
    name: &str,
    plugin_dir: &Path,
    runtime: &RuntimeArgs,
    default_budgets: bool,
) -> anyhow::Result<WasmProvider> {
    let text = std::fs::read_to_string(file_path)
        .with_context(|| format!("reading providers file {}", file_path.display()))?;
    let mut file = ProvidersFile::parse(&text)?;
    let names: Vec<String> = file.providers.iter().map(|p| p.name.clone()).collect();
    file.providers.retain(|p| p.name == name);
    anyhow::ensure!(
        !file.providers.is_empty(),
        "--provider {name:?} is not in {} (it has: {})",
        file_path.display(),
        names.join(", ")
    );
    let mut opts = runtime.options(&file);
    opts.default_budgets = default_budgets;
    let rt = Runtime::new(opts)?;
    let entry = &file.providers[0];
    anyhow::ensure!(
        !egress_plugin_host::config::oci_ref::OciRef::is_oci(&entry.plugin),
        "provider {name:?}: plugin {}: this command loads plugin files (--plugin-dir) only; \
         pull it with the operator, or review it with `proxy-operator plugin inspect`",
        entry.plugin
    );
    // Only the plugin this entry names: the others in the directory are not under test.
    let plugin = rt.load_plugin(&plugin_dir.join(&entry.plugin)).await?;
    Ok(rt.provider(plugin, entry).await?)
}
