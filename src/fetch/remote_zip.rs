//! Read single entries of a zip archive (a wheel) over HTTP with byte-range requests,
//! without downloading the archive.
//!
//! [`RemoteZip::open`] fetches the tail of the file (end of central directory, plus the
//! zip64 records when present) and the central directory; [`RemoteZip::read_entry`] then
//! range-reads one local header and its compressed data and inflates it, checking size and
//! CRC-32. For large entries (torch's `torch/lib/libtorch_python.so`, tens of MB)
//! [`RemoteZip::entry_reader`] streams the inflated bytes instead of buffering them.
//!
//! Used by [`crate::fetch::metadata`] for wheels without a PEP 658 `.metadata` file (many
//! torch wheels) and by the matrix code to read the CUDA arch list out of torch.

use std::io::{self, Read};

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT_ENCODING, CONTENT_RANGE, RANGE};
use reqwest::{StatusCode, Url};
use tokio::sync::OwnedSemaphorePermit;

use crate::fetch::http::{ByteRange, ContentRange, HttpClient, HttpError};

const EOCD_SIGNATURE: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIGNATURE: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIGNATURE: u32 = 0x0606_4b50;
const CENTRAL_SIGNATURE: u32 = 0x0201_4b50;
const LOCAL_SIGNATURE: u32 = 0x0403_4b50;
const EOCD_MIN: u64 = 22;
/// Enough for the EOCD with the longest possible comment, the zip64 locator and typically
/// the whole central directory of an ordinary wheel.
const TAIL_BYTES: u64 = 128 * 1024;
/// Guess for the local header's extra field, so most entries take one request.
const LOCAL_EXTRA_GUESS: u64 = 256;
/// The largest central directory read (torch's, ~10k entries, is about 1 MB). Every size
/// below comes from the server; each is bounded before anything is allocated.
pub const MAX_CENTRAL_DIRECTORY_BYTES: u64 = 64 * 1024 * 1024;
/// The largest entry [`RemoteZip::read_entry`] holds in memory, compressed or inflated
/// (METADATA is kB; bigger entries go through [`RemoteZip::entry_reader`]).
pub const MAX_BUFFERED_ENTRY_BYTES: u64 = 16 * 1024 * 1024;
/// The smallest central directory record.
const CENTRAL_RECORD_MIN: u64 = 46;

#[derive(Debug, thiserror::Error)]
pub enum RemoteZipError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("`{url}` is not a readable zip archive: {reason}")]
    Malformed { url: Url, reason: String },
    #[error("`{url}` has no entry `{name}`")]
    NoSuchEntry { url: Url, name: String },
    #[error("Entry `{name}` of `{url}` uses compression method {method}; only stored (0) and deflate (8) are supported")]
    UnsupportedMethod { url: Url, name: String, method: u16 },
    #[error("Entry `{name}` of `{url}` is {size} bytes; cudastack reads entries of at most {limit} bytes into memory")]
    EntryTooLarge {
        url: Url,
        name: String,
        size: u64,
        limit: u64,
    },
    #[error("Entry `{name}` of `{url}` is corrupt: {reason}")]
    CorruptEntry {
        url: Url,
        name: String,
        reason: String,
    },
}

/// One file in the archive, from the central directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipEntry {
    pub name: String,
    pub method: u16,
    pub crc32: u32,
    pub compressed_size: u64,
    pub uncompressed_size: u64,
    pub local_header_offset: u64,
}

