//! The cloud-init template: the few `{{egress.*}}` placeholders the operator fills in before
//! `create`, so a cloud-init can configure the proxy's port and credentials without anyone
//! writing them by hand.
//!
//! Why so narrow: cloud-init documents are YAML full of shell (`${VAR}`), and cloud-init
//! itself renders jinja (`{{ v1.region }}`) when the document starts with
//! `## template: jinja`. So only a `{{` followed (after optional blanks) by `egress.` is the
//! operator's; every other byte, other `{{ ... }}` included, passes through unchanged. An
//! `egress.` name the operator does not know is an error naming it, never silently empty
//! text (a typo in `{{egress.pasword}}` would otherwise configure an empty password).
//!
//! | placeholder | becomes |
//! |---|---|
//! | `{{egress.port}}` | `spec.port` |
//! | `{{egress.name}}` | the Proxy's name |
//! | `{{egress.username}}`, `{{egress.password}}` | the credentials (see `spec.auth`) |
//! | `{{egress.allowedClients}}` | `spec.auth.allowedClients`, canonical CIDRs separated by one space |
//!
//! One space between CIDRs suits both squid (`acl clients src {{egress.allowedClients}}`)
//! and a shell loop writing tinyproxy's one-per-line `Allow` (`for c in
//! {{egress.allowedClients}}; do echo "Allow $c"; done`).

use std::collections::BTreeSet;
use std::fmt;

/// A placeholder the operator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Placeholder {
    Port,
    Name,
    Username,
    Password,
    AllowedClients,
}

impl Placeholder {
    const ALL: [Placeholder; 5] = [
        Placeholder::Port,
        Placeholder::Name,
        Placeholder::Username,
        Placeholder::Password,
        Placeholder::AllowedClients,
    ];

    /// The name after `egress.`.
    pub fn key(self) -> &'static str {
        match self {
            Placeholder::Port => "port",
            Placeholder::Name => "name",
            Placeholder::Username => "username",
            Placeholder::Password => "password",
            Placeholder::AllowedClients => "allowedClients",
        }
    }

    fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.key() == key)
    }
}

impl fmt::Display for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{{egress.{}}}}}", self.key())
    }
}

/// What the placeholders stand for in one Proxy. `None` credentials: `spec.auth.type` is
/// `None`, so `{{egress.username}}` and `{{egress.password}}` have nothing to stand for.
#[derive(Clone, PartialEq, Eq)]
pub struct Values<'a> {
    pub port: u16,
    pub name: &'a str,
    pub credentials: Option<(&'a str, &'a str)>,
    /// Canonical CIDRs (see `proxy_auth::Access`).
    pub allowed_clients: &'a [String],
}

/// Never prints the credentials.
impl fmt::Debug for Values<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Values")
            .field("port", &self.port)
            .field("name", &self.name)
            .field("credentials", &self.credentials.map(|_| "<set>"))
            .field("allowed_clients", &self.allowed_clients)
            .finish()
    }
}

/// Why a template cannot be rendered. Names the placeholder and its line, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error(
        "spec.cloudInit line {line}: unknown placeholder {{{{egress.{name}}}}}; the known ones are {{{{egress.port}}}}, {{{{egress.name}}}}, {{{{egress.username}}}}, {{{{egress.password}}}} and {{{{egress.allowedClients}}}}"
    )]
    Unknown { line: usize, name: String },
    #[error(
        "spec.cloudInit line {line}: {{{{egress. is not closed by }}}}; write a placeholder as {{{{egress.NAME}}}}"
    )]
    Unterminated { line: usize },
    #[error("spec.cloudInit line {line}: {placeholder} is used but spec.auth.type is None")]
    NoCredentials {
        line: usize,
        placeholder: Placeholder,
    },
    #[error(
        "spec.cloudInit line {line}: {{{{egress.allowedClients}}}} is used but spec.auth.allowedClients is empty"
    )]
    NoAllowedClients { line: usize },
    #[error(
        "spec.cloudInit renders to {bytes} bytes ({template_bytes} before its placeholders were filled in), more than the {max} bytes a cloud-init may have (EC2's user-data limit, the smallest among the clouds)",
        max = MAX_RENDERED_BYTES
    )]
    TooLarge { bytes: usize, template_bytes: usize },
}

/// The rendered bytes and which placeholders they used.
#[derive(Clone, PartialEq, Eq)]
pub struct Rendered {
    pub bytes: Vec<u8>,
    pub used: BTreeSet<Placeholder>,
}

impl fmt::Debug for Rendered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rendered")
            .field("len", &self.bytes.len())
            .field("used", &self.used)
            .finish()
    }
}

impl Rendered {
    /// Whether the credentials went into the bytes.
    pub fn has_credentials(&self) -> bool {
        self.used.contains(&Placeholder::Username) || self.used.contains(&Placeholder::Password)
    }
}

