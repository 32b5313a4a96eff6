//! Decoding of the protobuf request bodies kubectl's imperative generators send.
//!
//! `kubectl create namespace|configmap|secret` use client-go's typed clients, which post
//! `application/vnd.kubernetes.protobuf`. Answers can stay JSON (clients accept both), so
//! only request decoding is needed, and only for those three kinds; anything else gets 415
//! and should be sent as JSON (`kubectl create -f` does).

use crate::error::{ApiError, ApiResult};
use serde_json::{Map, Value, json};

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn varint(&mut self) -> ApiResult<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or_else(truncated)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ApiError::bad_request("protobuf: varint too long"))
    }

    fn next(&mut self) -> ApiResult<Option<(u64, Field<'a>)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.pos += 8;
                Field::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| truncated())?;
                let end = self
                    .pos
                    .checked_add(len)
                    .filter(|e| *e <= self.buf.len())
                    .ok_or_else(truncated)?;
                let b = &self.buf[self.pos..end];
                self.pos = end;
                Field::Bytes(b)
            }
            5 => {
                self.pos += 4;
                Field::Fixed
            }
            w => {
                return Err(ApiError::bad_request(format!(
                    "protobuf: unsupported wire type {w}"
                )));
            }
        };
        if self.pos > self.buf.len() {
            return Err(truncated());
        }
        Ok(Some((key >> 3, field)))
    }
}

fn truncated() -> ApiError {
    ApiError::bad_request("protobuf: truncated message")
}

fn string(b: &[u8]) -> ApiResult<String> {
    String::from_utf8(b.to_vec()).map_err(|_| ApiError::bad_request("protobuf: invalid UTF-8"))
}

/// A `map<string, string|bytes>` entry.
fn map_entry(b: &[u8], bytes_value: bool) -> ApiResult<(String, Value)> {
    let mut r = Reader::new(b);
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => k = string(b)?,
            (2, Field::Bytes(b)) if bytes_value => v = json!(data_encoding::BASE64.encode(b)),
            (2, Field::Bytes(b)) => v = json!(string(b)?),
            _ => {}
        }
    }
    Ok((k, v))
}

fn owner_reference(b: &[u8]) -> ApiResult<Value> {
    let mut r = Reader::new(b);
    let mut o = Map::new();
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => drop(o.insert("kind".into(), json!(string(b)?))),
            (3, Field::Bytes(b)) => drop(o.insert("name".into(), json!(string(b)?))),
            (4, Field::Bytes(b)) => drop(o.insert("uid".into(), json!(string(b)?))),
            (5, Field::Bytes(b)) => drop(o.insert("apiVersion".into(), json!(string(b)?))),
            (6, Field::Varint(v)) => drop(o.insert("controller".into(), json!(v != 0))),
            (7, Field::Varint(v)) => drop(o.insert("blockOwnerDeletion".into(), json!(v != 0))),
            _ => {}
        }
    }
    Ok(Value::Object(o))
}

fn object_meta(b: &[u8]) -> ApiResult<Value> {
    let mut r = Reader::new(b);
    let mut m = Map::new();
    let (mut labels, mut annotations) = (Map::new(), Map::new());
    let (mut owners, mut finalizers) = (Vec::new(), Vec::new());
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => drop(m.insert("name".into(), json!(string(b)?))),
            (2, Field::Bytes(b)) => drop(m.insert("generateName".into(), json!(string(b)?))),
            (3, Field::Bytes(b)) => drop(m.insert("namespace".into(), json!(string(b)?))),
            (11, Field::Bytes(b)) => {
                let (k, v) = map_entry(b, false)?;
                labels.insert(k, v);
            }
            (12, Field::Bytes(b)) => {
                let (k, v) = map_entry(b, false)?;
                annotations.insert(k, v);
            }
            (13, Field::Bytes(b)) => owners.push(owner_reference(b)?),
            (14, Field::Bytes(b)) => finalizers.push(json!(string(b)?)),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !owners.is_empty() {
        m.insert("ownerReferences".into(), Value::Array(owners));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(m))
}

fn decode_kind(kind: &str, raw: &[u8]) -> ApiResult<Value> {
    let mut r = Reader::new(raw);
    let mut obj = Map::new();
    let mut maps: [Map<String, Value>; 3] = Default::default();
    let (data_bytes, data_idx, binary_idx, string_idx) = match kind {
        "ConfigMap" => (false, 2, 3, 0),
        "Secret" => (true, 2, 0, 4),
        "Namespace" => (false, 0, 0, 0),
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "fake-kube decodes protobuf only for ConfigMap, Secret and Namespace, not {other}; send JSON"
            )));
        }
    };
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => drop(obj.insert("metadata".into(), object_meta(b)?)),
            (n, Field::Bytes(b)) if n == data_idx => {
                let (k, v) = map_entry(b, data_bytes)?;
                maps[0].insert(k, v);
            }
            (n, Field::Bytes(b)) if n == binary_idx => {
                let (k, v) = map_entry(b, true)?;
                maps[1].insert(k, v);
            }
            (n, Field::Bytes(b)) if n == string_idx => {
                let (k, v) = map_entry(b, false)?;
                maps[2].insert(k, v);
            }
            (3, Field::Bytes(b)) if kind == "Secret" => {
                drop(obj.insert("type".into(), json!(string(b)?)))
            }
            (4, Field::Varint(v)) if kind == "ConfigMap" => {
                drop(obj.insert("immutable".into(), json!(v != 0)))
            }
            (5, Field::Varint(v)) if kind == "Secret" => {
                drop(obj.insert("immutable".into(), json!(v != 0)))
            }
            (2, Field::Bytes(b)) if kind == "Namespace" => {
                let mut fins = Vec::new();
                let mut sr = Reader::new(b);
                while let Some((n, f)) = sr.next()? {
                    if let (1, Field::Bytes(b)) = (n, f) {
                        fins.push(json!(string(b)?));
                    }
                }
                obj.insert("spec".into(), json!({"finalizers": fins}));
            }
            _ => {}
        }
    }
    for (name, m) in ["data", "binaryData", "stringData"].into_iter().zip(maps) {
        if !m.is_empty() {
            obj.insert(name.into(), Value::Object(m));
        }
    }
    Ok(Value::Object(obj))
}

/// Decodes a `k8s\0`-prefixed `runtime.Unknown` envelope into the JSON form of the object.
pub fn decode(body: &[u8]) -> ApiResult<Value> {
    let inner = body
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| ApiError::bad_request("protobuf: missing the k8s envelope magic"))?;
    let mut r = Reader::new(inner);
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => {
                let mut tr = Reader::new(b);
                while let Some((n, f)) = tr.next()? {
                    match (n, f) {
                        (1, Field::Bytes(b)) => api_version = string(b)?,
                        (2, Field::Bytes(b)) => kind = string(b)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let mut obj = decode_kind(&kind, raw)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn decodes_a_configmap_envelope() {
        let meta = [
            field(1, b"cm"),
            field(11, &[field(1, b"a"), field(2, b"b")].concat()),
        ]
        .concat();
        let cm = [
            field(1, &meta),
            field(2, &[field(1, b"k"), field(2, b"v")].concat()),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &cm)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": {"a": "b"}}, "data": {"k": "v"}})
        );
    }
}
