//! The wheel `RECORD` file: a CSV of `path,hash,size` (PyPA "Recording installed
//! projects"), with hashes written as `sha256=<urlsafe base64 without padding>`.

use std::fmt::Write as _;

use crate::digest::Digest;

/// One row of a RECORD file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRow {
    pub path: String,
    pub hash: Option<Digest>,
    pub size: Option<u64>,
}

/// Why a RECORD could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    #[error("line {line}: hash algorithm `{algorithm}` is not supported (only sha256)")]
    UnsupportedHash { line: usize, algorithm: String },
}

const URLSAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Encode bytes as urlsafe base64 without padding (RECORD's hash encoding, PEP 376/427).
pub fn urlsafe_b64_nopad(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let symbols = chunk.len() + 1;
        for i in 0..symbols {
            out.push(URLSAFE[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Decode urlsafe base64 with or without padding.
pub fn decode_urlsafe_b64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut accumulator = 0u32;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = URLSAFE.iter().position(|&s| s == byte)? as u32;
        accumulator = (accumulator << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((accumulator >> bits) as u8);
            accumulator &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be zero padding of the last symbol.
    if accumulator != 0 || bits >= 6 {
        return None;
    }
    Some(out)
}

/// Format a digest as RECORD does: `sha256=...`.
pub fn record_hash(digest: &Digest) -> String {
    format!("sha256={}", urlsafe_b64_nopad(digest.as_bytes()))
}

fn parse_hash(text: &str, line: usize) -> Result<Digest, RecordError> {
    let (algorithm, value) = text.split_once('=').ok_or_else(|| RecordError::Malformed {
        line,
        reason: format!("hash `{text}` is not <algorithm>=<value>"),
    })?;
    if algorithm != "sha256" {
        return Err(RecordError::UnsupportedHash {
            line,
            algorithm: algorithm.to_string(),
        });
    }
    let bytes = decode_urlsafe_b64(value)
        .filter(|bytes| bytes.len() == 32)
        .ok_or_else(|| RecordError::Malformed {
            line,
            reason: format!("`{value}` is not a base64 sha256 digest"),
        })?;
    Digest::from_hex(&hex::encode(bytes)).map_err(|error| RecordError::Malformed {
        line,
        reason: error.to_string(),
    })
}

/// Split one CSV record (RFC 4180 quoting, as Python's csv module writes it).
fn split_csv(line: &str, line_number: usize) -> Result<Vec<String>, RecordError> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_field_start = true;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (false, '"') if at_field_start => quoted = true,
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => {
                quoted = false;
                if !matches!(chars.peek(), None | Some(',')) {
                    return Err(RecordError::Malformed {
                        line: line_number,
                        reason: "text after a closing quote".into(),
                    });
                }
            }
            (false, ',') => {
                fields.push(std::mem::take(&mut field));
                at_field_start = true;
                continue;
            }
            (_, c) => field.push(c),
        }
        at_field_start = false;
    }
    if quoted {
        return Err(RecordError::Malformed {
            line: line_number,
            reason: "unterminated quote".into(),
        });
    }
    fields.push(field);
    Ok(fields)
}

/// Parse a RECORD file. Blank lines are ignored.
pub fn parse_record(text: &str) -> Result<Vec<RecordRow>, RecordError> {
    let mut rows = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let fields = split_csv(raw, line)?;
        if fields.len() != 3 {
            return Err(RecordError::Malformed {
                line,
                reason: format!("expected 3 fields (path,hash,size), found {}", fields.len()),
            });
        }
        let hash = if fields[1].is_empty() {
            None
        } else {
            Some(parse_hash(&fields[1], line)?)
        };
        let size = if fields[2].is_empty() {
            None
        } else {
            Some(fields[2].parse().map_err(|_| RecordError::Malformed {
                line,
                reason: format!("size `{}` is not a number", fields[2]),
            })?)
        };
        rows.push(RecordRow {
            path: fields[0].clone(),
            hash,
            size,
        });
    }
    Ok(rows)
}

fn csv_field(out: &mut String, text: &str) {
    if text.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&text.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(text);
    }
}

/// Write rows as RECORD text (`\n` line ends, the rows in the order given).
pub fn write_record(rows: &[RecordRow]) -> String {
    let mut out = String::new();
    for row in rows {
        csv_field(&mut out, &row.path);
        out.push(',');
        if let Some(hash) = &row.hash {
            out.push_str(&record_hash(hash));
        }
        out.push(',');
        if let Some(size) = row.size {
            let _ = write!(out, "{size}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_python() {
        // python3 -c "import base64,hashlib;print(base64.urlsafe_b64encode(hashlib.sha256(b'').digest()).rstrip(b'='))"
        assert_eq!(
            record_hash(&Digest::of_bytes(b"")),
            "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        for input in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
            let encoded = urlsafe_b64_nopad(input);
            assert_eq!(decode_urlsafe_b64(&encoded).unwrap(), input);
        }
        assert_eq!(urlsafe_b64_nopad(b"fooba"), "Zm9vYmE");
        assert!(decode_urlsafe_b64("Zm9vYmE+").is_none());
    }

    #[test]
    fn record_round_trip_with_quoting() {
        let text = "pkg/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n\"pkg/a,b.py\",,\npkg-1.0.dist-info/RECORD,,\n";
        let rows = parse_record(text).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].hash, Some(Digest::of_bytes(b"")));
        assert_eq!(rows[0].size, Some(0));
        assert_eq!(rows[1].path, "pkg/a,b.py");
        assert_eq!(write_record(&rows), text);
    }

    #[test]
    fn record_errors_name_the_line() {
        assert_eq!(
            parse_record("a,md5=xx,1\n").unwrap_err(),
            RecordError::UnsupportedHash {
                line: 1,
                algorithm: "md5".into()
            }
        );
        assert!(matches!(
            parse_record("ok,,\nbad\n").unwrap_err(),
            RecordError::Malformed { line: 2, .. }
        ));
    }
}
