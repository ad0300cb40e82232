//! ECDSA P-256 keys in the files cosign uses.
//!
//! A private key is read from cosign's `ENCRYPTED SIGSTORE PRIVATE KEY` PEM block (cosign 2
//! and 3; `ENCRYPTED COSIGN PRIVATE KEY` from cosign 1, same body, see [`super::encrypted`])
//! or from an unencrypted PKCS#8 `PRIVATE KEY`; [`SigningKey::to_encrypted_pem`] writes
//! cosign's format back, so `cosign sign-blob --key` takes a key `cudastack key generate`
//! made. A public key is an SPKI `PUBLIC KEY` PEM block, cosign's `cosign.pub`.
//!
//! Signatures are ECDSA over SHA-256, ASN.1 DER encoded: what cosign writes and verifies
//! and what DSSE verifiers (securesystemslib's `ecdsa-sha2-nistp256`) expect. Signing is
//! deterministic (RFC 6979), so the same key and bytes give the same signature.

use std::fmt;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::DerSignature;
use p256::elliptic_curve::zeroize::Zeroizing;
use p256::elliptic_curve::Generate;
use p256::pkcs8::der::Decode;
use p256::pkcs8::spki::{AlgorithmIdentifierRef, SubjectPublicKeyInfoRef};
use p256::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, ObjectIdentifier,
    PrivateKeyInfoRef,
};
use sha2::{Digest as _, Sha256};

use super::{encrypted, SignError, MAKE_A_KEY, PASSWORD_VARIABLE};

/// The PEM label cosign 2 and 3 write for an encrypted private key.
pub const SIGSTORE_PRIVATE_KEY_LABEL: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
/// The label cosign 1 wrote; the body is the same.
pub const COSIGN_PRIVATE_KEY_LABEL: &str = "ENCRYPTED COSIGN PRIVATE KEY";
const PKCS8_LABEL: &str = "PRIVATE KEY";
const PUBLIC_KEY_LABEL: &str = "PUBLIC KEY";

/// A key file is a few hundred bytes; anything past this is not one.
pub const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");

/// An ECDSA P-256 private key. Its `Debug` shows the key id, never the secret.
#[derive(Clone)]
pub struct SigningKey {
    inner: p256::ecdsa::SigningKey,
}

/// An ECDSA P-256 public key (what verifies; what `inspect` names by [`PublicKey::key_id`]).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    inner: p256::ecdsa::VerifyingKey,
}

/// Where a key comes from, spelt as cosign spells `--key`: a file path, or `env://NAME`
/// for the PEM text in an environment variable (a CI secret that never touches the disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    File(PathBuf),
    Env(String),
}

/// The prefix of a key held in an environment variable (cosign's).
pub const ENV_PREFIX: &str = "env://";

impl KeySource {
    /// `env://NAME` or a path (any other text, `env://` only as a prefix).
    pub fn parse(text: &std::ffi::OsStr) -> Self {
        match text.to_str().and_then(|text| text.strip_prefix(ENV_PREFIX)) {
            Some(name) => KeySource::Env(name.to_string()),
            None => KeySource::File(PathBuf::from(text)),
        }
    }

    /// The key's PEM text and how errors name it, within [`MAX_KEY_FILE_BYTES`].
    fn read_text(&self) -> Result<(String, String), SignError> {
        match self {
            KeySource::File(path) => Ok((read_key_file(path)?, path.display().to_string())),
            KeySource::Env(name) => {
                let what = format!("{ENV_PREFIX}{name}");
                let value = std::env::var_os(name)
                    .ok_or_else(|| SignError::KeyVariableUnset { name: name.clone() })?;
                if value.len() as u64 > MAX_KEY_FILE_BYTES {
                    return Err(SignError::TooLarge {
                        what,
                        kind: "a key",
                        size: value.len() as u64,
                        limit: MAX_KEY_FILE_BYTES,
                        hint: "the variable should hold the PEM text of cosign.key or cosign.pub",
                    });
                }
                let text = value.into_string().map_err(|_| SignError::NotPem {
                    what: what.clone(),
                    detail: "it is not text (UTF-8)".to_string(),
                })?;
                Ok((text, what))
            }
        }
    }
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::File(path) => write!(f, "{}", path.display()),
            KeySource::Env(name) => write!(f, "{ENV_PREFIX}{name}"),
        }
    }
}