const PREFIX: &[u8] = b"egress.";

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Fills in every `{{egress.NAME}}` (blanks allowed inside the braces: `{{ egress.port }}`)
/// of `template`; every other byte is copied unchanged.
pub fn render(template: &[u8], values: &Values<'_>) -> Result<Rendered, TemplateError> {
    // Measured first, written second: a template of many placeholders over long values
    // (1,000 `{{egress.allowedClients}}` of 10,000 CIDRs: 136 MiB from a 204 KiB Proxy)
    // is refused before a byte of its output is allocated.
    let mut size = 0usize;
    scan(template, values, &mut |piece| {
        size = size.saturating_add(piece.len())
    })?;
    if size > MAX_RENDERED_BYTES {
        return Err(TemplateError::TooLarge {
            bytes: size,
            template_bytes: template.len(),
        });
    }
    let mut out = Vec::with_capacity(size);
    let used = scan(template, values, &mut |piece| out.extend_from_slice(piece))?;
    Ok(Rendered { bytes: out, used })
}

/// The largest cloud-init a Proxy may render to: EC2's limit on user data (16 KiB before
/// base64), the smallest among the clouds, so a document that renders fits every provider.
/// It bounds what one Proxy makes the operator hold (the rendered bytes, and the
/// redactor's patterns of them, kept per provider), whatever its placeholders multiply.
pub const MAX_RENDERED_BYTES: usize = 16 * 1024;

