//! Core metadata (`*.dist-info/METADATA`) of a wheel, fetched without downloading it, and
//! parsed into the fields the resolver needs.
//!
//! Order of preference: the PEP 658 `<url>.metadata` file (its sha256 checked against the
//! index's `core-metadata` hash), then range reads of the wheel itself through
//! [`RemoteZip`] (many torch wheels on PyPI have no `.metadata` file). Local wheels (a
//! mirror directory) are read with the `zip` crate.

use std::path::Path;
use std::str::FromStr;

use pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{ExtraName, PackageName, Requirement};

use crate::digest::Digest;
use crate::fetch::http::{HttpClient, HttpError};
use crate::fetch::index::{CoreMetadata, DistFile};
use crate::fetch::remote_zip::{RemoteZip, RemoteZipError, MAX_CENTRAL_DIRECTORY_BYTES};

/// The largest METADATA read, from a `.metadata` file, a remote wheel or a local one
/// (a 1.5 MB wheel whose METADATA inflated to 1.5 GB made `lock` use 1.5 GB).
/// The biggest on PyPI are long READMEs of a few hundred kB.
pub const MAX_METADATA_BYTES: u64 = 8 * 1024 * 1024;

/// The largest wheel downloaded whole to read its METADATA, from a server that ignores byte
/// ranges (a torch wheel is about 2.5 GB; the file goes to a temporary file, not memory).
pub const MAX_FALLBACK_WHEEL_BYTES: u64 = 4 << 30;

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    RemoteZip(#[from] RemoteZipError),
    #[error("Core metadata `{url}` does not match the hash the index published\n  Expected: {expected}\n  Found:    {found}")]
    Mismatch {
        url: reqwest::Url,
        expected: Digest,
        found: Digest,
    },
    #[error("Wheel `{location}` has no `*.dist-info/METADATA` entry")]
    NoMetadataEntry { location: String },
    #[error("METADATA of `{location}` is not UTF-8")]
    NotUtf8 { location: String },
    #[error("Failed to read wheel `{path}`")]
    LocalZip {
        path: std::path::PathBuf,
        #[source]
        source: zip::result::ZipError,
    },
    #[error("I/O error on `{path}`")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("METADATA of `{location}` is {size} bytes; cudastack reads at most {} (real ones are a few kB)", MAX_METADATA_BYTES)]
    TooLarge { location: String, size: u64 },
    #[error("Wheel `{url}` does not match the hash the index published\n  Expected: {expected}\n  Found:    {found}")]
    WheelMismatch {
        url: reqwest::Url,
        expected: Digest,
        found: Digest,
    },
    #[error("Wheel `{url}` is larger than {limit} bytes; its server ignores byte-range requests, so reading its METADATA would mean downloading all of it\n  hint: serve the index with a server that honours `Range` (or publishes PEP 658 `.metadata` files)")]
    WheelTooLarge { url: reqwest::Url, limit: u64 },
    #[error("METADATA of `{location}` is invalid: {reason}")]
    Invalid { location: String, reason: String },
}

/// The METADATA text of a wheel listed by an index (buffered: it is a few kB).
///
/// The `.metadata` file is tried even when the listing does not advertise it: some
/// mirrors of PyPI drop the `core-metadata` keys while still serving the files, and one
/// small request that may 404 is far cheaper than range reads. Its hash is checked only
/// when the index published one (the wheel itself is always hash-checked on download).
pub async fn wheel_metadata(client: &HttpClient, file: &DistFile) -> Result<String, MetadataError> {
    let expected = match file.core_metadata {
        CoreMetadata::Present { sha256 } => sha256,
        CoreMetadata::Absent => None,
    };
    let url = file.metadata_url();
    match client
        .get_bytes_limited(&url, Default::default(), MAX_METADATA_BYTES)
        .await
    {
        Ok((_, bytes)) => {
            if let Some(expected) = expected {
                let found = Digest::of_bytes(&bytes);
                if found != expected {
                    return Err(MetadataError::Mismatch {
                        url,
                        expected,
                        found,
                    });
                }
            }
            return String::from_utf8(bytes.to_vec()).map_err(|_| MetadataError::NotUtf8 {
                location: url.to_string(),
            });
        }
        Err(HttpError::NotFound { .. }) => {
            tracing::debug!(%url, "no core metadata file; reading the wheel with range requests")
        }
        Err(error) if matches!(file.core_metadata, CoreMetadata::Present { .. }) => {
            return Err(error.into())
        }
        Err(error) => {
            tracing::debug!(%url, %error, "core metadata probe failed; reading the wheel")
        }
    }
    wheel_metadata_by_range(client, file).await
}

