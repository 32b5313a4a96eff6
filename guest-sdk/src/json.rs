//! Small helpers for backends' JSON.

use serde::{Deserialize, Deserializer};

/// `null` and absent both read as the default. Many APIs send `null` for an empty list,
/// map or string, which plain serde refuses for a `Vec` or `String` field. Use with
/// `#[serde(default, deserialize_with = "nullable")]`.
pub fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug, PartialEq)]
    struct S {
        #[serde(default, deserialize_with = "nullable")]
        items: Vec<u8>,
        #[serde(default, deserialize_with = "nullable")]
        name: String,
    }

    #[test]
    fn null_absent_and_present() {
        let cases = [
            (
                r#"{"items":null,"name":null}"#,
                S {
                    items: vec![],
                    name: String::new(),
                },
            ),
            (
                "{}",
                S {
                    items: vec![],
                    name: String::new(),
                },
            ),
            (
                r#"{"items":[1],"name":"x"}"#,
                S {
                    items: vec![1],
                    name: "x".into(),
                },
            ),
        ];
        for (json, want) in cases {
            assert_eq!(serde_json::from_str::<S>(json).unwrap(), want, "{json}");
        }
        assert!(serde_json::from_str::<S>(r#"{"items":"x"}"#).is_err());
    }
}
