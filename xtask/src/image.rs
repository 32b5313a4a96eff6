//! `cargo xtask image`: the operator's container image, assembled from what is built here.
//!
//! No base image is pulled (none can be, on these machines; and a base image is code nobody
//! here reviewed). The image is `FROM scratch` plus one layer:
//!
//! - `/usr/local/bin/proxy-operator`, the release binary;
//! - the shared libraries it links, exactly those `ldd` names (glibc, libgcc_s, the dynamic
//!   loader), at the paths the binary looks for them;
//! - `/etc/ssl/certs/ca-certificates.crt`, the machine's CA roots (what `rustls-native-certs`
//!   reads for the plugins' TLS when a provider does not name its own trust);
//! - `/etc/passwd` and `/etc/group` with `nonroot` (65532), the user the Deployment runs as;
//! - an empty `/tmp` (mode 1777) to mount the Deployment's `emptyDir` on.
//!
//! No shell, no package manager. Why glibc and not a static musl build: the binary is the
//! one every test here ran (same allocator, same code generation), musl's allocator is
//! known to be slow under wasmtime's allocation pattern, and the musl target is one more
//! toolchain for CI to install; the libraries cost about 3 MiB. The `Dockerfile` builds
//! the same layout for people with Docker, by running this command's staging step
//! (`--rootfs-only`) in its build stage.
//!
//! The build is `podman build` (Debian's podman; `.ci/run` installs it through
//! `cargo xtask test`) with `--timestamp 0`, so the same binary and files give the same
//! image ID. OCI labels name the source, revision and version.

use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Args)]
pub struct Args {
    /// The image's name.
    #[arg(long, default_value = DEFAULT_TAG)]
    pub tag: String,
    /// Only stage the image's files into this directory (what the Dockerfile runs), from
    /// the binary already built at `--binary`.
    #[arg(long)]
    pub rootfs_only: Option<PathBuf>,
    /// The operator binary to put in the image; default: build it (release).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Also push the image to REPOSITORY (`registry[:port]/path/proxy-operator`) and write
    /// `config/release/image.yaml`, the release overlay's patch naming it by digest.
    #[arg(long, value_name = "REPOSITORY")]
    pub push: Option<String>,
    /// A directory of `*.crt` CA files to trust for the registry (podman's `--cert-dir`).
    #[arg(long, requires = "push")]
    pub cert_dir: Option<PathBuf>,
    /// Where `--push` writes the release overlay's image patch.
    #[arg(long, requires = "push", default_value = RELEASE_IMAGE_PATCH)]
    pub release_patch: PathBuf,
}

pub const DEFAULT_TAG: &str = "localhost/proxy-operator:dev";

/// What `cargo xtask test` builds: the default tag (clap's defaults apply only to parsed
/// arguments, so a derived `Default` would leave the tag empty).
impl Default for Args {
    fn default() -> Self {
        Args {
            tag: DEFAULT_TAG.into(),
            rootfs_only: None,
            binary: None,
            push: None,
            cert_dir: None,
            release_patch: RELEASE_IMAGE_PATCH.into(),
        }
    }
}
const BIN_PATH: &str = "usr/local/bin/proxy-operator";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\n\
                      nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnonroot:x:65532:\n";

/// What `cargo xtask image` made.
pub struct Built {
    pub tag: String,
    /// `sha256:...` of the image's config: the same files give the same ID.
    pub id: String,
    pub bytes: u64,
}

pub fn run(args: &Args) -> Result<()> {
    let ws = crate::workspace()?;
    if let Some(dir) = &args.rootfs_only {
        let binary = args
            .binary
            .clone()
            .context("--rootfs-only needs --binary (the operator to stage)")?;
        return stage(&binary, dir);
    }
    let built = build(&ws, args)?;
    println!(
        "image {} ({}), {:.1} MiB",
        built.tag,
        built.id,
        built.bytes as f64 / (1 << 20) as f64
    );
    if let Some(repository) = &args.push {
        let reference = push(&built.tag, repository, args.cert_dir.as_deref())?;
        let patch = ws.root.join(&args.release_patch);
        std::fs::write(&patch, image_patch(&reference))
            .with_context(|| format!("writing {}", patch.display()))?;
        println!("pushed {reference}; wrote {}", patch.display());
    }
    Ok(())
}

/// Where the release overlay reads the image it deploys.
pub const RELEASE_IMAGE_PATCH: &str = "config/release/image.yaml";

