//! The body of cosign's encrypted private key: the JSON of go-securesystemslib's
//! `encrypted` package, which cosign (1 to 3) puts in its `ENCRYPTED SIGSTORE PRIVATE KEY`
//! PEM block:
//!
//! ```json
//! {"kdf":{"name":"scrypt","params":{"N":65536,"r":8,"p":1},"salt":"<base64>"},
//!  "cipher":{"name":"nacl/secretbox","nonce":"<base64>"},"ciphertext":"<base64>"}
//! ```
//!
//! scrypt turns the password into a 32-byte key, NaCl's secretbox (XSalsa20-Poly1305)
//! opens the ciphertext, and the plaintext is the key's PKCS#8 DER. Checked against files
//! of `cosign generate-key-pair` 3.1.1: 32-byte salt, 24-byte nonce, standard base64 with
//! padding (Go's `[]byte` in JSON), the fields in this order.

use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::{Key, Nonce, XSalsa20Poly1305};
use p256::elliptic_curve::zeroize::Zeroizing;
use serde::{Deserialize, Serialize};

use super::SignError;

/// The scrypt parameters cosign writes (cosign's `GeneratePrivateKey` through
/// go-securesystemslib's `encrypted.Encrypt` with cosign's own, costlier, defaults).
const COSIGN_LOG_N: u8 = 16;
const COSIGN_R: u32 = 8;
const COSIGN_P: u32 = 1;

/// scrypt needs 128 * N * r bytes: a hostile key file must not make it take gigabytes.
/// Twice cosign's own cost (N*r = 2^19, 64 MiB) is accepted, no more.
pub const MAX_N_TIMES_R: u64 = 1 << 20;
/// Each unit of p repeats the whole computation: bounded, so a file cannot cost minutes.
pub const MAX_P: u64 = 16;
/// scrypt also allocates 128·r·p bytes for its p lanes: r is capped too (cosign uses 8),
/// so N·r ≤ 2^20 and r ≤ 32 keep every allocation within 128 MiB + 64 KiB·p.
pub const MAX_R: u64 = 32;

const KDF_NAME: &str = "scrypt";
const CIPHER_NAME: &str = "nacl/secretbox";
const SALT_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;

#[derive(Serialize, Deserialize)]
struct EncryptedKey {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    salt: String,
}

/// Go's JSON reads field names case-insensitively; cosign writes `N`, `r`, `p`.
#[derive(Serialize, Deserialize)]
struct ScryptParams {
    #[serde(rename = "N", alias = "n")]
    n: u64,
    #[serde(alias = "R")]
    r: u64,
    #[serde(alias = "P")]
    p: u64,
}

#[derive(Serialize, Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// Decrypt the JSON `body` of an encrypted key with `password`: the plaintext (PKCS#8
/// DER), wiped when dropped. `what` names the file in errors.
pub fn open(body: &[u8], password: &[u8], what: &str) -> Result<Zeroizing<Vec<u8>>, SignError> {
    let malformed = |detail: String| SignError::EncryptedKey {
        what: what.to_string(),
        detail,
    };
    let document: EncryptedKey = serde_json::from_slice(body)
        .map_err(|error| malformed(format!("its JSON does not parse: {error}")))?;
    if document.kdf.name != KDF_NAME {
        return Err(malformed(format!(
            "its key derivation is `{}`, not `{KDF_NAME}`",
            document.kdf.name
        )));
    }
    if document.cipher.name != CIPHER_NAME {
        return Err(malformed(format!(
            "its cipher is `{}`, not `{CIPHER_NAME}`",
            document.cipher.name
        )));
    }
    let params = scrypt_params(&document.kdf.params, what)?;
    let salt = base64_field(&document.kdf.salt, "kdf.salt", what)?;
    if salt.is_empty() || salt.len() > 1024 {
        return Err(malformed(format!(
            "its salt is {} bytes (cosign writes {SALT_BYTES})",
            salt.len()
        )));
    }
    let nonce = base64_field(&document.cipher.nonce, "cipher.nonce", what)?;
    if nonce.len() != NONCE_BYTES {
        return Err(malformed(format!(
            "its nonce is {} bytes, not {NONCE_BYTES}",
            nonce.len()
        )));
    }
    let ciphertext = base64_field(&document.ciphertext, "ciphertext", what)?;
    let key = derive(password, &salt, &params);
    XSalsa20Poly1305::new(&key)
        .decrypt(Nonce::from_slice(&nonce), ciphertext.as_slice())
        .map(Zeroizing::new)
        .map_err(|_| SignError::WrongPassword {
            what: what.to_string(),
        })
}