impl SigningKey {
    /// A new random key from the system's generator.
    pub fn generate() -> Result<Self, SignError> {
        let inner = p256::ecdsa::SigningKey::try_generate()
            .map_err(|error| SignError::Random(error.to_string()))?;
        Ok(Self { inner })
    }

    /// Read a private key file: cosign's encrypted key (decrypted with `password`) or an
    /// unencrypted PKCS#8 key (the password is not used).
    pub fn read(path: &Path, password: &[u8]) -> Result<Self, SignError> {
        let text = read_key_file(path)?;
        Self::from_pem(&text, password, &path.display().to_string())
    }

    /// Read a private key from a file or an environment variable ([`KeySource`]).
    pub fn load(source: &KeySource, password: &[u8]) -> Result<Self, SignError> {
        let (text, what) = source.read_text()?;
        Self::from_pem(&text, password, &what)
    }

    /// A private key from PEM text; `what` names where it came from in errors.
    pub fn from_pem(text: &str, password: &[u8], what: &str) -> Result<Self, SignError> {
        let (label, body) = decode_pem(text, what)?;
        let der = match label.as_str() {
            SIGSTORE_PRIVATE_KEY_LABEL | COSIGN_PRIVATE_KEY_LABEL => {
                encrypted::open(&body, password, what)?
            }
            PKCS8_LABEL => Zeroizing::new(body),
            _ => return Err(wrong_private_block(what, label)),
        };
        check_algorithm(
            PrivateKeyInfoRef::from_der(&der).map(|info| info.algorithm),
            what,
        )?;
        let inner = p256::ecdsa::SigningKey::from_pkcs8_der(&der).map_err(|error| {
            SignError::InvalidKey {
                what: what.to_string(),
                detail: error.to_string(),
            }
        })?;
        Ok(Self { inner })
    }

    /// This key in cosign's encrypted format (`ENCRYPTED SIGSTORE PRIVATE KEY`, scrypt with
    /// cosign's cost), which cosign 2 and 3 read with `COSIGN_PASSWORD`.
    pub fn to_encrypted_pem(&self, password: &[u8]) -> Result<String, SignError> {
        let der = self
            .inner
            .to_pkcs8_der()
            .expect("a P-256 key encodes as PKCS#8");
        let body = encrypted::seal(der.as_bytes(), password)?;
        Ok(encode_pem(SIGSTORE_PRIVATE_KEY_LABEL, &body))
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            inner: *self.inner.verifying_key(),
        }
    }

    /// ECDSA-SHA256 signature of `message`, ASN.1 DER (RFC 6979 nonces: deterministic).
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let signature: DerSignature = self.inner.sign(message);
        signature.as_bytes().to_vec()
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("key_id", &self.public_key().key_id())
            .finish_non_exhaustive()
    }
}

impl PublicKey {
    /// Read a public key file (`cosign.pub`: SPKI in a `PUBLIC KEY` PEM block).
    pub fn read(path: &Path) -> Result<Self, SignError> {
        let text = read_key_file(path)?;
        Self::from_pem_named(&text, &path.display().to_string())
    }

    /// Read a public key from a file or an environment variable ([`KeySource`]).
    pub fn load(source: &KeySource) -> Result<Self, SignError> {
        let (text, what) = source.read_text()?;
        Self::from_pem_named(&text, &what)
    }

    /// A public key from PEM text.
    pub fn from_pem(text: &str) -> Result<Self, SignError> {
        Self::from_pem_named(text, "the public key text")
    }

    fn from_pem_named(text: &str, what: &str) -> Result<Self, SignError> {
        let (label, body) = decode_pem(text, what)?;
        if label != PUBLIC_KEY_LABEL {
            return Err(wrong_public_block(what, label));
        }
        Self::from_der(&body, what)
    }

