//! Kubernetes label selectors in their string form, as `kubectl -l` and `?labelSelector=`
//! take them (the grammar of `k8s.io/apimachinery/pkg/labels`):
//!
//! - equality: `tier=gold`, `tier==gold`, `tier!=gold`
//! - sets: `tier in (gold, silver)`, `tier notin (bronze)`
//! - existence: `tier`, `!tier`
//! - integer comparison: `rank>3`, `rank<10`
//!
//! Requirements are separated by commas and all must hold; the empty selector matches
//! everything. As in Kubernetes, `!=` and `notin` also match objects without the label.
//! Keys must be qualified names (`[prefix/]name`) and values valid label values; a selector
//! that breaks the grammar is an error, never a silently different filter.

use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// Why a selector string was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError(pub String);

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SelectorError {}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,          // !
    Equals,       // =
    DoubleEquals, // ==
    NotEquals,    // !=
    Greater,      // >
    Less,         // <
    Open,         // (
    Close,        // )
    Comma,        // ,
    End,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(s) => write!(f, "{s:?}"),
            Token::Not => f.write_str("'!'"),
            Token::Equals => f.write_str("'='"),
            Token::DoubleEquals => f.write_str("'=='"),
            Token::NotEquals => f.write_str("'!='"),
            Token::Greater => f.write_str("'>'"),
            Token::Less => f.write_str("'<'"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
            Token::Comma => f.write_str("','"),
            Token::End => f.write_str("end of input"),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | '>' | '<' | '(' | ')' | ',')
}

fn lex(input: &str) -> Vec<(usize, Token)> {
    let mut out = Vec::new();
    let mut it = input.char_indices().peekable();
    while let Some(&(pos, c)) = it.peek() {
        if c.is_whitespace() {
            it.next();
            continue;
        }
        it.next();
        let tok = match c {
            '!' if it.peek().is_some_and(|&(_, n)| n == '=') => {
                it.next();
                Token::NotEquals
            }
            '!' => Token::Not,
            '=' if it.peek().is_some_and(|&(_, n)| n == '=') => {
                it.next();
                Token::DoubleEquals
            }
            '=' => Token::Equals,
            '>' => Token::Greater,
            '<' => Token::Less,
            '(' => Token::Open,
            ')' => Token::Close,
            ',' => Token::Comma,
            _ => {
                let mut end = pos + c.len_utf8();
                while let Some(&(p, n)) = it.peek() {
                    if n.is_whitespace() || is_special(n) {
                        break;
                    }
                    end = p + n.len_utf8();
                    it.next();
                }
                Token::Ident(input[pos..end].to_string())
            }
        };
        out.push((pos, tok));
    }
    out.push((input.len(), Token::End));
    out
}

struct Parser {
    tokens: Vec<(usize, Token)>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.at].1
    }
    fn next(&mut self) -> (usize, Token) {
        let t = self.tokens[self.at].clone();
        if self.at + 1 < self.tokens.len() {
            self.at += 1;
        }
        t
    }
    fn unexpected(pos: usize, tok: &Token, wanted: &str) -> SelectorError {
        SelectorError(format!(
            "unexpected {tok} at position {pos}, expected {wanted}"
        ))
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (pos, tok) = self.next();
        let (negated, key) = match tok {
            Token::Not => match self.next() {
                (_, Token::Ident(k)) => (true, k),
                (p, t) => return Err(Self::unexpected(p, &t, "a label key after '!'")),
            },
            Token::Ident(k) => (false, k),
            t => return Err(Self::unexpected(pos, &t, "a label key")),
        };
        validate_key(&key)?;
        if negated {
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
                values: vec![],
            });
        }
        let (pos, tok) = self.next();
        let op = match tok {
            Token::End | Token::Comma => {
                // `key` alone: existence. Give the comma back to the caller.
                if tok == Token::Comma {
                    self.at -= 1;
                }
                return Ok(Requirement {
                    key,
                    op: Op::Exists,
                    values: vec![],
                });
            }
            Token::Equals | Token::DoubleEquals => Op::Equals,
            Token::NotEquals => Op::NotEquals,
            Token::Greater => Op::GreaterThan,
            Token::Less => Op::LessThan,
            Token::Ident(ref w) if w == "in" => Op::In,
            Token::Ident(ref w) if w == "notin" => Op::NotIn,
            t => {
                return Err(Self::unexpected(
                    pos,
                    &t,
                    "an operator (=, ==, !=, in, notin, >, <), ',' or end of input",
                ));
            }
        };
        let values = match op {
            Op::In | Op::NotIn => self.value_set(&key)?,
            Op::GreaterThan | Op::LessThan => match self.next() {
                (_, Token::Ident(v)) => {
                    if v.parse::<i64>().is_err() {
                        return Err(SelectorError(format!(
                            "value {v:?} for key {key:?} must be an integer for '>' and '<'"
                        )));
                    }
                    vec![v]
                }
                (p, t) => return Err(Self::unexpected(p, &t, "an integer value")),
            },
            _ => match self.peek().clone() {
                // `key=` selects the empty value, as in Kubernetes.
                Token::End | Token::Comma => vec![String::new()],
                Token::Ident(v) => {
                    self.next();
                    validate_value(&v)?;
                    vec![v]
                }
                t => return Err(Self::unexpected(self.tokens[self.at].0, &t, "a value")),
            },
        };
        Ok(Requirement { key, op, values })
    }

    fn value_set(&mut self, key: &str) -> Result<Vec<String>, SelectorError> {
        match self.next() {
            (_, Token::Open) => {}
            (p, t) => return Err(Self::unexpected(p, &t, "'(' opening a value set")),
        }
        let mut values = Vec::new();
        // Kubernetes allows empty members (`in (a,)` holds "a" and ""), not an empty set.
        let mut expect_value = true;
        loop {
            let (pos, tok) = self.next();
            match tok {
                Token::Ident(v) if expect_value => {
                    validate_value(&v)?;
                    values.push(v);
                    expect_value = false;
                }
                Token::Comma => {
                    if expect_value {
                        values.push(String::new());
                    }
                    expect_value = true;
                }
                Token::Close => {
                    if expect_value && !values.is_empty() {
                        values.push(String::new());
                    }
                    break;
                }
                t => return Err(Self::unexpected(pos, &t, "a value, ',' or ')'")),
            }
        }
        if values.is_empty() {
            return Err(SelectorError(format!(
                "the value set for key {key:?} is empty; 'in' and 'notin' need at least one value"
            )));
        }
        Ok(values)
    }
}