/// A zip archive behind a URL whose server honours `Range`.
#[derive(Debug, Clone)]
pub struct RemoteZip {
    client: HttpClient,
    url: Url,
    size: u64,
    entries: Vec<ZipEntry>,
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

impl RemoteZip {
    /// Read the central directory of the zip at `url` (one or two range requests).
    pub async fn open(client: &HttpClient, url: Url) -> Result<Self, RemoteZipError> {
        let malformed = |reason: &str| RemoteZipError::Malformed {
            url: url.clone(),
            reason: reason.to_string(),
        };
        let tail = client
            .get_range(&url, ByteRange::Suffix(TAIL_BYTES))
            .await?;
        let size = tail
            .range
            .total
            .ok_or_else(|| malformed("the server did not report the file size"))?;
        let tail_start = tail.range.start;
        let tail_bytes = &tail.bytes[..];
        // `get_range` checked that the bytes are the range they claim; a suffix must also
        // end where the file does, or every offset below would point at the wrong bytes.
        if tail.range.end.checked_add(1) != Some(size) {
            return Err(malformed(
                "the server's answer to a suffix range does not end at the file's end",
            ));
        }
        if (tail_bytes.len() as u64) < EOCD_MIN {
            return Err(malformed(
                "file is shorter than an end-of-central-directory record",
            ));
        }
        let eocd = (0..=tail_bytes.len() - EOCD_MIN as usize)
            .rev()
            .find(|&at| u32_at(tail_bytes, at) == EOCD_SIGNATURE)
            .ok_or_else(|| malformed("no end-of-central-directory record"))?;
        let mut entry_count = u64::from(u16_at(tail_bytes, eocd + 10));
        let mut cd_size = u64::from(u32_at(tail_bytes, eocd + 12));
        let mut cd_offset = u64::from(u32_at(tail_bytes, eocd + 16));

        let locator = eocd.checked_sub(20);
        if let Some(locator) =
            locator.filter(|&at| u32_at(tail_bytes, at) == ZIP64_LOCATOR_SIGNATURE)
        {
            let record_offset = u64_at(tail_bytes, locator + 8);
            let record = if record_offset >= tail_start {
                usize::try_from(record_offset - tail_start)
                    .ok()
                    .and_then(|at| tail_bytes.get(at..at.checked_add(56)?))
                    .ok_or_else(|| malformed("zip64 end record is truncated"))?
                    .to_vec()
            } else {
                client
                    .get_range(
                        &url,
                        ByteRange::Inclusive {
                            start: record_offset,
                            end: record_offset + 55,
                        },
                    )
                    .await?
                    .bytes
                    .to_vec()
            };
            if record.len() < 56 || u32_at(&record, 0) != ZIP64_EOCD_SIGNATURE {
                return Err(malformed("bad zip64 end-of-central-directory record"));
            }
            entry_count = u64_at(&record, 32);
            cd_size = u64_at(&record, 40);
            cd_offset = u64_at(&record, 48);
        }
        if cd_offset.checked_add(cd_size).is_none_or(|end| end > size) {
            return Err(malformed("central directory lies outside the file"));
        }
        if cd_size > MAX_CENTRAL_DIRECTORY_BYTES {
            return Err(malformed(&format!(
                "central directory claims {cd_size} bytes, more than the {MAX_CENTRAL_DIRECTORY_BYTES} cudastack reads"
            )));
        }
        if entry_count > cd_size / CENTRAL_RECORD_MIN {
            return Err(malformed(&format!(
                "{entry_count} entries cannot fit in a {cd_size}-byte central directory"
            )));
        }
        let central = if cd_offset >= tail_start {
            usize::try_from(cd_offset - tail_start)
                .ok()
                .and_then(|at| tail_bytes.get(at..at.checked_add(cd_size as usize)?))
                .ok_or_else(|| malformed("central directory lies outside the file"))?
                .to_vec()
        } else if cd_size == 0 {
            Vec::new()
        } else {
            client
                .get_range(
                    &url,
                    ByteRange::Inclusive {
                        start: cd_offset,
                        end: cd_offset + cd_size - 1,
                    },
                )
                .await?
                .bytes
                .to_vec()
        };
        let entries = parse_central_directory(&central, entry_count).map_err(|r| malformed(&r))?;
        Ok(RemoteZip {
            client: client.clone(),
            url,
            size,
            entries,
        })
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Size of the whole archive in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn entries(&self) -> &[ZipEntry] {
        &self.entries
    }

    pub fn entry(&self, name: &str) -> Option<&ZipEntry> {
        self.entries.iter().find(|entry| entry.name == name)
    }

    fn require(&self, name: &str) -> Result<&ZipEntry, RemoteZipError> {
        let entry = self
            .entry(name)
            .ok_or_else(|| RemoteZipError::NoSuchEntry {
                url: self.url.clone(),
                name: name.to_string(),
            })?;
        if entry.method != 0 && entry.method != 8 {
            return Err(RemoteZipError::UnsupportedMethod {
                url: self.url.clone(),
                name: name.to_string(),
                method: entry.method,
            });
        }
        Ok(entry)
    }

    fn corrupt(&self, name: &str, reason: impl Into<String>) -> RemoteZipError {
        RemoteZipError::CorruptEntry {
            url: self.url.clone(),
            name: name.to_string(),
            reason: reason.into(),
        }
    }

    /// Read and inflate one entry into memory (for small entries such as METADATA).
    /// Size and CRC-32 are checked; an entry whose compressed or inflated size passes
    /// [`MAX_BUFFERED_ENTRY_BYTES`] is refused before anything is fetched.
    pub async fn read_entry(&self, name: &str) -> Result<Vec<u8>, RemoteZipError> {
        let entry = self.require(name)?;
        let largest = entry.compressed_size.max(entry.uncompressed_size);
        if largest > MAX_BUFFERED_ENTRY_BYTES {
            return Err(RemoteZipError::EntryTooLarge {
                url: self.url.clone(),
                name: name.to_string(),
                size: largest,
                limit: MAX_BUFFERED_ENTRY_BYTES,
            });
        }
        if entry.local_header_offset >= self.size {
            return Err(self.corrupt(name, "local header lies outside the file"));
        }
        let guess_end = entry
            .local_header_offset
            .saturating_add(30 + entry.name.len() as u64 + LOCAL_EXTRA_GUESS)
            .saturating_add(entry.compressed_size);
        let first = self
            .client
            .get_range(
                &self.url,
                ByteRange::Inclusive {
                    start: entry.local_header_offset,
                    end: guess_end.min(self.size) - 1,
                },
            )
            .await?;
        let data_start = self.data_offset_from_header(name, &first.bytes)?;
        let data_end = data_start
            .checked_add(entry.compressed_size)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| self.corrupt(name, "compressed data runs past the end of the file"))?;
        let relative = (data_start - entry.local_header_offset) as usize;
        let compressed = match first
            .bytes
            .get(relative..relative + entry.compressed_size as usize)
        {
            Some(bytes) => bytes.to_vec(),
            None if entry.compressed_size == 0 => Vec::new(),
            None => self
                .client
                .get_range(
                    &self.url,
                    ByteRange::Inclusive {
                        start: data_start,
                        end: data_end - 1,
                    },
                )
                .await?
                .bytes
                .to_vec(),
        };
        let mut out = Vec::with_capacity(entry.uncompressed_size as usize);
        let mut reader = checked_reader(entry, io::Cursor::new(compressed));
        reader
            .read_to_end(&mut out)
            .map_err(|error| self.corrupt(name, error.to_string()))?;
        Ok(out)
    }