    /// A public key from its SPKI DER.
    pub fn from_der(der: &[u8], what: &str) -> Result<Self, SignError> {
        check_algorithm(
            SubjectPublicKeyInfoRef::from_der(der).map(|info| info.algorithm),
            what,
        )?;
        let inner = p256::ecdsa::VerifyingKey::from_public_key_der(der).map_err(|error| {
            SignError::InvalidKey {
                what: what.to_string(),
                detail: error.to_string(),
            }
        })?;
        Ok(Self { inner })
    }

    /// SPKI DER, the bytes [`PublicKey::key_id`] hashes.
    pub fn to_der(&self) -> Vec<u8> {
        self.inner
            .to_public_key_der()
            .expect("a P-256 key encodes as SPKI")
            .into_vec()
    }

    /// The PEM text cosign writes to `cosign.pub` (64 columns, LF, a final newline).
    pub fn to_pem(&self) -> String {
        encode_pem(PUBLIC_KEY_LABEL, &self.to_der())
    }

    /// A stable name of the key: the hex sha256 of its SPKI DER. It does not depend on how
    /// the PEM was wrapped, and it is what cosign hints a bundle's signer by (in base64).
    pub fn key_id(&self) -> String {
        hex::encode(Sha256::digest(self.to_der()))
    }

    /// Verify an ECDSA-SHA256 DER signature of `message` (high and low S alike, as Go's
    /// `ecdsa.VerifyASN1` does: cosign's signatures are not normalised).
    pub fn verify(&self, message: &[u8], signature_der: &[u8]) -> Result<(), SignError> {
        let signature = DerSignature::try_from(signature_der).map_err(|error| {
            SignError::MalformedSignature {
                detail: error.to_string(),
            }
        })?;
        self.inner
            .verify(message, &signature)
            .map_err(|_| SignError::BadSignature {
                key_id: self.key_id(),
            })
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey")
            .field("key_id", &self.key_id())
            .finish()
    }
}

/// The password of a private key: `COSIGN_PASSWORD`, as bytes (not necessarily UTF-8),
/// wiped when dropped. An empty value is a valid (empty) password, as in cosign; an unset
/// variable is an error, since cudastack never prompts.
pub fn password_from_env() -> Result<Zeroizing<Vec<u8>>, SignError> {
    std::env::var_os(PASSWORD_VARIABLE)
        .map(|value| Zeroizing::new(value.as_bytes().to_vec()))
        .ok_or(SignError::PasswordUnset)
}

/// The files [`write_key_pair`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeyPairFiles {
    pub private_key: PathBuf,
    pub public_key: PathBuf,
    pub key_id: String,
}

/// Generate a key pair and write `PREFIX.key` (cosign's encrypted format, mode 0600) and
/// `PREFIX.pub`, each atomically and never over an existing file.
pub fn write_key_pair(prefix: &Path, password: &[u8]) -> Result<KeyPairFiles, SignError> {
    let with_extension = |extension: &str| {
        let mut path = prefix.as_os_str().to_owned();
        path.push(extension);
        PathBuf::from(path)
    };
    let files = KeyPairFiles {
        private_key: with_extension(".key"),
        public_key: with_extension(".pub"),
        key_id: String::new(),
    };
    for path in [&files.private_key, &files.public_key] {
        if path.symlink_metadata().is_ok() {
            return Err(SignError::Exists { path: path.clone() });
        }
    }
    let key = SigningKey::generate()?;
    let private_pem = key.to_encrypted_pem(password)?;
    let public_key = key.public_key();
    write_new(&files.private_key, private_pem.as_bytes(), Secrecy::Private)?;
    let public_pem = public_key.to_pem();
    if let Err(error) = write_new(&files.public_key, public_pem.as_bytes(), Secrecy::Public) {
        // Half a pair is no pair: take back the private key this call wrote.
        let _ = std::fs::remove_file(&files.private_key);
        return Err(error);
    }
    Ok(KeyPairFiles {
        key_id: public_key.key_id(),
        ..files
    })
}

