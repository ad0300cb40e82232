//! `ca_certificates:`: a site's own certificate authorities (the root of a TLS-inspecting
//! corporate proxy, of a private index or registry), trusted by everything in the image.
//!
//! Each file is read from the recipe's directory and checked here, when the recipe is
//! resolved, so `validate` refuses what `build` would: PEM certificates only, each one a
//! certificate authority (not a server's own certificate, which would trust nothing it did
//! not itself sign), valid now, and no private key beside them (a key exported with its
//! certificate must never reach an image). What the image gets is the certificates alone,
//! re-encoded: the config layer adds them to the trust store (`stack::layers::trust`).

use std::fmt;
use std::path::{Component, Path};
use std::str::FromStr;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::BasicConstraints;
use x509_cert::Certificate;

use crate::contained_file::ContainedFile;
use crate::reference::escape;

/// The largest certificate file read: a bundle of a few hundred roots is ~200 KiB.
pub const MAX_CA_FILE: u64 = 1024 * 1024;

/// One `ca_certificates:` entry: a PEM file relative to the recipe's directory, which it may
/// not leave (its bytes go into the image, as `copy:`'s do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPath(String);

impl CaPath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The name the file gets in the image's local CA directory: its own name, ending in
    /// `.crt` (update-ca-certificates reads only those).
    pub fn image_name(&self) -> String {
        let stem = Path::new(&self.0)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("ca");
        format!("{stem}.crt")
    }
}

impl FromStr for CaPath {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let path = Path::new(text);
        if text.trim().is_empty() {
            return Err("a `ca_certificates` entry is empty; give a PEM file relative to the recipe's directory, such as `certs/corp-root.pem`".into());
        }
        if path.is_absolute() || text.starts_with('~') {
            return Err(format!("`ca_certificates: {}` is an absolute path; give it relative to the recipe's directory, so the recipe means the same on every build host", escape(text)));
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(format!("`ca_certificates: {}` leaves the recipe's directory with `..`; its bytes go into the image, and a recipe puts in images only what lies beside it", escape(text)));
        }
        if !path.components().any(|c| matches!(c, Component::Normal(_))) {
            return Err(format!(
                "`ca_certificates: {}` names a directory; give the PEM file itself",
                escape(text)
            ));
        }
        Ok(CaPath(text.to_string()))
    }
}

impl fmt::Display for CaPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for CaPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for CaPath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Two entries whose files would get the same name in the image.
pub fn check_names(paths: &[CaPath]) -> Result<(), String> {
    let mut seen = std::collections::BTreeMap::new();
    for path in paths {
        if let Some(first) = seen.insert(path.image_name(), path) {
            return Err(format!(
                "`ca_certificates` has `{first}` and `{path}`, which would both be {} in the image; rename one",
                path.image_name()
            ));
        }
    }
    Ok(())
}

/// One file's certificates, checked, as the image gets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaFile {
    pub path: CaPath,
    /// Every certificate's subject, in the file's order.
    pub subjects: Vec<String>,
    /// The certificates alone, each re-encoded as PEM (LF line ends).
    pub pem: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// Not a regular file below the recipe's directory, a link, too large, unreadable.
    #[error("`ca_certificates: {path}`: {source}")]
    Read {
        path: CaPath,
        source: crate::contained_file::ContainedError,
    },
    #[error("`ca_certificates: {path}` holds no PEM certificate (`-----BEGIN CERTIFICATE-----`); a DER (binary) certificate converts with `openssl x509 -inform der -in {path} -out {path}.pem`")]
    NoCertificate { path: CaPath },
    #[error("`ca_certificates: {path}` holds a private key (`{label}`); a key must never go into an image: keep the certificate alone (`openssl x509 -in {path} -out ca.pem`)")]
    PrivateKey { path: CaPath, label: String },
    #[error("`ca_certificates: {path}` holds a `{label}` block; give only CERTIFICATE blocks (a `TRUSTED CERTIFICATE` converts with `openssl x509 -in {path} -out ca.pem`)")]
    OtherBlock { path: CaPath, label: String },
    #[error("`ca_certificates: {path}`: certificate {index} is not valid PEM or X.509: {message}")]
    Malformed {
        path: CaPath,
        index: usize,
        message: String,
    },
    #[error("`ca_certificates: {path}`: `{subject}` is not a certificate authority ({why}); it is a server's own certificate, which vouches for no other: give the CA that issued it (`{issuer}`)")]
    NotCa {
        path: CaPath,
        subject: String,
        issuer: String,
        why: &'static str,
    },
    #[error("`ca_certificates: {path}`: `{subject}` is valid only from {days} days ahead; every TLS client refuses it until then (check this host's clock, or the certificate's dates)")]
    NotYetValid {
        path: CaPath,
        subject: String,
        days: u64,
    },
    #[error("`ca_certificates: {path}`: `{subject}` expired {days} days ago; every TLS client refuses what it signed, so get the authority's current certificate")]
    Expired {
        path: CaPath,
        subject: String,
        days: u64,
    },
}