/// The METADATA text read out of the wheel with HTTP range requests (no `.metadata` file).
pub async fn wheel_metadata_by_range(
    client: &HttpClient,
    file: &DistFile,
) -> Result<String, MetadataError> {
    let mut url = file.url.clone();
    url.set_fragment(None);
    let zip = match RemoteZip::open(client, url.clone()).await {
        Ok(zip) => zip,
        // A plain static file server (Python's http.server) answers a range request with
        // the whole file: read the wheel whole, as pip does.
        Err(RemoteZipError::Http(HttpError::RangeUnsupported { .. })) => {
            return wheel_metadata_by_download(client, &url, file).await;
        }
        Err(error) => return Err(error.into()),
    };
    let name =
        metadata_entry_name(zip.entries().iter().map(|e| e.name.as_str())).ok_or_else(|| {
            MetadataError::NoMetadataEntry {
                location: zip.url().to_string(),
            }
        })?;
    let size = zip
        .entry(&name)
        .map_or(0, |e| e.uncompressed_size.max(e.compressed_size));
    if size > MAX_METADATA_BYTES {
        return Err(MetadataError::TooLarge {
            location: zip.url().to_string(),
            size,
        });
    }
    let bytes = zip.read_entry(&name).await?;
    String::from_utf8(bytes).map_err(|_| MetadataError::NotUtf8 {
        location: zip.url().to_string(),
    })
}

/// The METADATA text of a wheel whose server ignores byte ranges: the wheel downloaded
/// whole into a temporary file (at most [`MAX_FALLBACK_WHEEL_BYTES`], and the index's size
/// when it gave one), checked against the index's sha256 when it gave one, then read.
async fn wheel_metadata_by_download(
    client: &HttpClient,
    url: &reqwest::Url,
    file: &DistFile,
) -> Result<String, MetadataError> {
    use tokio::io::AsyncWriteExt as _;
    let limit = file
        .size
        .unwrap_or(MAX_FALLBACK_WHEEL_BYTES)
        .min(MAX_FALLBACK_WHEEL_BYTES);
    let too_large = || MetadataError::WheelTooLarge {
        url: url.clone(),
        limit,
    };
    let mut response = client.get(url, Default::default()).await?;
    if response
        .content_length()
        .is_some_and(|length| length > limit)
    {
        return Err(too_large());
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MetadataError::Io { path, source }
    };
    let temporary = tempfile::NamedTempFile::new().map_err(io(Path::new("a temporary file")))?;
    let mut written = 0u64;
    let mut hasher = crate::digest::Hasher::new();
    let file_for_writes = temporary
        .as_file()
        .try_clone()
        .map_err(io(temporary.path()))?;
    let mut out = tokio::io::BufWriter::new(tokio::fs::File::from_std(file_for_writes));
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|source| HttpError::Transport {
            url: url.clone(),
            attempts: 1,
            source: source.without_url(),
        })?
    {
        written += chunk.len() as u64;
        if written > limit {
            return Err(too_large());
        }
        hasher.update(&chunk);
        out.write_all(&chunk).await.map_err(io(temporary.path()))?;
    }
    out.flush().await.map_err(io(temporary.path()))?;
    drop(out);
    if let Some(expected) = file.sha256 {
        let (found, _) = hasher.finish();
        if found != expected {
            return Err(MetadataError::WheelMismatch {
                url: url.clone(),
                expected,
                found,
            });
        }
    }
    tokio::task::spawn_blocking(move || local_wheel_metadata(temporary.path()))
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
}