/// Encrypt `plaintext` with `password` as cosign does: a fresh salt and nonce, cosign's
/// scrypt cost. Returns the JSON body of the PEM block.
pub fn seal(plaintext: &[u8], password: &[u8]) -> Result<Vec<u8>, SignError> {
    let mut salt = [0u8; SALT_BYTES];
    let mut nonce = [0u8; NONCE_BYTES];
    for buffer in [&mut salt[..], &mut nonce[..]] {
        getrandom::fill(buffer).map_err(|error| SignError::Random(error.to_string()))?;
    }
    let params = scrypt::Params::new(COSIGN_LOG_N, COSIGN_R, COSIGN_P)
        .expect("cosign's scrypt parameters are valid");
    let key = derive(password, &salt, &params);
    let ciphertext = XSalsa20Poly1305::new(&key)
        .encrypt(Nonce::from_slice(&nonce), plaintext)
        .expect("XSalsa20-Poly1305 encrypts any length a key has");
    let document = EncryptedKey {
        kdf: Kdf {
            name: KDF_NAME.to_string(),
            params: ScryptParams {
                n: 1 << COSIGN_LOG_N,
                r: COSIGN_R.into(),
                p: COSIGN_P.into(),
            },
            salt: base64_encode(&salt),
        },
        cipher: Cipher {
            name: CIPHER_NAME.to_string(),
            nonce: base64_encode(&nonce),
        },
        ciphertext: base64_encode(&ciphertext),
    };
    Ok(serde_json::to_vec(&document).expect("the key document serialises"))
}

/// The parameters of a file, refused when malformed or costlier than the caps allow.
fn scrypt_params(params: &ScryptParams, what: &str) -> Result<scrypt::Params, SignError> {
    let too_costly = || SignError::KdfTooCostly {
        what: what.to_string(),
        n: params.n,
        r: params.r,
        p: params.p,
    };
    if params.n < 2 || !params.n.is_power_of_two() || params.r == 0 || params.p == 0 {
        return Err(SignError::EncryptedKey {
            what: what.to_string(),
            detail: format!(
                "its scrypt parameters N={}, r={}, p={} are invalid (N a power of two from 2, r and p from 1)",
                params.n, params.r, params.p
            ),
        });
    }
    let cost = params.n.checked_mul(params.r).ok_or_else(too_costly)?;
    if cost > MAX_N_TIMES_R || params.p > MAX_P || params.r > MAX_R {
        return Err(too_costly());
    }
    // Within the caps every value fits: N <= 2^20, so log2(N) < 64; r, p <= 2^20.
    let log_n = u8::try_from(params.n.trailing_zeros()).map_err(|_| too_costly())?;
    let r = u32::try_from(params.r).map_err(|_| too_costly())?;
    let p = u32::try_from(params.p).map_err(|_| too_costly())?;
    scrypt::Params::new(log_n, r, p).map_err(|_| too_costly())
}

/// The 32-byte secretbox key scrypt derives from the password.
fn derive(password: &[u8], salt: &[u8], params: &scrypt::Params) -> Zeroizing<Key> {
    let mut key = Zeroizing::new(Key::default());
    scrypt::scrypt(password, salt, params, key.as_mut_slice())
        .expect("a 32-byte output is a valid scrypt length");
    key
}