/// Walks `template`, handing each piece of the output to `emit` in order; returns the
/// placeholders used.
fn scan(
    template: &[u8],
    values: &Values<'_>,
    emit: &mut dyn FnMut(&[u8]),
) -> Result<BTreeSet<Placeholder>, TemplateError> {
    let mut used = BTreeSet::new();
    let mut i = 0;
    let mut line = 1;
    let mut line_from = 0;
    while i < template.len() {
        let Some(off) = template[i..].windows(2).position(|w| w == b"{{") else {
            break;
        };
        let open = i + off;
        line += template[line_from..open]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        line_from = open;
        let mut j = open + 2;
        while j < template.len() && is_blank(template[j]) {
            j += 1;
        }
        if !template[j..].starts_with(PREFIX) {
            // Not ours (jinja, or literal braces): copy one `{` and look again from the
            // next byte, which may open a placeholder itself (`{{{egress.port}}}`).
            emit(&template[i..open + 1]);
            i = open + 1;
            continue;
        }
        let name_start = j + PREFIX.len();
        let mut k = name_start;
        while k < template.len() && (template[k].is_ascii_alphanumeric() || template[k] == b'_') {
            k += 1;
        }
        let name_end = k;
        while k < template.len() && is_blank(template[k]) {
            k += 1;
        }
        if !template[k..].starts_with(b"}}") {
            return Err(TemplateError::Unterminated { line });
        }
        let name = String::from_utf8_lossy(&template[name_start..name_end]).into_owned();
        let p = Placeholder::from_key(&name).ok_or(TemplateError::Unknown { line, name })?;
        emit(&template[i..open]);
        match p {
            Placeholder::Port => emit(values.port.to_string().as_bytes()),
            Placeholder::Name => emit(values.name.as_bytes()),
            Placeholder::Username | Placeholder::Password => {
                let (user, pass) = values.credentials.ok_or(TemplateError::NoCredentials {
                    line,
                    placeholder: p,
                })?;
                let v = if p == Placeholder::Username {
                    user
                } else {
                    pass
                };
                emit(v.as_bytes());
            }
            Placeholder::AllowedClients => {
                if values.allowed_clients.is_empty() {
                    return Err(TemplateError::NoAllowedClients { line });
                }
                for (n, c) in values.allowed_clients.iter().enumerate() {
                    if n > 0 {
                        emit(b" ");
                    }
                    emit(c.as_bytes());
                }
            }
        }
        used.insert(p);
        i = k + 2;
    }
    emit(&template[i.min(template.len())..]);
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values<'a>(clients: &'a [String]) -> Values<'a> {
        Values {
            port: 3128,
            name: "px-1",
            credentials: Some(("alice", "s3cret")),
            allowed_clients: clients,
        }
    }

    #[test]
    fn renders_only_the_egress_namespace() {
        let clients = vec!["203.0.113.0/24".to_string(), "2001:db8::/32".to_string()];
        type Case<'a> = (&'a str, &'a str, &'a str, &'a [Placeholder]);
        let cases: &[Case<'_>] = &[
            ("empty", "", "", &[]),
            ("no placeholder", "#cloud-config\n", "#cloud-config\n", &[]),
            (
                "port",
                "Port {{egress.port}}\n",
                "Port 3128\n",
                &[Placeholder::Port],
            ),
            (
                "blanks inside the braces",
                "Port {{ egress.port\t}}",
                "Port 3128",
                &[Placeholder::Port],
            ),
            (
                "credentials",
                "BasicAuth {{egress.username}} {{egress.password}}",
                "BasicAuth alice s3cret",
                &[Placeholder::Username, Placeholder::Password],
            ),
            ("name", "# {{egress.name}}", "# px-1", &[Placeholder::Name]),
            (
                "allowed clients, one space apart",
                "acl clients src {{egress.allowedClients}}",
                "acl clients src 203.0.113.0/24 2001:db8::/32",
                &[Placeholder::AllowedClients],
            ),
            (
                "shell and jinja pass unchanged",
                "echo ${HOME} $((1+1)) {{ v1.region }} {{egress}} {{ egressx.port }} {egress.port} {{{egress.port}}}}",
                "echo ${HOME} $((1+1)) {{ v1.region }} {{egress}} {{ egressx.port }} {egress.port} {3128}}",
                &[Placeholder::Port],
            ),
            ("a lone {{ at the end", "x {{", "x {{", &[]),
            (
                "repeated",
                "{{egress.port}}{{egress.port}}",
                "31283128",
                &[Placeholder::Port],
            ),
        ];
        for (name, template, want, want_used) in cases {
            let got = render(template.as_bytes(), &values(&clients))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(String::from_utf8(got.bytes).unwrap(), *want, "{name}");
            assert_eq!(
                got.used.into_iter().collect::<Vec<_>>(),
                *want_used,
                "{name}"
            );
        }
    }

    #[test]
    fn non_utf8_bytes_pass_unchanged() {
        let template = b"\xff\xfe {{egress.port}} \x00\x80";
        let got = render(template, &values(&[])).unwrap();
        assert_eq!(got.bytes, b"\xff\xfe 3128 \x00\x80");
    }

    #[test]
    fn errors_name_the_placeholder_and_line() {
        let open = Values {
            credentials: None,
            ..values(&[])
        };
        for (template, v, want) in [
            (
                "a\nb {{egress.pasword}}",
                &values(&[]),
                "spec.cloudInit line 2: unknown placeholder {{egress.pasword}}",
            ),
            (
                "{{egress.port",
                &values(&[]),
                "spec.cloudInit line 1: {{egress. is not closed by }}",
            ),
            (
                "{{egress.port.x}}",
                &values(&[]),
                "spec.cloudInit line 1: {{egress. is not closed by }}",
            ),
            (
                "{{ egress.}}",
                &values(&[]),
                "spec.cloudInit line 1: unknown placeholder {{egress.}}",
            ),
            (
                "\n\n\nBasicAuth {{egress.username}} x",
                &open,
                "spec.cloudInit line 4: {{egress.username}} is used but spec.auth.type is None",
            ),
            (
                "{{egress.password}}",
                &open,
                "spec.cloudInit line 1: {{egress.password}} is used but spec.auth.type is None",
            ),
            (
                "acl c src {{egress.allowedClients}}",
                &values(&[]),
                "spec.cloudInit line 1: {{egress.allowedClients}} is used but spec.auth.allowedClients is empty",
            ),
        ] {
            let err = render(template.as_bytes(), v).unwrap_err().to_string();
            assert!(err.starts_with(want), "{template:?}: {err}");
        }
    }

    #[test]
    fn a_render_larger_than_the_limit_is_refused_before_it_is_built() {
        let many: Vec<String> = (0..10_000)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
            .collect();
        let bomb = "x {{egress.allowedClients}}\n".repeat(1_000);
        // (case, template, allowed clients, refused)
        let cases: [(&str, String, &[String], bool); 4] = [
            (
                "small",
                "Allow {{egress.allowedClients}}".into(),
                &many[..3],
                false,
            ),
            (
                "just fits",
                "a".repeat(MAX_RENDERED_BYTES),
                &many[..1],
                false,
            ),
            (
                "one byte over",
                "a".repeat(MAX_RENDERED_BYTES + 1),
                &many[..1],
                true,
            ),
            ("the issue's bomb (136 MiB)", bomb.clone(), &many[..], true),
        ];
        for (case, template, clients, refused) in cases {
            match render(template.as_bytes(), &values(clients)) {
                Err(e @ TemplateError::TooLarge { bytes, .. }) => {
                    assert!(refused, "{case}: refused at {bytes}");
                    assert!(bytes > MAX_RENDERED_BYTES, "{case}");
                    assert!(e.to_string().contains("16384 bytes"), "{case}: {e}");
                }
                Ok(r) => {
                    assert!(!refused, "{case}: rendered {} bytes", r.bytes.len());
                    assert!(r.bytes.len() <= MAX_RENDERED_BYTES, "{case}");
                }
                Err(e) => panic!("{case}: {e}"),
            }
        }
        // Counted, not built: the bomb's whole size is known without allocating it.
        let err = render(bomb.as_bytes(), &values(&many)).unwrap_err();
        assert!(
            matches!(err, TemplateError::TooLarge { bytes, .. } if bytes > 100 << 20),
            "{err}"
        );
    }

    #[test]
    fn nothing_printed_carries_a_credential() {
        let v = values(&[]);
        let r = render(b"BasicAuth {{egress.username}} {{egress.password}}", &v).unwrap();
        for printed in [format!("{v:?}"), format!("{r:?}")] {
            assert!(
                !printed.contains("s3cret") && !printed.contains("alice"),
                "{printed}"
            );
        }
        assert!(r.has_credentials());
    }
}
