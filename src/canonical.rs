//! Canonical JSON: the one way cudastack serialises anything it hashes.
//!
//! oci-spec keeps labels and annotations in `HashMap`s, so serialising the same value
//! twice can give two byte strings and two digests (CRATES.md pitfall 1). Every config,
//! manifest, index and cache key goes through [`to_canonical_json`]: object keys sorted
//! by their UTF-8 bytes at every depth, no insignificant whitespace. The bytes returned
//! are the bytes that are hashed and the bytes that are stored.
//!
//! Shared vocabulary, below the pipeline: `layer` (cache keys), `oci` (documents), `verify`
//! and `registry` use it; it depends on nothing of cudastack (it used to live in
//! `oci`, which made `layer` and `oci` import each other).

use std::io::Write;

use serde::Serialize;
use serde_json::Value;

/// Serialise `value` as canonical JSON (sorted keys, compact).
pub fn to_canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let value = serde_json::to_value(value)?;
    let mut out = Vec::new();
    write_value(&value, &mut out)?;
    Ok(out)
}

fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match value {
        Value::Object(map) => {
            // Sort explicitly: a dependency enabling serde_json's `preserve_order`
            // would otherwise change the order silently.
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                write_value(&map[key], out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out)?;
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    let _ = out.flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn keys_are_sorted_at_every_depth() {
        let mut labels = HashMap::new();
        for i in 0..50 {
            labels.insert(format!("label{i}"), "v".to_string());
        }
        let value = serde_json::json!({"b": 1, "a": {"z": [{"y": 1, "x": "\"q\""}], "c": labels}});
        let first = to_canonical_json(&value).unwrap();
        let text = String::from_utf8(first.clone()).unwrap();
        assert!(
            text.starts_with(r#"{"a":{"c":{"label0":"v","label1":"v","label10":"v""#),
            "{text}"
        );
        assert!(
            text.ends_with(r#""z":[{"x":"\"q\"","y":1}]},"b":1}"#),
            "{text}"
        );
        assert_eq!(to_canonical_json(&value).unwrap(), first);
    }
}