/// The METADATA text of a wheel on disk (blocking; a mirror directory or the cache).
pub fn local_wheel_metadata(path: &Path) -> Result<String, MetadataError> {
    let file = fs_err::File::open(path).map_err(|source| MetadataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    zip_metadata(file, path)
}

/// The METADATA text of the wheel `file` (read from `path`, which names it in errors):
/// at most [`MAX_METADATA_BYTES`] inflated, whatever the archive says its size is.
pub fn zip_metadata(
    mut file: impl std::io::Read + std::io::Seek,
    path: &Path,
) -> Result<String, MetadataError> {
    let zip_error = |source| MetadataError::LocalZip {
        path: path.to_path_buf(),
        source,
    };
    let io_error = |source| MetadataError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(size) = central_directory_size(&mut file).map_err(io_error)? {
        if size > MAX_CENTRAL_DIRECTORY_BYTES {
            return Err(MetadataError::Invalid {
                location: path.display().to_string(),
                reason: format!("its zip central directory is {size} bytes, more than the {MAX_CENTRAL_DIRECTORY_BYTES} cudastack reads (torch's is about 1 MB)"),
            });
        }
    }
    let mut archive = zip::ZipArchive::new(file).map_err(zip_error)?;
    let names: Vec<String> = archive
        .file_names()
        .filter_map(|name| name.ok().map(|name| name.into_owned()))
        .collect();
    let name = metadata_entry_name(names.iter().map(String::as_str)).ok_or_else(|| {
        MetadataError::NoMetadataEntry {
            location: path.display().to_string(),
        }
    })?;
    let entry = archive.by_name(&name).map_err(zip_error)?;
    if entry.size() > MAX_METADATA_BYTES {
        return Err(MetadataError::TooLarge {
            location: path.display().to_string(),
            size: entry.size(),
        });
    }
    // The recorded size is the archive's word; the inflated stream is bounded on its own.
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(entry, MAX_METADATA_BYTES + 1),
        &mut bytes,
    )
    .map_err(|source| MetadataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.len() as u64 > MAX_METADATA_BYTES {
        return Err(MetadataError::TooLarge {
            location: path.display().to_string(),
            size: bytes.len() as u64,
        });
    }
    String::from_utf8(bytes).map_err(|_| MetadataError::NotUtf8 {
        location: path.display().to_string(),
    })
}

/// The one top-level `<name>-<version>.dist-info/METADATA` entry.
fn metadata_entry_name<'a>(names: impl Iterator<Item = &'a str>) -> Option<String> {
    names
        .filter(|name| {
            let mut parts = name.split('/');
            matches!(
                (parts.next(), parts.next(), parts.next()),
                (Some(dir), Some("METADATA"), None) if dir.ends_with(".dist-info")
            )
        })
        .min()
        .map(str::to_string)
}

/// The size the end records of the zip `file` give its central directory (zip64's when
/// the classic record is saturated); `None` when there is no end record, which the zip
/// reader then reports. The zip reader holds every record of the central directory in
/// memory, a few hundred bytes for each 46 of the file: this bounds it first.
fn central_directory_size(
    file: &mut (impl std::io::Read + std::io::Seek),
) -> std::io::Result<Option<u64>> {
    use std::io::SeekFrom;
    const END: [u8; 4] = [0x50, 0x4b, 0x05, 0x06];
    const LOCATOR: [u8; 4] = [0x50, 0x4b, 0x06, 0x07];
    const ZIP64_END: [u8; 4] = [0x50, 0x4b, 0x06, 0x06];
    let length = file.seek(SeekFrom::End(0))?;
    // The end record is 22 bytes and a comment of at most 65,535.
    let tail_length = length.min(22 + 65_535);
    let mut tail = vec![0u8; tail_length as usize];
    file.seek(SeekFrom::Start(length - tail_length))?;
    file.read_exact(&mut tail)?;
    file.seek(SeekFrom::Start(0))?;
    let Some(end) = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&at| tail[at..at + 4] == END)
    else {
        return Ok(None);
    };
    let entries = u16::from_le_bytes([tail[end + 10], tail[end + 11]]);
    let size = u32::from_le_bytes(tail[end + 12..end + 16].try_into().expect("4 bytes"));
    if entries != u16::MAX && size != u32::MAX {
        return Ok(Some(u64::from(size)));
    }
    // Zip64: the locator just before the end record names the zip64 end record.
    let Some(locator) = end
        .checked_sub(20)
        .filter(|&at| tail[at..at + 4] == LOCATOR)
    else {
        return Ok(Some(u64::from(size)));
    };
    let offset = u64::from_le_bytes(tail[locator + 8..locator + 16].try_into().expect("8 bytes"));
    let mut record = [0u8; 56];
    if offset.checked_add(56).is_none_or(|e| e > length) {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut record)?;
    file.seek(SeekFrom::Start(0))?;
    if record[..4] != ZIP64_END {
        return Ok(None);
    }
    Ok(Some(u64::from_le_bytes(
        record[40..48].try_into().expect("8 bytes"),
    )))
}

/// The fields of core metadata (METADATA / PKG-INFO) that resolution needs.
#[derive(Debug, Clone)]
pub struct Metadata {
    pub name: PackageName,
    pub version: Version,
    pub requires_dist: Vec<Requirement>,
    pub requires_python: Option<VersionSpecifiers>,
    pub provides_extra: Vec<ExtraName>,
}