    /// The offset of an entry's data, given the first bytes of its local header.
    fn data_offset_from_header(&self, name: &str, header: &[u8]) -> Result<u64, RemoteZipError> {
        let entry = self.require(name)?;
        if header.len() < 30 || u32_at(header, 0) != LOCAL_SIGNATURE {
            return Err(self.corrupt(name, "bad local file header signature"));
        }
        let name_len = u64::from(u16_at(header, 26));
        let extra_len = u64::from(u16_at(header, 28));
        entry
            .local_header_offset
            .checked_add(30 + name_len + extra_len)
            .filter(|&start| start <= self.size)
            .ok_or_else(|| self.corrupt(name, "local header lies outside the file"))
    }

    /// Stream one entry, inflated, as a blocking [`Read`]: nothing larger than the
    /// decoder's window is held in memory. Size and CRC-32 are checked at the end (a
    /// mismatch is an [`io::ErrorKind::InvalidData`] error).
    ///
    /// Call this from async code; read the result from a blocking context
    /// (`tokio::task::spawn_blocking`), because it drives the body through
    /// [`tokio_util::io::SyncIoBridge`]. It holds one of the client's transfer slots
    /// until dropped.
    pub async fn entry_reader(&self, name: &str) -> Result<EntryReader, RemoteZipError> {
        let entry = self.require(name)?.clone();
        if entry.local_header_offset >= self.size {
            return Err(self.corrupt(name, "local header lies outside the file"));
        }
        let header_end = entry
            .local_header_offset
            .saturating_add(30 + entry.name.len() as u64 + LOCAL_EXTRA_GUESS)
            .min(self.size)
            - 1;
        let header = self
            .client
            .get_range(
                &self.url,
                ByteRange::Inclusive {
                    start: entry.local_header_offset,
                    end: header_end,
                },
            )
            .await?;
        let data_start = self.data_offset_from_header(name, &header.bytes)?;
        if data_start
            .checked_add(entry.compressed_size)
            .is_none_or(|end| end > self.size)
        {
            return Err(self.corrupt(name, "compressed data runs past the end of the file"));
        }
        let permit = self.client.acquire().await;
        let body: Box<dyn Read + Send> = if entry.compressed_size == 0 {
            Box::new(io::empty())
        } else {
            let mut headers = HeaderMap::new();
            let range = format!(
                "bytes={}-{}",
                data_start,
                data_start + entry.compressed_size - 1
            );
            headers.insert(RANGE, HeaderValue::from_str(&range).expect("ASCII"));
            headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            let response = self.client.get(&self.url, headers).await?;
            let partial = response.status() == StatusCode::PARTIAL_CONTENT
                && response
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(ContentRange::parse)
                    .is_some_and(|r| r.start == data_start);
            if !partial {
                return Err(HttpError::RangeUnsupported {
                    url: self.url.clone(),
                    status: response.status(),
                }
                .into());
            }
            use futures_util::TryStreamExt;
            let stream = response.bytes_stream().map_err(io::Error::other);
            let reader = tokio_util::io::StreamReader::new(stream);
            Box::new(tokio_util::io::SyncIoBridge::new(reader))
        };
        Ok(EntryReader {
            inner: checked_reader(&entry, body),
            _permit: permit,
        })
    }
}

/// The inflated bytes of one entry; see [`RemoteZip::entry_reader`].
pub struct EntryReader {
    inner: CheckedReader<Box<dyn Read + Send>>,
    _permit: OwnedSemaphorePermit,
}

impl Read for EntryReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

/// Decompress according to the entry's method and check size and CRC at end of stream.
fn checked_reader<R: Read + Send + 'static>(
    entry: &ZipEntry,
    compressed: R,
) -> CheckedReader<Box<dyn Read + Send>> {
    let limited = compressed.take(entry.compressed_size);
    let inner: Box<dyn Read + Send> = match entry.method {
        8 => Box::new(flate2::read::DeflateDecoder::new(limited)),
        _ => Box::new(limited),
    };
    CheckedReader {
        inner,
        crc: flate2::Crc::new(),
        count: 0,
        expected_crc: entry.crc32,
        expected_size: entry.uncompressed_size,
    }
}