/// Who may read a key file: the owner alone (0600, as cosign writes cosign.key), or
/// anyone the umask allows (cosign.pub).
#[derive(Clone, Copy)]
enum Secrecy {
    Private,
    Public,
}

/// Write a new file whole (temp file, synced, linked into place only if the name is still
/// free), so a reader never sees half a key and a race never overwrites one.
fn write_new(path: &Path, bytes: &[u8], secrecy: Secrecy) -> Result<(), SignError> {
    use std::io::Write as _;
    let write_error = |source| SignError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp = match secrecy {
        // tempfile creates 0600 files: the private key is never readable by others.
        Secrecy::Private => tempfile::Builder::new()
            .prefix(".tmp-key-")
            .tempfile_in(dir),
        Secrecy::Public => crate::atomic_file::temp_in(dir, ".tmp-key-"),
    }
    .map_err(write_error)?;
    temp.write_all(bytes).map_err(write_error)?;
    temp.as_file().sync_all().map_err(write_error)?;
    temp.persist_noclobber(path).map_err(|error| {
        if error.error.kind() == std::io::ErrorKind::AlreadyExists {
            SignError::Exists {
                path: path.to_path_buf(),
            }
        } else {
            write_error(error.error)
        }
    })?;
    Ok(())
}

/// A key file's text, refused past [`MAX_KEY_FILE_BYTES`] before it is read whole.
fn read_key_file(path: &Path) -> Result<String, SignError> {
    let read_error = |source| SignError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    refuse_devices(&file, path)?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    let what = path.display().to_string();
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        // A pipe has no size: it gave at least the bytes read.
        let size = std::fs::metadata(path)
            .ok()
            .filter(|meta| meta.is_file())
            .map_or(bytes.len() as u64, |meta| meta.len());
        return Err(SignError::TooLarge {
            what,
            kind: "a key file",
            size,
            limit: MAX_KEY_FILE_BYTES,
            hint: "give the cosign.key or cosign.pub file itself, not an archive or a log",
        });
    }
    String::from_utf8(bytes).map_err(|_| SignError::NotPem {
        what,
        detail: "it is not text (UTF-8)".to_string(),
    })
}

