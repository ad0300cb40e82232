//! Content digests (`sha256:<64 hex>`), parsed once at the edge and compared as values.
//!
//! Everything cudastack fetches, caches or writes is addressed by a [`Digest`]. The
//! [`HashingWriter`] / [`HashingReader`] wrappers compute a digest while bytes stream
//! through, so no artifact is ever read twice just to hash it.

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// A sha256 content digest. Only sha256 is accepted: it is what OCI registries,
/// PyPI and NVIDIA's redist manifests all publish.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("digest `{0}` is not of the form sha256:<64 lowercase hex digits>")]
    Malformed(String),
    #[error("digest algorithm `{0}` is not supported; only sha256 is")]
    UnsupportedAlgorithm(String),
}

impl Digest {
    /// Hash a byte slice held in memory (small things: configs, manifests, recipes).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Parse a bare 64-digit lowercase hex string (PyPI `hashes.sha256`, NVIDIA manifests).
    pub fn from_hex(hex_digits: &str) -> Result<Self, DigestError> {
        if hex_digits.len() != 64 || !hex_digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(DigestError::Malformed(hex_digits.to_string()));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_digits.to_ascii_lowercase(), &mut out)
            .map_err(|_| DigestError::Malformed(hex_digits.to_string()))?;
        Ok(Digest(out))
    }

    /// The 64 hex digits without the algorithm prefix (blob file names).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("sha256", hex_digits)) => Digest::from_hex(hex_digits),
            Some((algorithm, _)) => Err(DigestError::UnsupportedAlgorithm(algorithm.to_string())),
            None => Err(DigestError::Malformed(s.to_string())),
        }
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// An incremental sha256 that also counts bytes.
#[derive(Clone, Default)]
pub struct Hasher {
    sha: Sha256,
    bytes: u64,
}

impl Hasher {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn update(&mut self, data: &[u8]) {
        self.sha.update(data);
        self.bytes += data.len() as u64;
    }
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    pub fn finish(self) -> (Digest, u64) {
        (Digest(self.sha.finalize().into()), self.bytes)
    }
}

/// A writer that hashes and counts everything written through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Hasher,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Hasher::new(),
        }
    }
    /// Returns the inner writer, the digest of what was written and its size.
    pub fn finish(self) -> (W, Digest, u64) {
        let (digest, size) = self.hasher.finish();
        (self.inner, digest, size)
    }
    pub fn get_ref(&self) -> &W {
        &self.inner
    }
    /// Bytes written through so far.
    pub fn bytes_written(&self) -> u64 {
        self.hasher.bytes()
    }
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hasher.update(&buf[..written]);
        Ok(written)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes and counts everything read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Hasher::new(),
        }
    }
    pub fn finish(self) -> (R, Digest, u64) {
        let (digest, size) = self.hasher.finish();
        (self.inner, digest, size)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.hasher.update(&buf[..read]);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        let text = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let digest: Digest = text.parse().unwrap();
        assert_eq!(digest, Digest::of_bytes(b""));
        assert_eq!(digest.to_string(), text);
    }

    #[test]
    fn rejects_other_algorithms_and_bad_hex() {
        assert!(matches!(
            "sha512:00".parse::<Digest>(),
            Err(DigestError::UnsupportedAlgorithm(_))
        ));
        assert!(matches!(
            "sha256:zz".parse::<Digest>(),
            Err(DigestError::Malformed(_))
        ));
        assert!(matches!(
            "e3b0".parse::<Digest>(),
            Err(DigestError::Malformed(_))
        ));
    }

    #[test]
    fn hashing_writer_matches_one_shot() {
        let mut writer = HashingWriter::new(Vec::new());
        writer.write_all(b"hello ").unwrap();
        writer.write_all(b"world").unwrap();
        let (inner, digest, size) = writer.finish();
        assert_eq!(inner, b"hello world");
        assert_eq!(size, 11);
        assert_eq!(digest, Digest::of_bytes(b"hello world"));
    }
}