/// Pushes `tag` to `repository`; the reference by digest.
fn push(tag: &str, repository: &str, cert_dir: Option<&Path>) -> Result<String> {
    let digest_file = tempfile_path("image-digest");
    let mut cmd = Command::new("podman");
    cmd.args(["push", "--quiet"]);
    if let Some(dir) = cert_dir {
        cmd.arg("--cert-dir").arg(dir);
    }
    let status = cmd
        .arg("--digestfile")
        .arg(&digest_file)
        .arg(tag)
        .arg(format!(
            "docker://{repository}:{}",
            tag.rsplit(':').next().unwrap_or("dev")
        ))
        .status()
        .context("running podman push")?;
    ensure!(status.success(), "podman push failed ({status})");
    let digest = std::fs::read_to_string(&digest_file)?.trim().to_string();
    let _ = std::fs::remove_file(&digest_file);
    ensure!(
        digest.starts_with("sha256:"),
        "podman wrote no digest ({digest:?})"
    );
    Ok(format!("{repository}@{digest}"))
}

fn tempfile_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("egress-{what}-{}", std::process::id()))
}

/// The release overlay's patch: the manager container's image, by digest.
pub fn image_patch(reference: &str) -> String {
    format!(
        "# Generated by `cargo xtask image --push`: the image config/release deploys, by digest.\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: proxy-operator\n\
         spec:\n  template:\n    spec:\n      containers:\n      - name: manager\n        image: {reference}\n"
    )
}

/// Builds the release binary (unless given one), stages the files and builds the image.
pub fn build(ws: &crate::Workspace, args: &Args) -> Result<Built> {
    ensure!(!args.tag.trim().is_empty(), "the image needs a tag (--tag)");
    let binary = match &args.binary {
        Some(b) => b.clone(),
        None => {
            println!("building the operator (release)");
            let status = crate::cargo()
                .current_dir(&ws.root)
                .args([
                    "build",
                    "--release",
                    "--locked",
                    "-p",
                    "proxy-operator",
                    "--bin",
                    "proxy-operator",
                ])
                .status()
                .context("running cargo build --release")?;
            ensure!(status.success(), "cargo build --release failed ({status})");
            ws.target_dir.join("release/proxy-operator")
        }
    };
    let context = ws.target_dir.join("image");
    let rootfs = context.join("rootfs");
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)
            .with_context(|| format!("removing {}", rootfs.display()))?;
    }
    stage(&binary, &rootfs)?;
    let labels = labels(&ws.root)?;
    std::fs::write(context.join("Containerfile"), containerfile(&labels))?;
    let iidfile = context.join("image-id");
    let _ = std::fs::remove_file(&iidfile);
    let status = Command::new("podman")
        .args(["build", "--quiet", "--timestamp", "0", "--tag", &args.tag])
        .arg("--iidfile")
        .arg(&iidfile)
        .arg("--file")
        .arg(context.join("Containerfile"))
        .arg(&context)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running podman build (apt-get install podman)")?;
    ensure!(status.success(), "podman build failed ({status})");
    // The ID podman wrote, not a lookup by tag: the image this build made.
    let id = std::fs::read_to_string(&iidfile)
        .with_context(|| format!("reading {}", iidfile.display()))?;
    let id = id.trim().trim_start_matches("sha256:").to_string();
    let inspect = Command::new("podman")
        .args(["image", "inspect", "--format", "{{.Size}}", &id])
        .output()
        .context("running podman image inspect")?;
    ensure!(
        inspect.status.success(),
        "podman image inspect {id} failed: {}",
        String::from_utf8_lossy(&inspect.stderr).trim()
    );
    let size = String::from_utf8_lossy(&inspect.stdout).trim().to_string();
    Ok(Built {
        tag: args.tag.clone(),
        id: format!("sha256:{id}"),
        bytes: size.parse().context("image size")?,
    })
}

/// The OCI labels: which commit, which version, and where the source is when the checkout
/// knows (its `origin` remote).
fn labels(root: &Path) -> Result<Vec<(String, String)>> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let version = manifest
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix("version")?.trim().strip_prefix('=')?.trim();
            Some(v.trim_matches('"').to_string())
        })
        .context("no version in Cargo.toml")?;
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let mut labels = vec![
        (
            "org.opencontainers.image.title".to_string(),
            "proxy-operator".to_string(),
        ),
        ("org.opencontainers.image.version".into(), version),
        (
            "org.opencontainers.image.revision".into(),
            git(&["rev-parse", "HEAD"]).context("git rev-parse HEAD")?,
        ),
    ];
    if let Some(url) = git(&["remote", "get-url", "origin"]) {
        labels.push(("org.opencontainers.image.source".into(), url));
    }
    Ok(labels)
}

/// The Containerfile over a staged root filesystem. Pure.
fn containerfile(labels: &[(String, String)]) -> String {
    let mut out = String::from("FROM scratch\nCOPY rootfs/ /\n");
    for (k, v) in labels {
        out.push_str(&format!(
            "LABEL {k}={}\n",
            serde_json::Value::from(v.as_str())
        ));
    }
    out.push_str(
        "USER 65532:65532\nEXPOSE 8080\n\
         ENTRYPOINT [\"/usr/local/bin/proxy-operator\"]\nCMD [\"run\"]\n",
    );
    out
}