fn base64_field(value: &str, field: &str, what: &str) -> Result<Vec<u8>, SignError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(value)
        .map_err(|error| SignError::EncryptedKey {
            what: what.to_string(),
            detail: format!("`{field}` is not base64: {error}"),
        })
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body in cosign's format with a cheap scrypt, so tests stay fast.
    fn cheap_body(password: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let salt = [7u8; 32];
        let nonce = [9u8; 24];
        let params = scrypt::Params::new(4, 8, 1).unwrap();
        let key = derive(password, &salt, &params);
        let ciphertext = XSalsa20Poly1305::new(&key)
            .encrypt(Nonce::from_slice(&nonce), plaintext)
            .unwrap();
        serde_json::to_vec(&serde_json::json!({
            "kdf": {"name": "scrypt", "params": {"N": 16, "r": 8, "p": 1}, "salt": base64_encode(&salt)},
            "cipher": {"name": "nacl/secretbox", "nonce": base64_encode(&nonce)},
            "ciphertext": base64_encode(&ciphertext),
        }))
        .unwrap()
    }

    #[test]
    fn opens_what_it_sealed_and_refuses_another_password() {
        let body = cheap_body(b"secret", b"plaintext");
        assert_eq!(&*open(&body, b"secret", "k").unwrap(), b"plaintext");
        let error = open(&body, b"other", "k").unwrap_err();
        assert!(matches!(error, SignError::WrongPassword { .. }), "{error}");
        assert!(error
            .to_string()
            .starts_with("could not decrypt `k`: wrong password (COSIGN_PASSWORD)?"));
    }

    #[test]
    fn seal_writes_cosigns_fields_in_cosigns_order() {
        let body = seal(b"x", b"").unwrap();
        let text = String::from_utf8(body.clone()).unwrap();
        assert!(
            text.starts_with(
                r#"{"kdf":{"name":"scrypt","params":{"N":65536,"r":8,"p":1},"salt":""#
            ),
            "{text}"
        );
        assert!(text.contains(r#""cipher":{"name":"nacl/secretbox","nonce":""#));
        assert_eq!(&*open(&body, b"", "k").unwrap(), b"x");
    }

    #[test]
    fn hostile_parameters_are_refused_before_scrypt_runs() {
        let body = |n: u64, r: u64, p: u64| {
            serde_json::to_vec(&serde_json::json!({
                "kdf": {"name": "scrypt", "params": {"N": n, "r": r, "p": p}, "salt": "AAAA"},
                "cipher": {"name": "nacl/secretbox", "nonce": base64_encode(&[0; 24])},
                "ciphertext": "AAAA",
            }))
            .unwrap()
        };
        // 2^40 * 8 * 128 bytes would be 1 PiB; u64::MAX overflows N*r.
        for (n, r, p) in [
            (1 << 40, 8, 1),
            (1 << 20, 8, 1),
            (1 << 16, 8, 17),
            (1 << 63, u64::MAX, 1),
        ] {
            let error = open(&body(n, r, p), b"", "k").unwrap_err();
            assert!(matches!(error, SignError::KdfTooCostly { .. }), "{error}");
        }
        for (n, r, p) in [(0, 8, 1), (3, 8, 1), (16, 0, 1), (16, 8, 0)] {
            let error = open(&body(n, r, p), b"", "k").unwrap_err();
            assert!(error.to_string().contains("are invalid"), "{error}");
        }
    }

    #[test]
    fn malformed_fields_are_named() {
        let mut document: serde_json::Value =
            serde_json::from_slice(&cheap_body(b"", b"x")).unwrap();
        document["cipher"]["nonce"] = "!!".into();
        let error = open(&serde_json::to_vec(&document).unwrap(), b"", "k").unwrap_err();
        assert!(
            error.to_string().contains("`cipher.nonce` is not base64"),
            "{error}"
        );
        document["cipher"]["nonce"] = base64_encode(&[0; 12]).into();
        let error = open(&serde_json::to_vec(&document).unwrap(), b"", "k").unwrap_err();
        assert!(
            error.to_string().contains("nonce is 12 bytes, not 24"),
            "{error}"
        );
        document["cipher"]["name"] = "aes-gcm".into();
        let error = open(&serde_json::to_vec(&document).unwrap(), b"", "k").unwrap_err();
        assert!(error.to_string().contains("cipher is `aes-gcm`"), "{error}");
        let error = open(b"{", b"", "k").unwrap_err();
        assert!(error.to_string().contains("JSON does not parse"), "{error}");
    }
}
