//! Headless Chromium for tests and demos: the DOM of a page after its scripts ran, and a
//! screenshot of it. Uses the Debian `chromium` package (`cargo xtask test` installs it).
//!
//! Each call starts a fresh browser with its own temporary profile and a deadline, so
//! calls are independent and a hung browser cannot hang the caller.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one browser run may take before it is killed.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Why a browser run failed.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error("no Chromium found (looked for {0}); install the Debian package `chromium`")]
    NotInstalled(String),
    #[error("running {binary}: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    #[error("{binary} did not finish within {DEADLINE:?} and was killed")]
    Timeout { binary: String },
    #[error("{binary} exited with {status}: {stderr}")]
    Failed {
        binary: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{binary} exited without writing the screenshot {path}")]
    NoScreenshot { binary: String, path: PathBuf },
}

const CANDIDATES: &[&str] = &["chromium", "chromium-browser", "google-chrome"];

/// The first Chromium on PATH (`CHROMIUM` overrides).
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let paths = std::env::var_os("PATH")?;
    CANDIDATES.iter().find_map(|name| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Options of one run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Viewport width and height in CSS pixels (the screenshot's size at scale 1).
    pub window: (u32, u32),
    /// Virtual time the page gets to run its scripts and fetches before the capture.
    pub virtual_time_ms: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            window: (1280, 800),
            virtual_time_ms: 3000,
        }
    }
}

fn run(url: &str, opts: &Options, extra: &[String]) -> Result<Vec<u8>, BrowserError> {
    let binary = find().ok_or_else(|| NotInstalled(CANDIDATES.join(", ")))?;
    let name = binary.display().to_string();
    let profile = tempfile::Builder::new()
        .prefix("chromium-profile-")
        .tempdir()
        .map_err(|source| BrowserError::Spawn {
            binary: name.clone(),
            source,
        })?;
    let mut cmd = Command::new(&binary);
    cmd.args([
        "--headless",
        // Tests run as root in containers, where the sandbox cannot start.
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-color-profile=srgb",
        "--force-device-scale-factor=1",
        "--disable-background-networking",
        "--disable-extensions",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .arg(format!("--window-size={},{}", opts.window.0, opts.window.1))
    .arg(format!("--virtual-time-budget={}", opts.virtual_time_ms))
    .args(extra)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| BrowserError::Spawn {
        binary: name.clone(),
        source,
    })?;
    // Drain both pipes on threads so a chatty browser cannot block on a full pipe.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < DEADLINE => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BrowserError::Timeout { binary: name });
            }
        }
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    if !status.success() {
        let stderr = String::from_utf8_lossy(&stderr);
        let tail: String = stderr
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        return Err(BrowserError::Failed {
            binary: name,
            status,
            stderr: tail,
        });
    }
    Ok(stdout)
}

use BrowserError::NotInstalled;

/// The page's DOM as HTML after its scripts had `virtual_time_ms` to run.
pub fn dump_dom(url: &str, opts: &Options) -> Result<String, BrowserError> {
    let out = run(url, opts, &["--dump-dom".to_string()])?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Writes a PNG screenshot of the page (the viewport, `opts.window` in size) to `path`.
pub fn screenshot(url: &str, path: &Path, opts: &Options) -> Result<(), BrowserError> {
    let _ = std::fs::remove_file(path);
    run(url, opts, &[format!("--screenshot={}", path.display())])?;
    if !path.is_file() {
        return Err(BrowserError::NoScreenshot {
            binary: find().map(|p| p.display().to_string()).unwrap_or_default(),
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// What a screenshot shows, roughly: enough to tell a rendered page from a blank one and to
/// find a colour (a badge) on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColourStats {
    /// Pixels exactly of the colour asked for.
    pub matching: usize,
    /// Distinct colours, counted up to 1000.
    pub distinct: usize,
    pub size: (u32, u32),
}

/// Decodes the PNG at `path` and counts the pixels of colour `rgb`.
pub fn colour_stats(path: &Path, rgb: [u8; 3]) -> Result<ColourStats, String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| what(&e))?;
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .map_err(|e| what(&e))?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| what(&"image too large"))?;
    let mut buf = vec![0; size];
    let info = reader.next_frame(&mut buf).map_err(|e| what(&e))?;
    let channels = match (info.color_type, info.bit_depth) {
        (png::ColorType::Rgb, png::BitDepth::Eight) => 3,
        (png::ColorType::Rgba, png::BitDepth::Eight) => 4,
        (c, d) => return Err(what(&format!("unexpected PNG format {c:?} {d:?}"))),
    };
    let mut matching = 0;
    let mut distinct = std::collections::HashSet::new();
    for px in buf[..info.buffer_size()].chunks_exact(channels) {
        if px[..3] == rgb {
            matching += 1;
        }
        if distinct.len() < 1000 {
            distinct.insert([px[0], px[1], px[2]]);
        }
    }
    Ok(ColourStats {
        matching,
        distinct: distinct.len(),
        size: (info.width, info.height),
    })
}