/// A device (`/dev/zero`) or a socket is no key: say so rather than "0 bytes, more than
/// the limit". A pipe stays allowed (`--key <(vault read ...)`); the read is
/// bounded all the same.
fn refuse_devices(file: &std::fs::File, path: &Path) -> Result<(), SignError> {
    use std::os::unix::fs::FileTypeExt;
    let file_type = file
        .metadata()
        .map_err(|source| SignError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .file_type();
    let kind = if file_type.is_char_device() || file_type.is_block_device() {
        "device"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_dir() {
        "directory"
    } else {
        return Ok(());
    };
    Err(SignError::NotAFile {
        path: path.to_path_buf(),
        kind,
    })
}

/// The one PEM block of `text`: its label and decoded body.
fn decode_pem(text: &str, what: &str) -> Result<(String, Vec<u8>), SignError> {
    let trimmed = text.trim();
    if !trimmed.starts_with("-----BEGIN ") {
        return Err(SignError::NotPem {
            what: what.to_string(),
            detail: "it does not start with a `-----BEGIN ...-----` line".to_string(),
        });
    }
    // The parser wants the final line ending a file normally has.
    let block = format!("{trimmed}\n");
    let (label, body) =
        pem_rfc7468::decode_vec(block.as_bytes()).map_err(|error| SignError::NotPem {
            what: what.to_string(),
            detail: format!("its PEM block does not decode: {error}"),
        })?;
    Ok((label.to_string(), body))
}

fn encode_pem(label: &str, body: &[u8]) -> String {
    pem_rfc7468::encode_string(label, pem_rfc7468::LineEnding::LF, body)
        .expect("PEM encoding of a known label cannot fail")
}

fn wrong_private_block(what: &str, found: String) -> SignError {
    let hint = match found.as_str() {
        PUBLIC_KEY_LABEL => "this is a public key; signing needs the private key (cosign.key)".to_string(),
        "EC PRIVATE KEY" | "ENCRYPTED PRIVATE KEY" => format!(
            "`cosign import-key-pair --key {what}` converts it into cosign's format (it asks for {PASSWORD_VARIABLE})"
        ),
        _ => MAKE_A_KEY.to_string(),
    };
    SignError::WrongBlock {
        what: what.to_string(),
        found,
        expected: "a private key (`ENCRYPTED SIGSTORE PRIVATE KEY` from cosign, or a PKCS#8 `PRIVATE KEY`)",
        hint,
    }
}

fn wrong_public_block(what: &str, found: String) -> SignError {
    let hint = if found.contains("PRIVATE KEY") {
        format!("this is a private key; verifying needs its public key (cosign.pub), which `cudastack key public {what}` prints")
    } else {
        MAKE_A_KEY.to_string()
    };
    SignError::WrongBlock {
        what: what.to_string(),
        found,
        expected: "a public key (`PUBLIC KEY`, as in cosign.pub)",
        hint,
    }
}

/// Refuse any key but ECDSA on P-256, naming what it is instead.
fn check_algorithm(
    algorithm: Result<AlgorithmIdentifierRef<'_>, p256::pkcs8::der::Error>,
    what: &str,
) -> Result<(), SignError> {
    let algorithm = algorithm.map_err(|error| SignError::InvalidKey {
        what: what.to_string(),
        detail: format!("its DER does not parse: {error}"),
    })?;
    let curve = algorithm.parameters_oid().ok();
    if algorithm.oid == EC_PUBLIC_KEY && curve == Some(P256) {
        return Ok(());
    }
    Err(SignError::UnsupportedKey {
        what: what.to_string(),
        algorithm: describe_algorithm(algorithm.oid, curve),
    })
}

/// Key algorithms a user is likely to hold, by name (with an article, for the message).
fn describe_algorithm(oid: ObjectIdentifier, curve: Option<ObjectIdentifier>) -> String {
    let curve_name = curve.map(|curve| match curve.to_string().as_str() {
        "1.3.132.0.34" => "P-384".to_string(),
        "1.3.132.0.35" => "P-521".to_string(),
        "1.3.132.0.10" => "secp256k1".to_string(),
        other => format!("the curve {other}"),
    });
    match (oid.to_string().as_str(), curve_name) {
        ("1.2.840.10045.2.1", Some(curve)) => format!("an ECDSA {curve}"),
        ("1.2.840.113549.1.1.1", _) => "an RSA".to_string(),
        ("1.3.101.112", _) => "an Ed25519".to_string(),
        (other, _) => format!("an {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_and_fail_on_a_flipped_byte() {
        let key = SigningKey::generate().unwrap();
        let public = key.public_key();
        let signature = key.sign(b"message");
        public.verify(b"message", &signature).unwrap();
        assert_eq!(signature, key.sign(b"message"), "RFC 6979 is deterministic");
        let error = public.verify(b"messagf", &signature).unwrap_err();
        assert!(matches!(error, SignError::BadSignature { .. }), "{error}");
        let other = SigningKey::generate().unwrap().public_key();
        assert!(other.verify(b"message", &signature).is_err());
        for index in 0..signature.len() {
            let mut flipped = signature.clone();
            flipped[index] ^= 0x01;
            assert!(public.verify(b"message", &flipped).is_err(), "byte {index}");
        }
    }

    #[test]
    fn a_public_key_round_trips_through_pem_and_keeps_its_id() {
        let public = SigningKey::generate().unwrap().public_key();
        let pem = public.to_pem();
        assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"), "{pem}");
        assert!(pem.ends_with("-----END PUBLIC KEY-----\n"), "{pem}");
        let again = PublicKey::from_pem(&pem).unwrap();
        assert_eq!(again, public);
        assert_eq!(again.key_id(), public.key_id());
        assert_eq!(public.key_id().len(), 64);
        // A CRLF copy is the same key.
        let crlf = pem.replace('\n', "\r\n");
        assert_eq!(PublicKey::from_pem(&crlf).unwrap(), public);
    }

    #[test]
    fn a_private_key_round_trips_through_cosigns_format() {
        let key = SigningKey::generate().unwrap();
        let pem = key.to_encrypted_pem(b"pw").unwrap();
        assert!(pem.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"));
        let again = SigningKey::from_pem(&pem, b"pw", "k").unwrap();
        assert_eq!(again.public_key(), key.public_key());
        let error = SigningKey::from_pem(&pem, b"pW", "cosign.key").unwrap_err();
        assert!(error
            .to_string()
            .starts_with("could not decrypt `cosign.key`: wrong password (COSIGN_PASSWORD)?"));
        // cosign 1's label carries the same body.
        let old = pem.replace("SIGSTORE", "COSIGN");
        assert_eq!(
            SigningKey::from_pem(&old, b"pw", "k").unwrap().public_key(),
            key.public_key()
        );
    }

    #[test]
    fn unencrypted_pkcs8_is_accepted() {
        let key = SigningKey::generate().unwrap();
        let der = key.inner.to_pkcs8_der().unwrap();
        let pem = encode_pem("PRIVATE KEY", der.as_bytes());
        let again = SigningKey::from_pem(&pem, b"ignored", "k").unwrap();
        assert_eq!(again.public_key(), key.public_key());
    }

    #[test]
    fn the_wrong_kind_of_block_says_which_file_to_give() {
        let key = SigningKey::generate().unwrap();
        let public_pem = key.public_key().to_pem();
        let error = SigningKey::from_pem(&public_pem, b"", "cosign.pub").unwrap_err();
        assert!(
            error.to_string().contains("signing needs the private key"),
            "{error}"
        );
        let private_pem = key.to_encrypted_pem(b"").unwrap();
        let error = PublicKey::from_pem_named(&private_pem, "cosign.key").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`cudastack key public cosign.key`"),
            "{error}"
        );
        let ec = encode_pem("EC PRIVATE KEY", b"x");
        let error = SigningKey::from_pem(&ec, b"", "ec.pem").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("cosign import-key-pair --key ec.pem"),
            "{error}"
        );
    }

    #[test]
    fn other_algorithms_are_named_and_refused() {
        // Keys made with Python's `cryptography`: the public halves of a P-384 and an
        // Ed25519 key, and a P-384 private key.
        let p384 = "-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEBadOv1qsYU3DYgcHM6/lXuwAMRimu1uY
fBwTDTudIi4B3heJAy2RejFaZwE2vD+4viJR/ugih519VkqUtvY7be9EXJKa5uXt
lTvHC7WpFwn5IkGQyesnqnDlpA/teTzk
-----END PUBLIC KEY-----
";
        let ed25519 = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEA5KD1+u1NbrKFdzpRkPhk/H/5tu1iAZc6ohsk8JaxG+o=
-----END PUBLIC KEY-----
";
        for (pem, name) in [(p384, "an ECDSA P-384 key"), (ed25519, "an Ed25519 key")] {
            let error = PublicKey::from_pem(pem).unwrap_err();
            assert!(matches!(error, SignError::UnsupportedKey { .. }), "{error}");
            assert!(error.to_string().contains(name), "{error}");
        }
        let p384_private = "-----BEGIN PRIVATE KEY-----
MIG2AgEAMBAGByqGSM49AgEGBSuBBAAiBIGeMIGbAgEBBDBmIEI5OOenG9Jt76WZ
EKyazJ7gyH47AU2VYsH+vx2eTUw9CHPmS0cs4OVw0s0WWgWhZANiAAQVqbD1cwm8
TWPGYAbFT0Z89i7A8bFePqyTG01o3G1N7Zv75cmFpUScyKXifBuhx7nyLoP0SrdP
x5z6acxoPDxmWOcHkiG8pBCdC+Qm6CVYL6gl7I7Y2donsC7lmXDCtS8=
-----END PRIVATE KEY-----
";
        let error = SigningKey::from_pem(p384_private, b"", "p384.key").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("`p384.key` is an ECDSA P-384 key; cudastack signs"),
            "{error}"
        );
    }

    #[test]
    fn truncated_and_garbled_pem_give_precise_errors() {
        let pem = SigningKey::generate().unwrap().public_key().to_pem();
        let cases = [
            ("", "does not start with a `-----BEGIN"),
            ("hello", "does not start with a `-----BEGIN"),
            (&pem[..pem.len() - 10], "its PEM block does not decode"),
            (&pem[..40], "its PEM block does not decode"),
        ];
        for (text, expected) in cases {
            let error = PublicKey::from_pem(text).unwrap_err();
            assert!(error.to_string().contains(expected), "{text:?}: {error}");
        }
        let garbled = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        let error = PublicKey::from_pem(garbled).unwrap_err();
        assert!(
            error.to_string().contains("its DER does not parse"),
            "{error}"
        );
    }

    #[test]
    fn key_sources_are_paths_or_environment_variables() {
        use std::ffi::OsStr;
        assert_eq!(
            KeySource::parse(OsStr::new("env://SIGNING_KEY")),
            KeySource::Env("SIGNING_KEY".into())
        );
        assert_eq!(
            KeySource::parse(OsStr::new("keys/env://x")),
            KeySource::File("keys/env://x".into())
        );
        let unset = KeySource::Env("CUDASTACK_TEST_UNSET_KEY_VARIABLE".into());
        let error = PublicKey::load(&unset).unwrap_err();
        assert!(
            error.to_string().starts_with(
                "the environment variable CUDASTACK_TEST_UNSET_KEY_VARIABLE (from `env://CUDASTACK_TEST_UNSET_KEY_VARIABLE`) is not set"
            ),
            "{error}"
        );
    }

    #[test]
    fn oversized_key_files_are_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.key");
        std::fs::write(&path, vec![b'A'; 1 << 20]).unwrap();
        let error = SigningKey::read(&path, b"").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("1048576 bytes, more than the 65536 bytes"),
            "{error}"
        );
        let error = PublicKey::read(&dir.path().join("missing.pub")).unwrap_err();
        assert!(error.to_string().contains("missing.pub"), "{error}");
    }

    #[test]
    fn a_key_from_a_device_is_said_to_be_no_file() {
        // "/dev/zero is 0 bytes, more than the 65536 bytes" before.
        let error = SigningKey::read(Path::new("/dev/zero"), b"").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("is a device, not a regular file"),
            "{error}"
        );
        let error = PublicKey::read(Path::new("/dev/null")).unwrap_err();
        assert!(error.to_string().contains("is a device"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let error = PublicKey::read(dir.path()).unwrap_err();
        assert!(error.to_string().contains("is a directory"), "{error}");
    }

    #[test]
    fn a_key_pair_is_written_once_private_key_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("release");
        let files = write_key_pair(&prefix, b"pw").unwrap();
        let mode = std::fs::metadata(&files.private_key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = std::fs::metadata(&files.public_key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o044, 0o044 & !current_umask(), "{mode:o}");
        let key = SigningKey::read(&files.private_key, b"pw").unwrap();
        let public = PublicKey::read(&files.public_key).unwrap();
        assert_eq!(key.public_key(), public);
        assert_eq!(files.key_id, public.key_id());
        let before = std::fs::read(&files.private_key).unwrap();
        let error = write_key_pair(&prefix, b"pw").unwrap_err();
        assert!(matches!(error, SignError::Exists { .. }), "{error}");
        assert_eq!(std::fs::read(&files.private_key).unwrap(), before);
        // Only the public key present: still refused, and no private key appears.
        std::fs::remove_file(&files.private_key).unwrap();
        assert!(write_key_pair(&prefix, b"pw").is_err());
        assert!(!files.private_key.exists());
    }

    fn current_umask() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
        u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
    }
}