struct CheckedReader<R> {
    inner: R,
    crc: flate2::Crc,
    count: u64,
    expected_crc: u32,
    expected_size: u64,
}

impl<R: Read> Read for CheckedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        self.count += n as u64;
        if self.count > self.expected_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "inflates to more than the {} bytes the central directory records",
                    self.expected_size
                ),
            ));
        }
        if n == 0 && !buf.is_empty() {
            if self.count != self.expected_size {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "inflated to {} bytes, expected {}",
                        self.count, self.expected_size
                    ),
                ));
            }
            if self.crc.sum() != self.expected_crc {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "CRC-32 {:08x} does not match the recorded {:08x}",
                        self.crc.sum(),
                        self.expected_crc
                    ),
                ));
            }
        }
        Ok(n)
    }
}

/// Parse `count` central directory records (zip64 extra fields included).
pub fn parse_central_directory(bytes: &[u8], count: u64) -> Result<Vec<ZipEntry>, String> {
    // Each record takes at least 46 bytes: `count` cannot make us reserve more than that.
    let fits = bytes.len() as u64 / CENTRAL_RECORD_MIN;
    let mut entries = Vec::with_capacity(count.min(fits) as usize);
    let mut at = 0usize;
    for index in 0..count {
        let fixed = bytes
            .get(at..at.saturating_add(46))
            .ok_or_else(|| format!("central directory record {index} is truncated"))?;
        if u32_at(fixed, 0) != CENTRAL_SIGNATURE {
            return Err(format!(
                "central directory record {index} has a bad signature"
            ));
        }
        let method = u16_at(fixed, 10);
        let crc32 = u32_at(fixed, 16);
        let mut compressed_size = u64::from(u32_at(fixed, 20));
        let mut uncompressed_size = u64::from(u32_at(fixed, 24));
        let name_len = usize::from(u16_at(fixed, 28));
        let extra_len = usize::from(u16_at(fixed, 30));
        let comment_len = usize::from(u16_at(fixed, 32));
        let mut local_header_offset = u64::from(u32_at(fixed, 42));
        let variable = bytes
            .get(at + 46..at + 46 + name_len + extra_len + comment_len)
            .ok_or_else(|| format!("central directory record {index} is truncated"))?;
        let name = String::from_utf8_lossy(&variable[..name_len]).into_owned();
        let mut extra = &variable[name_len..name_len + extra_len];
        while extra.len() >= 4 {
            let id = u16_at(extra, 0);
            let len = usize::from(u16_at(extra, 2));
            let Some(data) = extra.get(4..4 + len) else {
                break;
            };
            if id == 0x0001 {
                let mut field = data;
                let mut take = |value: &mut u64| {
                    if *value == u64::from(u32::MAX) && field.len() >= 8 {
                        *value = u64_at(field, 0);
                        field = &field[8..];
                    }
                };
                take(&mut uncompressed_size);
                take(&mut compressed_size);
                take(&mut local_header_offset);
            }
            extra = &extra[4 + len..];
        }
        entries.push(ZipEntry {
            name,
            method,
            crc32,
            compressed_size,
            uncompressed_size,
            local_header_offset,
        });
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Any bytes and any claimed count: an error or entries, never a panic, and never a
        /// reservation larger than the bytes can hold.
        #[test]
        fn central_directory_parser_never_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            count in proptest::prelude::any::<u64>(),
            signatures in proptest::collection::vec(0usize..400, 0..4),
        ) {
            let mut bytes = bytes;
            for at in signatures {
                if at + 4 <= bytes.len() {
                    bytes[at..at + 4].copy_from_slice(&CENTRAL_SIGNATURE.to_le_bytes());
                }
            }
            if let Ok(entries) = parse_central_directory(&bytes, count) {
                proptest::prop_assert!(entries.len() as u64 <= bytes.len() as u64 / 46);
            }
        }
    }
}
