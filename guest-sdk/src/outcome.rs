//! Outcome logging: one line per operation result (`logging=outcome-only` in the
//! behaviour profile), written by [`export_provider!`](crate::export_provider) for every
//! `create`, `get`, `delete`, `list-by-tag` and `quote` the host calls: a plugin never logs
//! its own outcomes. A plugin that has better words for what happened than the default
//! (`adopted r1/i-1` rather than `id r1/i-1`) returns them with its value and hands the
//! result to [`keep`] (or runs its body in [`run`]).
//!
//! The line names the plugin, the operation, its subject (an instance name, an ID, an
//! installation; never the request, so cloud-init cannot ride along) and either what
//! happened or the error's class, code and message. Secrets this call read through
//! [`crate::secret`] are cut out of the line before it leaves the plugin. The host scrubs
//! them as well, but a plugin that never emits them is the contract, and the host's
//! `[REDACTED]` in a log means a plugin bug.

#[cfg(test)]
use crate::secrets_seen::remember_secret;
use crate::secrets_seen::scrub;
use crate::{ErrorClass, Instance, Level, ProviderError, State};
use std::cell::RefCell;

thread_local! {
    /// The plugin's own words for this call's outcome, set by [`keep`], read once by the
    /// outcome line.
    static NOTE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Hands on the value of a result that carries the plugin's own words for the outcome
/// line (an [`Outcome`] such as `(id, "adopted r1/1")`), keeping the words for the line.
pub fn keep<R: Outcome>(result: Result<R, ProviderError>) -> Result<R::Value, ProviderError> {
    result.map(|r| {
        let (v, what) = r.split();
        NOTE.with_borrow_mut(|n| *n = Some(what));
        v
    })
}

/// Runs an operation's body, so it can use `?`, and [`keep`]s its result.
pub fn run<R: Outcome>(
    f: impl FnOnce() -> Result<R, ProviderError>,
) -> Result<R::Value, ProviderError> {
    keep(f())
}

/// What a successful operation returns, and the words its outcome line uses for it.
pub trait Outcome {
    type Value;
    fn split(self) -> (Self::Value, String);
}

/// An instance ID (`create`).
impl Outcome for String {
    type Value = String;
    fn split(self) -> (String, String) {
        let what = format!("id {self}");
        (self, what)
    }
}

/// `get`: the state and IP the operator will see.
impl Outcome for Instance {
    type Value = Instance;
    fn split(self) -> (Instance, String) {
        let state = match self.state {
            State::Provisioning => "provisioning",
            State::Running => "running",
            State::Stopped => "stopped",
            State::Terminated => "terminated",
        };
        let ip = if self.ip.is_empty() {
            "no IP"
        } else {
            self.ip.as_str()
        };
        let what = format!("{state}, {ip}");
        (self, what)
    }
}

/// `list-by-tag`: how many.
impl Outcome for Vec<Instance> {
    type Value = Vec<Instance>;
    fn split(self) -> (Vec<Instance>, String) {
        let what = format!("{} instances", self.len());
        (self, what)
    }
}

/// `quote`: the price, or that there is none.
#[cfg(not(feature = "contract-v0-1"))]
impl Outcome for Option<crate::Price> {
    type Value = Option<crate::Price>;
    fn split(self) -> (Option<crate::Price>, String) {
        let what = match &self {
            Some(p) => format!("{} {} micros an hour", p.currency, p.micros_per_hour),
            None => "no price".to_string(),
        };
        (self, what)
    }
}

/// `delete`.
impl Outcome for () {
    type Value = ();
    fn split(self) -> ((), String) {
        ((), "done".to_string())
    }
}

/// Any value with the plugin's own words (`adopted`, `already gone`).
impl<T> Outcome for (T, String) {
    type Value = T;
    fn split(self) -> (T, String) {
        self
    }
}

/// A plugin's outcome logger: a `const` per plugin.
#[derive(Clone, Copy, Debug)]
pub struct Outcomes {
    /// Starts every line (`hetzner create proxy-x: ...`), so lines of several plugins in
    /// one operator log can be told apart.
    pub plugin: &'static str,
    /// The level of `create` and `delete` lines: changes a user asked for, a few per
    /// Proxy. `Info` puts them in the operator's default log (inside the operation's
    /// span), `Debug` keeps them out.
    pub changes: Level,
    /// The level of every other operation's line (`get`, `list`): reads repeat at every
    /// poll, so `Debug` unless the plugin has reason to be loud.
    pub reads: Level,
}

impl Outcomes {
    /// A logger for the plugin `plugin`: creates and deletes at info, reads at debug.
    pub const fn new(plugin: &'static str) -> Self {
        Outcomes {
            plugin,
            changes: Level::Info,
            reads: Level::Debug,
        }
    }

    /// Log the result of `op` on `subject` and hand it on: what
    /// [`export_provider!`](crate::export_provider) does with every call's result. On
    /// success the line says what happened (the words [`keep`] kept, else the
    /// [`Outcome`]'s: `id r1/i-1`, `running, 192.0.2.1`); a failure logs
    /// `class (code): message`, the class as the WIT names it (`quota-exceeded`).
    #[doc(hidden)]
    pub fn log<R: Outcome>(
        &self,
        op: &str,
        subject: &str,
        result: Result<R, ProviderError>,
    ) -> Result<R::Value, ProviderError> {
        let (mut line, out) = self.line(op, subject, result);
        if let (Ok(_), Some(what)) = (&out, NOTE.with_borrow_mut(Option::take)) {
            line = scrub(format!("{} {op} {subject}: {what}", self.plugin));
        }
        crate::host::log(self.level(op), &line);
        out
    }

    fn level(&self, op: &str) -> Level {
        match op {
            "create" | "delete" => self.changes,
            _ => self.reads,
        }
    }

    /// The line [`log`](Self::log) writes, and the result it returns.
    fn line<R: Outcome>(
        &self,
        op: &str,
        subject: &str,
        result: Result<R, ProviderError>,
    ) -> (String, Result<R::Value, ProviderError>) {
        let head = format!("{} {op} {subject}", self.plugin);
        match result.map(R::split) {
            Ok((v, what)) => (scrub(format!("{head}: {what}")), Ok(v)),
            Err(e) => {
                let class = match e.class {
                    ErrorClass::NotFound => "not-found",
                    ErrorClass::QuotaExceeded => "quota-exceeded",
                    ErrorClass::Transient => "transient",
                    ErrorClass::Permanent => "permanent",
                };
                let line = format!(
                    "{head}: {class} ({code}): {}",
                    e.message,
                    code = e.code.as_deref().unwrap_or("-")
                );
                (scrub(line), Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: Outcomes = Outcomes {
        plugin: "test",
        changes: Level::Info,
        reads: Level::Debug,
    };

    #[test]
    fn changes_and_reads_have_their_levels() {
        let cases = [
            ("create", Level::Info),
            ("delete", Level::Info),
            ("get", Level::Debug),
            ("list", Level::Debug),
            ("check", Level::Debug),
        ];
        for (op, want) in cases {
            assert_eq!(OUT.level(op), want, "{op}");
        }
    }

    #[test]
    fn one_line_per_result() {
        let inst = |state, ip: &str| Instance {
            id: "r1/1".into(),
            ip: ip.into(),
            state,
            uid: String::new(),
            created_at: None,
            ..Instance::empty()
        };
        let lines = [
            OUT.line("create", "proxy-x", Ok("r1/1".to_string())).0,
            OUT.line(
                "create",
                "proxy-x",
                Ok(("r1/1".to_string(), "adopted r1/1".to_string())),
            )
            .0,
            OUT.line("get", "r1/1", Ok(inst(State::Running, "192.0.2.1")))
                .0,
            OUT.line("get", "r1/1", Ok(inst(State::Provisioning, ""))).0,
            OUT.line("list", "inst", Ok(vec![inst(State::Stopped, "")]))
                .0,
            OUT.line("delete", "r1/1", Ok(())).0,
            OUT.line::<()>(
                "get",
                "r1/1",
                Err(ProviderError::quota("limit reached").with_code("rate_limited")),
            )
            .0,
            OUT.line::<()>("delete", "r1/1", Err(ProviderError::transient("t")))
                .0,
        ];
        assert_eq!(
            lines,
            [
                "test create proxy-x: id r1/1",
                "test create proxy-x: adopted r1/1",
                "test get r1/1: running, 192.0.2.1",
                "test get r1/1: provisioning, no IP",
                "test list inst: 1 instances",
                "test delete r1/1: done",
                "test get r1/1: quota-exceeded (rate_limited): limit reached",
                "test delete r1/1: transient (-): t",
            ]
        );
    }

    /// The words a plugin keeps replace the default ones in the next line only, and a
    /// failure's line never shows them.
    #[test]
    fn kept_words_go_into_the_next_line_only() {
        let kept = keep(Ok(("r1/1".to_string(), "adopted r1/1".to_string())));
        assert_eq!(kept.unwrap(), "r1/1");
        assert_eq!(
            NOTE.with_borrow(Clone::clone).as_deref(),
            Some("adopted r1/1")
        );
        let id = OUT.log("create", "proxy-x", Ok("r1/1".to_string()));
        assert_eq!(id.unwrap(), "r1/1");
        assert_eq!(NOTE.with_borrow(Clone::clone), None, "taken by the line");
        let r = run(|| Err::<(), _>(ProviderError::not_found("gone")));
        assert_eq!(r.unwrap_err().class, ErrorClass::NotFound);
    }

    #[test]
    fn secrets_read_in_the_call_never_reach_the_line() {
        remember_secret(" tok-SENTINEL-123\n");
        remember_secret("abc"); // too short to cut
        let what = "answer mentions tok-SENTINEL-123 twice: tok-SENTINEL-123, abc".to_string();
        let (line, _) = OUT.line("check", "r1", Ok(((), what)));
        assert_eq!(
            line,
            "test check r1: answer mentions [secret] twice: [secret], abc"
        );
        let e = ProviderError::permanent("bad token tok-SENTINEL-123");
        let (line, _) = OUT.line::<()>("get", "r1/1", Err(e));
        assert!(!line.contains("SENTINEL"), "{line}");
        OUT.log("get", "r1/1", Ok(((), "natively to stderr".to_string())))
            .unwrap();
    }
}
