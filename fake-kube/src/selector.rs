//! Label and field selectors.
//!
//! Controllers narrow their watches with selectors, so a fake that ignored them would hand
//! a controller objects a real cluster never would. The label grammar is the one of
//! `k8s.io/apimachinery/pkg/labels` (equality, set and existence requirements, plus the
//! `>`/`<` forms); field selectors support `=`, `==` and `!=` on dotted paths.

use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq,
    NotEq,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

#[derive(Debug, Clone)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

impl LabelSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut p = Parser {
            chars: input.chars().collect(),
            pos: 0,
        };
        let mut reqs = Vec::new();
        p.skip_ws();
        if p.at_end() {
            return Ok(Self { reqs });
        }
        loop {
            reqs.push(p.requirement()?);
            p.skip_ws();
            if p.at_end() {
                break;
            }
            p.expect(',')?;
        }
        Ok(Self { reqs })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| {
            let v = labels.get(&r.key);
            match r.op {
                Op::Eq | Op::In => v.is_some_and(|v| r.values.contains(v)),
                Op::NotEq | Op::NotIn => v.is_none_or(|v| !r.values.contains(v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Gt | Op::Lt => {
                    let (Some(v), Some(bound)) = (v, r.values.first()) else {
                        return false;
                    };
                    match (v.parse::<i64>(), bound.parse::<i64>()) {
                        (Ok(v), Ok(b)) => {
                            if r.op == Op::Gt {
                                v > b
                            } else {
                                v < b
                            }
                        }
                        _ => false,
                    }
                }
            }
        })
    }

    pub fn matches_object(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        self.matches(&labels_of(obj))
    }
}

pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.chars.len()
    }
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }
    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }
    fn expect(&mut self, c: char) -> Result<(), String> {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected '{c}' at position {}", self.pos))
        }
    }
    fn word(&mut self) -> String {
        self.skip_ws();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '/') {
                self.pos += 1;
            } else {
                break;
            }
        }
        self.chars[start..self.pos].iter().collect()
    }
    fn requirement(&mut self) -> Result<Requirement, String> {
        self.skip_ws();
        if self.peek() == Some('!') {
            self.pos += 1;
            let key = self.word();
            validate_key(&key)?;
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
                values: vec![],
            });
        }
        let key = self.word();
        validate_key(&key)?;
        self.skip_ws();
        let rest: String = self.chars[self.pos..].iter().collect();
        let (op, len) = if rest.starts_with("==") {
            (Op::Eq, 2)
        } else if rest.starts_with("!=") {
            (Op::NotEq, 2)
        } else if rest.starts_with('=') {
            (Op::Eq, 1)
        } else if rest.starts_with('>') {
            (Op::Gt, 1)
        } else if rest.starts_with('<') {
            (Op::Lt, 1)
        } else if rest.starts_with("notin") && !starts_word(&rest[5..]) {
            (Op::NotIn, 5)
        } else if rest.starts_with("in") && !starts_word(&rest[2..]) {
            (Op::In, 2)
        } else if rest.is_empty() || rest.starts_with(',') {
            return Ok(Requirement {
                key,
                op: Op::Exists,
                values: vec![],
            });
        } else {
            return Err(format!("unexpected '{rest}' after key {key}"));
        };
        self.pos += len;
        match op {
            Op::In | Op::NotIn => {
                self.expect('(')?;
                let mut values = Vec::new();
                loop {
                    let v = self.word();
                    validate_value(&v)?;
                    values.push(v);
                    self.skip_ws();
                    match self.peek() {
                        Some(',') => self.pos += 1,
                        Some(')') => {
                            self.pos += 1;
                            break;
                        }
                        _ => return Err(format!("unterminated value set for key {key}")),
                    }
                }
                Ok(Requirement { key, op, values })
            }
            Op::Gt | Op::Lt => {
                let v = self.word();
                v.parse::<i64>().map_err(|_| {
                    format!("{v}: for 'Gt', 'Lt' operators, the value must be an integer")
                })?;
                Ok(Requirement {
                    key,
                    op,
                    values: vec![v],
                })
            }
            _ => {
                let v = self.word();
                validate_value(&v)?;
                Ok(Requirement {
                    key,
                    op,
                    values: vec![v],
                })
            }
        }
    }
}

fn starts_word(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("empty label key".into());
    }
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return Err(format!("invalid label key prefix in {key:?}"));
            }
            name
        }
        None => key,
    };
    if name.is_empty()
        || name.len() > 63
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(())
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.len() > 63
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!("invalid label value {v:?}"));
    }
    Ok(())
}

/// A parsed field selector.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!("invalid field selector requirement {part:?}"));
            };
            reqs.push((field.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(Self { reqs })
    }

    /// Unknown fields compare as the empty string, which is more lenient than the real
    /// server (it rejects fields a kind does not index) but never matches more than asked.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(field, eq, want)| {
            let mut cur = obj;
            let mut found = true;
            for seg in field.split('.') {
                match cur.get(seg) {
                    Some(v) => cur = v,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            let have = if !found || cur.is_null() {
                String::new()
            } else {
                match cur {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }
            };
            (have == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_grammar() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
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
            assert_eq!(s.matches(&l), want, "{sel}");
        }
        for bad in ["app in web", "=x", "app in (a", "a b", "n>x"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn field_selector() {
        let obj =
            serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "type": "Opaque"});
        for (sel, want) in [
            ("metadata.name=a", true),
            ("metadata.name!=a", false),
            ("metadata.namespace==ns,metadata.name=a", true),
            ("type=Opaque", true),
            ("spec.nodeName=", true),
        ] {
            assert_eq!(
                FieldSelector::parse(sel).unwrap().matches_object(&obj),
                want,
                "{sel}"
            );
        }
    }
}