/// Read and check every file of `paths`, relative to the recipe's directory `context`, at
/// `now` (for expiry).
pub fn read_all(context: &Path, paths: &[CaPath], now: SystemTime) -> Result<Vec<CaFile>, CaError> {
    paths.iter().map(|path| read(context, path, now)).collect()
}

/// Read below the recipe's directory without following a link (contained_file): a recipe
/// from a pull request cannot name a host file through one.
fn read(context: &Path, path: &CaPath, now: SystemTime) -> Result<CaFile, CaError> {
    let read_error = |source| CaError::Read {
        path: path.clone(),
        source,
    };
    let bytes = ContainedFile::open(context, Path::new(path.as_str()))
        .and_then(|file| file.read_to_vec(MAX_CA_FILE))
        .map_err(read_error)?;
    parse(path, &bytes, now)
}

/// The certificates of one PEM file, checked.
pub fn parse(path: &CaPath, bytes: &[u8], now: SystemTime) -> Result<CaFile, CaError> {
    let text = String::from_utf8_lossy(bytes);
    let mut file = CaFile {
        path: path.clone(),
        subjects: Vec::new(),
        pem: String::new(),
    };
    for (index, block) in pem_blocks(&text).into_iter().enumerate() {
        let malformed = |message: String| CaError::Malformed {
            path: path.clone(),
            index: index + 1,
            message,
        };
        // The label first, so a key is named as one whatever its base64's width.
        let label =
            label_of(&block).ok_or_else(|| malformed("no `-----BEGIN ...-----` line".into()))?;
        match label {
            "CERTIFICATE" => {}
            label if label.contains("PRIVATE KEY") => {
                return Err(CaError::PrivateKey {
                    path: path.clone(),
                    label: label.to_string(),
                })
            }
            label => {
                return Err(CaError::OtherBlock {
                    path: path.clone(),
                    label: label.to_string(),
                })
            }
        }
        let der = decode_any_width(&block).map_err(|e| malformed(e.to_string()))?;
        let certificate = Certificate::from_der(&der).map_err(|e| malformed(e.to_string()))?;
        check_authority(path, index + 1, &certificate, now)?;
        // Re-encoded from the parsed DER: the image gets the certificate, not the
        // file's other text.
        let der = certificate.to_der().map_err(|e| malformed(e.to_string()))?;
        let pem = pem_rfc7468::encode_string("CERTIFICATE", pem_rfc7468::LineEnding::LF, &der)
            .map_err(|e| malformed(e.to_string()))?;
        file.subjects
            .push(certificate.tbs_certificate().subject().to_string());
        file.pem.push_str(&pem);
    }
    if file.subjects.is_empty() {
        return Err(CaError::NoCertificate { path: path.clone() });
    }
    Ok(file)
}

/// The `-----BEGIN X-----` ... `-----END X-----` blocks of `text`; the text between them
/// (openssl's `subject=` lines, a bag's attributes) is not the certificate and is dropped.
fn pem_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if current.is_none() && line.starts_with("-----BEGIN ") {
            current = Some(String::new());
        }
        if let Some(block) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
            if line.starts_with("-----END ") {
                blocks.push(current.take().unwrap_or_default());
            }
        }
    }
    // An unterminated block is still given to the decoder, which names what is wrong.
    blocks.extend(current);
    blocks
}

