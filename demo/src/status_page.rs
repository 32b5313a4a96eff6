//! The status page as a browser shows it: once every sample Proxy is Ready, headless
//! Chromium renders `/status` (with the demo token in the URL fragment, where the page's
//! script picks it up), the DOM must show each sample Proxy with its Ready badge, and the
//! screenshot must show the badges' colour. The PNG stays in the demo directory.

use crate::stack::Stack;
use anyhow::{Context, Result, bail, ensure};
use proxy_operator::discovery::status_page::READY_RGB;
use proxy_operator::testing::browser::{self, Options};
use std::path::{Path, PathBuf};

/// Renders the page and checks it; `Ok(None)` when no Chromium is installed outside CI.
pub async fn capture(stack: &Stack, names: &[String], out: &Path) -> Result<Option<PathBuf>> {
    if browser::find().is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            bail!(
                "Chromium is not installed (Debian package `chromium`), so the status page screenshot cannot be taken; `cargo xtask test` installs it"
            );
        }
        println!(
            "  !!! Chromium is not installed: no status page screenshot (apt-get install chromium)"
        );
        return Ok(None);
    }
    let url = format!("http://{}/status#token={}", stack.discovery, stack.token);
    let opts = Options::default();
    let dom = {
        let (url, out, opts) = (url.clone(), out.to_path_buf(), opts.clone());
        tokio::task::spawn_blocking(move || -> Result<String> {
            let dom = browser::dump_dom(&url, &opts).context("rendering the status page")?;
            browser::screenshot(&url, &out, &opts).context("screenshot of the status page")?;
            Ok(dom)
        })
        .await
        .context("the browser task")??
    };
    for name in names {
        let row = proxy_row(&dom, name)
            .with_context(|| format!("the status page does not list {name}"))?;
        ensure!(
            row.contains(r#"<span class="badge ok">Ready</span>"#),
            "the status page does not show {name} as Ready: {row}"
        );
    }
    let stats = browser::colour_stats(out, READY_RGB).map_err(anyhow::Error::msg)?;
    ensure!(
        stats.distinct > 10,
        "the status page screenshot {} is (nearly) blank",
        out.display()
    );
    ensure!(
        stats.matching > 100 * names.len(),
        "the status page screenshot {} shows the Ready badge colour on only {} pixels",
        out.display(),
        stats.matching
    );
    Ok(Some(out.to_path_buf()))
}

/// The `<tr>` of the Proxy `namespace/name`.
fn proxy_row<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let start = dom.find(&format!(r#"<tr class="proxy" data-name="{name}""#))?;
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    Some(&dom[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_row_of_a_proxy() {
        let dom = r#"<table><tr class="proxy" data-name="demo/a"><td>demo/a</td><td><span class="badge ok">Ready</span></td></tr><tr class="proxy" data-name="demo/b"><td>x</td></tr></table>"#;
        assert!(proxy_row(dom, "demo/a").unwrap().contains("badge ok"));
        assert!(!proxy_row(dom, "demo/b").unwrap().contains("badge ok"));
        assert!(proxy_row(dom, "demo/c").is_none());
    }
}