/// Puts the image's files under `dir`: the binary, the libraries it links, the CA roots,
/// passwd and group, an empty `/tmp`.
pub fn stage(binary: &Path, dir: &Path) -> Result<()> {
    ensure!(
        binary.is_file(),
        "no operator binary at {}",
        binary.display()
    );
    let copy = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let dest = dir.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().expect("a file path"))?;
        std::fs::copy(from, &dest)
            .with_context(|| format!("copying {} to {}", from.display(), dest.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    copy(binary, BIN_PATH, 0o755)?;
    let ldd = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd on the operator binary")?;
    ensure!(
        ldd.status.success(),
        "ldd {} failed: {}",
        binary.display(),
        String::from_utf8_lossy(&ldd.stderr)
    );
    for path in linked_libraries(&String::from_utf8_lossy(&ldd.stdout))? {
        // The path the loader asks for, with the content of the file it resolves to.
        let real = std::fs::canonicalize(&path)?;
        copy(&real, &path, 0o755)?;
    }
    copy(Path::new(CA_BUNDLE), CA_BUNDLE, 0o644)
        .context("the CA roots (apt-get install ca-certificates)")?;
    std::fs::write(dir.join("etc/passwd"), PASSWD)?;
    std::fs::write(dir.join("etc/group"), GROUP)?;
    // Sticky and open to all, as /tmp is everywhere: podman copies the image's mode onto
    // a tmpfs mounted there, and a 0755 /tmp left the nonroot user no cache directory.
    std::fs::create_dir_all(dir.join("tmp"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// The absolute paths of the libraries in `ldd`'s output, the loader included. Refuses a
/// library `ldd` could not find: the image would not start. Pure.
fn linked_libraries(ldd: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for line in ldd.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("=> not found") {
            bail!("ldd: {line}");
        }
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, or the loader as
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`; `linux-vdso.so.1 (0x...)` is the kernel's.
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            out.push(p.to_string());
        }
    }
    ensure!(!out.is_empty(), "ldd named no library: {ldd:?}");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libraries_are_those_ldd_names_with_the_loader() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd6d5f0000)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0c)\n\
                   \tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f0b)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0a)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f0d)\n";
        assert_eq!(
            linked_libraries(ldd).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libm.so.6",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2",
            ]
        );
        let missing = "\tlibssl.so.3 => not found\n";
        let e = linked_libraries(missing).unwrap_err().to_string();
        assert!(e.contains("libssl.so.3 => not found"), "{e}");
        assert!(linked_libraries("\tstatically linked\n").is_err());
    }

    #[test]
    fn what_the_test_suite_builds_is_tagged() {
        assert_eq!(Args::default().tag, DEFAULT_TAG);
    }

    #[test]
    fn the_containerfile_is_scratch_one_layer_nonroot_and_labelled() {
        let f = containerfile(&[("org.opencontainers.image.revision".into(), "abc\"d".into())]);
        assert!(f.starts_with("FROM scratch\nCOPY rootfs/ /\n"), "{f}");
        assert_eq!(
            f.matches("COPY").count() + f.matches("RUN").count(),
            1,
            "{f}"
        );
        assert!(
            f.contains("LABEL org.opencontainers.image.revision=\"abc\\\"d\""),
            "{f}"
        );
        assert!(f.contains("USER 65532:65532"), "{f}");
        assert!(
            f.contains("ENTRYPOINT [\"/usr/local/bin/proxy-operator\"]"),
            "{f}"
        );
    }

    /// The staged files are the binary, the libraries, the roots and the user, nothing
    /// else; the binary is this machine's `true` (any dynamically linked program will do).
    #[test]
    fn staging_copies_exactly_the_image_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        stage(Path::new("/bin/true"), &root).unwrap();
        let mut files = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files.push(p.strip_prefix(&root).unwrap().display().to_string());
                }
            }
        }
        files.sort();
        assert!(files.contains(&BIN_PATH.to_string()), "{files:?}");
        assert!(files.contains(&"etc/passwd".to_string()), "{files:?}");
        assert!(files.contains(&CA_BUNDLE[1..].to_string()), "{files:?}");
        assert!(files.iter().any(|f| f.ends_with("libc.so.6")), "{files:?}");
        assert!(files.iter().any(|f| f.contains("ld-linux")), "{files:?}");
        let other: Vec<_> = files
            .iter()
            .filter(|f| {
                !(f.as_str() == BIN_PATH
                    || f.starts_with("etc/")
                    || f.starts_with("lib")
                    || f.starts_with("usr/lib"))
            })
            .collect();
        assert!(other.is_empty(), "unexpected files: {other:?}");
        use std::os::unix::fs::PermissionsExt;
        let tmp = std::fs::metadata(root.join("tmp")).unwrap();
        assert!(tmp.is_dir());
        assert_eq!(
            tmp.permissions().mode() & 0o7777,
            0o1777,
            "a /tmp anyone can use"
        );
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    }
}