impl Metadata {
    /// Parse the RFC 822-style header block of a METADATA file. `location` names the
    /// source in errors. Continuation lines are folded; the body (description) is ignored.
    pub fn parse(text: &str, location: &str) -> Result<Metadata, MetadataError> {
        let invalid = |reason: String| MetadataError::Invalid {
            location: location.to_string(),
            reason,
        };
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if line.is_empty() {
                break;
            }
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = fields.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            if let Some((key, value)) = line.split_once(':') {
                fields.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let get = |key: &str| {
            fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let name = get("name").ok_or_else(|| invalid("no `Name` field".into()))?;
        let name = PackageName::from_str(name)
            .map_err(|e| invalid(format!("bad `Name` `{name}`: {e}")))?;
        let version = get("version").ok_or_else(|| invalid("no `Version` field".into()))?;
        let version = Version::from_str(version)
            .map_err(|e| invalid(format!("bad `Version` `{version}`: {e}")))?;
        let requires_python = match get("requires-python") {
            None | Some("") => None,
            Some(value) => Some(
                VersionSpecifiers::from_str(value)
                    .map_err(|e| invalid(format!("bad `Requires-Python` `{value}`: {e}")))?,
            ),
        };
        let mut requires_dist = Vec::new();
        let mut provides_extra = Vec::new();
        for (key, value) in &fields {
            match key.as_str() {
                "requires-dist" => requires_dist.push(
                    crate::names::parse_requirement(value)
                        .map_err(|e| invalid(format!("bad `Requires-Dist` `{value}`: {e}")))?,
                ),
                "provides-extra" => provides_extra.push(
                    ExtraName::from_str(value)
                        .map_err(|e| invalid(format!("bad `Provides-Extra` `{value}`: {e}")))?,
                ),
                _ => {}
            }
        }
        Ok(Metadata {
            name,
            version,
            requires_dist,
            requires_python,
            provides_extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_torch_like_metadata() {
        let text = "Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\nSummary: Tensors\n\
Requires-Python: >=3.8.0\n\
Requires-Dist: filelock\n\
Requires-Dist: typing-extensions >=4.8.0\n\
Requires-Dist: nvidia-cudnn-cu12 ==9.1.0.70 ; platform_system == \"Linux\" and platform_machine == \"x86_64\"\n\
Requires-Dist: opt-einsum >=3.3 ; extra == 'opt-einsum'\n\
Provides-Extra: opt-einsum\n\
Description-Content-Type: text/markdown\n\
License: BSD-3\n  continued line\n\
\n\
Requires-Dist: not-a-header-this-is-the-body\n";
        let metadata = Metadata::parse(text, "torch").unwrap();
        assert_eq!(metadata.name.as_ref(), "torch");
        assert_eq!(metadata.version.to_string(), "2.4.1");
        assert_eq!(metadata.requires_dist.len(), 4);
        assert_eq!(metadata.requires_dist[2].name.as_ref(), "nvidia-cudnn-cu12");
        assert_eq!(metadata.provides_extra.len(), 1);
        assert!(metadata
            .requires_python
            .unwrap()
            .contains(&Version::from_str("3.11").unwrap()));
    }

    /// A central directory the end record says is huge is refused before the zip reader
    /// would allocate for it; an ordinary wheel is read.
    #[test]
    fn a_huge_central_directory_is_refused_before_it_is_read() {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        zip.start_file(
            "x-1.0.dist-info/METADATA",
            zip::write::SimpleFileOptions::default(),
        )
        .unwrap();
        zip.write_all(b"Metadata-Version: 2.1\nName: x\nVersion: 1.0\n")
            .unwrap();
        let bytes = zip.finish().unwrap().into_inner();
        let text = zip_metadata(std::io::Cursor::new(&bytes), Path::new("x.whl")).unwrap();
        assert!(text.contains("Name: x"));
        let mut hostile = bytes.clone();
        let end = hostile.len() - 22;
        assert_eq!(hostile[end..end + 4], [0x50, 0x4b, 0x05, 0x06]);
        hostile[end + 12..end + 16].copy_from_slice(&(200u32 << 20).to_le_bytes());
        let error = zip_metadata(std::io::Cursor::new(&hostile), Path::new("x.whl"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("its zip central directory is 209715200 bytes, more than the 67108864"),
            "{error}"
        );
    }

    #[test]
    fn missing_name_is_an_error() {
        let error = Metadata::parse("Version: 1\n", "x.whl").unwrap_err();
        assert!(error.to_string().contains("x.whl"));
    }

    #[test]
    fn finds_the_top_level_metadata_entry() {
        let names = [
            "torch/__init__.py",
            "torch/_vendor/x.dist-info/METADATA",
            "torch-2.4.1.dist-info/RECORD",
            "torch-2.4.1.dist-info/METADATA",
        ];
        assert_eq!(
            metadata_entry_name(names.iter().copied()).as_deref(),
            Some("torch-2.4.1.dist-info/METADATA")
        );
    }
}
