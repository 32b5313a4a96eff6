//! `proxy-operator crds`: the CustomResourceDefinitions generated from the Rust types.

use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Write `<group>_<plural>.yaml` files here instead of printing to stdout.
    #[arg(long)]
    output_dir: Option<PathBuf>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.output_dir {
        None => print!("{}", proxy_operator::api::all_crds_yaml()?),
        Some(dir) => {
            for (file, crd) in proxy_operator::api::crds() {
                let path = dir.join(file);
                std::fs::write(&path, proxy_operator::api::crd_yaml(&crd)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