impl LabelSelector {
    /// Parses the string form; `""` (or only whitespace) selects everything.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut p = Parser {
            tokens: lex(input),
            at: 0,
        };
        let mut requirements = Vec::new();
        if *p.peek() == Token::End {
            return Ok(Self { requirements });
        }
        loop {
            requirements.push(p.requirement()?);
            match p.next() {
                (_, Token::End) => break,
                (_, Token::Comma) => {}
                (pos, t) => return Err(Parser::unexpected(pos, &t, "',' or end of input")),
            }
        }
        Ok(Self { requirements })
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object with `labels` is selected.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.requirements.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key));
            match r.op {
                Op::Equals | Op::In => v.is_some_and(|v| r.values.contains(v)),
                Op::NotEquals | Op::NotIn => v.is_none_or(|v| !r.values.contains(v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::GreaterThan | Op::LessThan => {
                    let (Some(Ok(v)), Ok(bound)) =
                        (v.map(|v| v.parse::<i64>()), r.values[0].parse::<i64>())
                    else {
                        return false;
                    };
                    if r.op == Op::GreaterThan {
                        v > bound
                    } else {
                        v < bound
                    }
                }
            }
        })
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters: a label name or value.
fn is_label_token(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: lower-case labels separated by dots, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_token(name),
        None => is_label_token(key),
    };
    if ok {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "invalid label key {key:?}: a key is an optional DNS subdomain prefix and '/', then \
             a name of at most 63 characters [A-Za-z0-9] with '-', '_' or '.' inside"
        )))
    }
}

fn validate_value(value: &str) -> Result<(), SelectorError> {
    if value.is_empty() || is_label_token(value) {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "invalid label value {value:?}: at most 63 characters [A-Za-z0-9] with '-', '_' \
             or '.' inside"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table the fake API server's own parser was tested with before it used this one.
    #[test]
    fn the_fake_api_servers_cases() {
        let l: BTreeMap<String, String> = [("app", "web"), ("tier", "front"), ("n", "5")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier=front", true),
            ("app=web, tier=back", false),
            ("n>3", true),
            ("n<3", false),
            ("example.com/x", false),
            ("app=", false),
            ("tier in (front),!missing,app", true),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(Some(&l)), want, "{sel}");
        }
        for bad in ["app in web", "=x", "app in (a", "a b", "n>x"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn matching_follows_kubernetes() {
        let gold = labels(&[("tier", "gold"), ("rank", "5"), ("egress.dev/pool", "a")]);
        let bronze = labels(&[("tier", "bronze")]);
        let none = labels(&[]);
        // (selector, gold, bronze, no labels)
        let table = [
            ("", true, true, true),
            ("tier=gold", true, false, false),
            ("tier==gold", true, false, false),
            ("tier = gold", true, false, false),
            ("tier!=gold", false, true, true),
            ("tier in (gold, silver)", true, false, false),
            ("tier notin (gold,silver)", false, true, true),
            ("tier", true, true, false),
            ("!tier", false, false, true),
            ("rank>3", true, false, false),
            ("rank<3", false, false, false),
            ("tier,!rank", false, true, false),
            ("egress.dev/pool=a", true, false, false),
            ("tier in (gold),rank in (5, 6)", true, false, false),
            ("tier=", false, false, false),
            ("tier in (gold,)", true, false, false),
        ];
        for (s, g, b, n) in table {
            let parsed = sel(s);
            assert_eq!(
                (
                    parsed.matches(Some(&gold)),
                    parsed.matches(Some(&bronze)),
                    parsed.matches(Some(&none))
                ),
                (g, b, n),
                "{s:?}"
            );
            assert_eq!(parsed.matches(None), n, "{s:?} without labels");
        }
        assert!(sel("tier=").matches(Some(&labels(&[("tier", "")]))));
    }

    #[test]
    fn malformed_selectors_are_rejected_with_a_reason() {
        for (s, needle) in [
            ("tier in (gold", "expected a value, ',' or ')'"),
            ("tier in ()", "empty"),
            ("tier in gold", "'('"),
            ("=gold", "label key"),
            ("tier=gold,", "label key"),
            ("tier gold", "operator"),
            ("tier=gold=x", "',' or end of input"),
            ("-bad=x", "invalid label key"),
            ("tier=bad value", "',' or end of input"),
            ("tier=-x", "invalid label value"),
            ("rank>x", "integer"),
            ("UPPER.case/x=y", "invalid label key"),
            (&format!("k={}", "v".repeat(64)), "invalid label value"),
            ("!", "label key after '!'"),
        ] {
            let err = LabelSelector::parse(s).expect_err(s).0;
            assert!(err.contains(needle), "{s:?}: {err}");
        }
        assert_eq!(
            LabelSelector::parse("tier in (gold").unwrap_err().0,
            "unexpected end of input at position 13, expected a value, ',' or ')'"
        );
    }
}