/// The label of a block's `-----BEGIN LABEL-----` line.
fn label_of(block: &str) -> Option<&str> {
    block
        .lines()
        .next()?
        .strip_prefix("-----BEGIN ")?
        .strip_suffix("-----")
}

/// A block's bytes, its base64 wrapped at any width (openssl writes 64 columns, other tools
/// 76 or one line).
fn decode_any_width(block: &str) -> Result<Vec<u8>, pem_rfc7468::Error> {
    let mut decoder = pem_rfc7468::Decoder::new_detect_wrap(block.as_bytes())?;
    let mut der = Vec::new();
    decoder.decode_to_end(&mut der)?;
    Ok(der)
}

/// A CA: basicConstraints says so, or it has none and names itself its issuer (as old v1
/// roots do; its signature is not checked: trust is what the recipe asks for). Valid at
/// `now`.
fn check_authority(
    path: &CaPath,
    index: usize,
    certificate: &Certificate,
    now: SystemTime,
) -> Result<(), CaError> {
    let tbs = certificate.tbs_certificate();
    let subject = tbs.subject().to_string();
    let issuer = tbs.issuer().to_string();
    let not_ca = |why| CaError::NotCa {
        path: path.clone(),
        subject: subject.clone(),
        issuer: issuer.clone(),
        why,
    };
    match tbs.get_extension::<BasicConstraints>() {
        Ok(Some((_, constraints))) if !constraints.ca => {
            return Err(not_ca("its basicConstraints say CA:FALSE"))
        }
        Ok(Some(_)) => {}
        Ok(None) if subject != issuer => {
            return Err(not_ca("it has no basicConstraints and another issuer"))
        }
        Ok(None) => {}
        Err(e) => {
            return Err(CaError::Malformed {
                path: path.clone(),
                index,
                message: format!("basicConstraints of `{subject}`: {e}"),
            })
        }
    }
    let not_before = SystemTime::UNIX_EPOCH + tbs.validity().not_before.to_unix_duration();
    if let Ok(ahead) = not_before.duration_since(now) {
        return Err(CaError::NotYetValid {
            path: path.clone(),
            subject,
            days: ahead.as_secs() / 86_400,
        });
    }
    let not_after = SystemTime::UNIX_EPOCH + tbs.validity().not_after.to_unix_duration();
    if let Ok(ago) = now.duration_since(not_after) {
        return Err(CaError::Expired {
            path: path.clone(),
            subject,
            days: ago.as_secs() / 86_400,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made with openssl (tests/fixtures/ca/README.md): a P-256 root valid for 100 years, a
    // server certificate it signed, the root with its key, the root in DER.
    const ROOT: &[u8] = include_bytes!("../../tests/fixtures/ca/corp-root.pem");
    const ROOT_WITH_TEXT: &[u8] = include_bytes!("../../tests/fixtures/ca/corp-root-with-text.pem");
    const SERVER: &[u8] = include_bytes!("../../tests/fixtures/ca/server.pem");
    const ROOT_AND_KEY: &[u8] = include_bytes!("../../tests/fixtures/ca/root-and-key.pem");
    const ROOT_DER: &[u8] = include_bytes!("../../tests/fixtures/ca/corp-root.der");

    fn path(text: &str) -> CaPath {
        text.parse().unwrap()
    }

    fn now() -> SystemTime {
        SystemTime::now()
    }

    #[test]
    fn a_root_is_kept_as_its_certificate_alone() {
        let file = parse(&path("certs/corp-root.pem"), ROOT_WITH_TEXT, now()).unwrap();
        assert_eq!(
            file.subjects,
            ["CN=Example Corp Root CA,O=Example Corp"],
            "{file:?}"
        );
        // openssl's `subject=` line is not in the image; the block is, byte for byte.
        assert_eq!(file.pem.as_bytes(), ROOT);
        assert_eq!(path("certs/corp-root.pem").image_name(), "corp-root.crt");
        // A bundle of two is two certificates.
        let two = [ROOT, ROOT].concat();
        let file = parse(&path("two.pem"), &two, now()).unwrap();
        assert_eq!(file.subjects.len(), 2);
    }

    #[test]
    fn what_is_not_a_ca_certificate_is_refused_saying_what_to_do() {
        let error = parse(&path("server.pem"), SERVER, now()).unwrap_err();
        assert!(
            matches!(&error, CaError::NotCa { subject, issuer, .. }
                if subject == "CN=localhost" && issuer.contains("Example Corp Root CA")),
            "{error}"
        );
        let error = parse(&path("both.pem"), ROOT_AND_KEY, now()).unwrap_err();
        assert!(matches!(error, CaError::PrivateKey { .. }), "{error}");
        assert!(error.to_string().contains("must never go into an image"));
        let error = parse(&path("root.der"), ROOT_DER, now()).unwrap_err();
        assert!(matches!(error, CaError::NoCertificate { .. }), "{error}");
        assert!(error.to_string().contains("-inform der"), "{error}");
        let error = parse(&path("empty.pem"), b"", now()).unwrap_err();
        assert!(matches!(error, CaError::NoCertificate { .. }), "{error}");
        let broken = String::from_utf8_lossy(ROOT).replace("MIIB", "MIIZ");
        let error = parse(&path("broken.pem"), broken.as_bytes(), now()).unwrap_err();
        assert!(
            matches!(error, CaError::Malformed { index: 1, .. }),
            "{error}"
        );
        let truncated = &ROOT[..ROOT.len() - 30];
        let error = parse(&path("cut.pem"), truncated, now()).unwrap_err();
        assert!(matches!(error, CaError::Malformed { .. }), "{error}");
        let request =
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n";
        let error = parse(&path("req.pem"), request, now()).unwrap_err();
        assert!(matches!(error, CaError::OtherBlock { .. }), "{error}");
    }

    #[test]
    fn any_base64_width_is_read_and_a_key_is_named_whatever_its_width() {
        let der = parse(&path("root.pem"), ROOT, now()).unwrap();
        let body: String = String::from_utf8_lossy(ROOT)
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let wide: Vec<String> = body
            .as_bytes()
            .chunks(76)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        let rewrapped = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            wide.join("\n")
        );
        let file = parse(&path("wide.pem"), rewrapped.as_bytes(), now()).unwrap();
        assert_eq!(file.pem, der.pem);
        let key = format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n",
            "b".repeat(70)
        );
        let error = parse(&path("key.pem"), key.as_bytes(), now()).unwrap_err();
        assert!(matches!(error, CaError::PrivateKey { .. }), "{error}");
    }

    #[test]
    fn a_certificate_before_its_start_is_refused() {
        let before = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        let error = parse(&path("root.pem"), ROOT, before).unwrap_err();
        assert!(matches!(error, CaError::NotYetValid { .. }), "{error}");
    }

    #[test]
    fn an_expired_authority_is_refused() {
        // The fixture is valid for 100 years from 2026: at 2200 it has expired.
        let later = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(7_258_118_400);
        let error = parse(&path("root.pem"), ROOT, later).unwrap_err();
        assert!(matches!(error, CaError::Expired { .. }), "{error}");
    }

    #[test]
    fn paths_stay_in_the_recipe_directory_and_names_are_unique() {
        for bad in [
            "",
            "/etc/ssl/certs/ca.pem",
            "~/ca.pem",
            "../ca.pem",
            "certs/../../ca.pem",
            ".",
        ] {
            assert!(bad.parse::<CaPath>().is_err(), "{bad}");
        }
        let paths = [path("a/root.pem"), path("b/root.crt")];
        let error = check_names(&paths).unwrap_err();
        assert!(error.contains("root.crt"), "{error}");
        assert!(check_names(&[path("a/one.pem"), path("two.pem")]).is_ok());
    }

    #[test]
    fn files_are_read_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("root.pem"), ROOT).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link.pem")).unwrap();
        let files = read_all(dir.path(), &[path("root.pem")], now()).unwrap();
        assert_eq!(files[0].pem.as_bytes(), ROOT);
        let error = read_all(dir.path(), &[path("link.pem")], now()).unwrap_err();
        assert!(error.to_string().contains("symbolic link"), "{error}");
        let error = read_all(dir.path(), &[path("absent.pem")], now()).unwrap_err();
        assert!(error.to_string().contains("does not exist"), "{error}");
    }
}
