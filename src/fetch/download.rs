//! Download artifacts into the content-addressed [`BlobStore`], hash-checked and streamed.
//!
//! Each download streams into a stable partial file (`tmp/partial-<expected hex>`), hashing
//! as bytes arrive, and is adopted into `blobs/sha256/` only when the digest matches; on a
//! mismatch the partial is deleted and the error names the URL with Expected and Found.
//! An interrupted transfer (connection cut, timeout, 5xx) is retried by the transport's
//! rule and continued with `Range: bytes=<have>-` ([`crate::net::ResumableBody`]), from
//! zero when the server ignores ranges; a later run resumes from the same partial file. Memory stays flat: one network chunk and a 1 MiB
//! write buffer per transfer, whatever the artifact's size.
//!
//! What is left behind: a partial file survives only a *transfer* failure
//! (the connection broke, the server answered 5xx or could not be reached) and only when it
//! holds bytes, so the next run can resume; it never grows past the locked size, because
//! every source stops reading at `size + 1` bytes and fails. Every other failure (too many
//! bytes, too few, wrong hash, a 4xx, a local I/O error) deletes it: bytes known to be wrong
//! are never kept. Local copies write a temp blob that is deleted on every error.
//!
//! `file://` URLs are read only under the mirror directories the user named
//! ([`Downloader::mirrors`]), and only regular files: a lock is not allowed to copy (and
//! report the hash of) `/etc/shadow` or fill the disk from `/dev/zero`.
//!
//! Several downloads run at once, bounded by the client's semaphore. Progress goes to a
//! [`Reporter`] (quiet in tests, indicatif bars on stderr in the CLI). In offline mode
//! nothing is fetched and the error lists exactly what the cache lacks.

use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use reqwest::{Response, StatusCode, Url};

use crate::cache::{BlobStore, CacheError};
use crate::digest::{Digest, Hasher};
use crate::fetch::http::{redacted, HttpClient, HttpError};
use crate::fetch::progress::Reporter;
use crate::net::{is_transient_status, range_headers, Piece, ReadError, ResumableBody};

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "Failed to download `{}`: the transfer kept failing after {attempts} attempts",
        redacted(url)
    )]
    Interrupted {
        url: Url,
        attempts: u32,
        #[source]
        source: reqwest::Error,
    },
    #[error("`{}` is larger than the {expected} bytes the lock records (got {found} so far); refusing the rest", redacted(url))]
    TooLarge { url: Url, expected: u64, found: u64 },
    #[error(
        "`{}` ended after {found} bytes; the lock records {expected}",
        redacted(url)
    )]
    TooSmall { url: Url, expected: u64, found: u64 },
    #[error(
        "`{}` is a local file outside every mirror directory{}",
        redacted(url),
        mirrors_note(mirrors)
    )]
    LocalNotAllowed { url: Url, mirrors: Vec<PathBuf> },
    #[error("`{}` is not a regular file", redacted(url))]
    NotAFile { url: Url },
    #[error("Offline: {} artifact(s) are not in the cache `{cache}`:\n{}", missing.len(), missing.iter().map(|m| format!("  {m}")).collect::<Vec<_>>().join("\n"))]
    Offline {
        cache: PathBuf,
        missing: Vec<String>,
    },
    #[error("The download task failed")]
    Join(#[from] tokio::task::JoinError),
}

impl From<ReadError> for DownloadError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Cut {
                url,
                attempts,
                source,
                ..
            } => DownloadError::Interrupted {
                url,
                attempts,
                source,
            },
            ReadError::WrongRange { url, answered, .. } => {
                DownloadError::Http(HttpError::BadContentRange {
                    url,
                    value: answered,
                })
            }
        }
    }
}

fn mirrors_note(mirrors: &[PathBuf]) -> String {
    if mirrors.is_empty() {
        "; cudastack reads `file://` URLs only under a directory given with `--mirror DIR`"
            .to_string()
    } else {
        format!(
            " ({}); pass the directory that holds it with `--mirror DIR`",
            mirrors
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl DownloadError {
    /// Whether a partial file is worth keeping after this error: only when the transfer
    /// itself failed (the bytes so far are good, the rest may come on a rerun).
    fn keeps_partial(&self) -> bool {
        match self {
            DownloadError::Interrupted { .. }
            | DownloadError::Http(HttpError::Transport { .. }) => true,
            DownloadError::Http(HttpError::Status { status, .. }) => is_transient_status(*status),
            _ => false,
        }
    }
}

/// One thing to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchItem {
    /// A short name for progress and errors (`torch 2.4.1`, `cudnn 9.1.0.70`).
    pub name: String,
    pub url: Url,
    pub sha256: Digest,
    /// Expected size, when known; used for progress and to stop oversized bodies early.
    pub size: Option<u64>,
}

impl FetchItem {
    fn describe(&self) -> String {
        format!("{} ({}) from {}", self.name, self.sha256, self.url)
    }
}

/// Fetches [`FetchItem`]s into a [`BlobStore`].
#[derive(Clone)]
pub struct Downloader {
    client: HttpClient,
    store: BlobStore,
    reporter: Arc<dyn Reporter>,
    offline: bool,
    mirrors: Vec<PathBuf>,
}

impl Downloader {
    pub fn new(client: HttpClient, store: BlobStore, reporter: Arc<dyn Reporter>) -> Self {
        Downloader {
            client,
            store,
            reporter,
            offline: false,
            mirrors: Vec::new(),
        }
    }

    /// The directories `file://` URLs may read from (`--mirror`). With none, every
    /// `file://` URL is refused.
    pub fn mirrors(mut self, mirrors: Vec<PathBuf>) -> Self {
        self.mirrors = mirrors;
        self
    }

    /// Use only the cache: [`Downloader::fetch_all`] fails listing what is missing.
    pub fn offline(mut self, offline: bool) -> Self {
        self.offline = offline;
        self
    }

    pub fn store(&self) -> &BlobStore {
        &self.store
    }

    /// The items whose blobs are not in the cache.
    pub fn missing<'a>(&self, items: &'a [FetchItem]) -> Vec<&'a FetchItem> {
        items
            .iter()
            .filter(|item| !self.store.contains(&item.sha256))
            .collect()
    }

    /// Fetch everything (skipping what is cached), several at a time. Returns the blob
    /// paths in the order of `items`. The first error wins; other transfers finish or fail
    /// on their own and leave at most their partial files.
    pub async fn fetch_all(&self, items: &[FetchItem]) -> Result<Vec<PathBuf>, DownloadError> {
        if self.offline {
            let missing = self.missing(items);
            if !missing.is_empty() {
                return Err(DownloadError::Offline {
                    cache: self.store.root().to_path_buf(),
                    missing: missing.into_iter().map(FetchItem::describe).collect(),
                });
            }
        }
        // One transfer per digest: two tasks must never append to the same partial file.
        let mut unique: Vec<&FetchItem> = Vec::new();
        for item in items {
            if !unique.iter().any(|u| u.sha256 == item.sha256) {
                unique.push(item);
            }
        }
        let tasks = unique.iter().map(|item| {
            let this = self.clone();
            let item = (*item).clone();
            tokio::spawn(async move { this.fetch(&item).await })
        });
        for result in futures_util::future::join_all(tasks).await {
            result??;
        }
        Ok(items
            .iter()
            .map(|item| self.store.path(&item.sha256))
            .collect())
    }

    /// Fetch one item (or find it in the cache) and return its blob path.
    pub async fn fetch(&self, item: &FetchItem) -> Result<PathBuf, DownloadError> {
        if self.store.contains(&item.sha256) {
            return Ok(self.store.path(&item.sha256));
        }
        if self.offline {
            return Err(DownloadError::Offline {
                cache: self.store.root().to_path_buf(),
                missing: vec![item.describe()],
            });
        }
        let _permit = self.client.acquire().await;
        if item.url.scheme() == "file" {
            let store = self.store.clone();
            let item = item.clone();
            let reporter = self.reporter.clone();
            let mirrors = self.mirrors.clone();
            return tokio::task::spawn_blocking(move || {
                copy_local(&store, &item, &mirrors, &*reporter)
            })
            .await?;
        }
        self.download(item).await
    }

    async fn download(&self, item: &FetchItem) -> Result<PathBuf, DownloadError> {
        // Another build sharing the cache may be downloading the same blob.
        let _lock = self.store.lock_partial(&item.sha256)?;
        if let Some(path) = self.store.verified(&item.sha256)? {
            return Ok(path);
        }
        let partial = self.store.partial_path(&item.sha256);
        let id = self.reporter.start(&item.name, item.size);
        let result = self.transfer(item, &partial, id).await;
        self.reporter.finish(id);
        let result = result.and_then(|(found, size)| {
            self.store
                .adopt(&partial, found, size, &item.sha256, item.url.as_str())
                .map_err(DownloadError::from)
        });
        if let Err(error) = &result {
            // `adopt` removes a mismatching file itself; everything else is decided here.
            let worth_resuming =
                error.keeps_partial() && fs_err::metadata(&partial).is_ok_and(|m| m.len() > 0);
            if !worth_resuming {
                let _ = fs_err::remove_file(&partial);
            }
        }
        result
    }

    /// Stream `item` into `partial` (resuming what is there), retrying interrupted transfers.
    /// Returns the digest and size of the whole file; the caller adopts or removes it.
    async fn transfer(
        &self,
        item: &FetchItem,
        partial: &Path,
        id: usize,
    ) -> Result<(Digest, u64), DownloadError> {
        let io_error = |source| DownloadError::Io {
            path: partial.to_path_buf(),
            source,
        };
        let mut file = fs_err::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(partial)
            .map_err(io_error)?;
        // Hash what an earlier, interrupted run left behind (never more than the locked
        // size: a longer partial is not ours to trust, so start over).
        let mut hasher = Hasher::new();
        if item
            .size
            .is_some_and(|size| file.metadata().is_ok_and(|m| m.len() > size))
        {
            file.set_len(0).map_err(io_error)?;
        }
        {
            let mut buffer = vec![0u8; 1 << 16];
            loop {
                let n = file.read(&mut buffer).map_err(io_error)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buffer[..n]);
            }
        }
        let mut have = hasher.bytes();
        if have > 0 {
            tracing::info!(url = %redacted(&item.url), bytes = have, "resuming partial download");
        }
        self.reporter.advance(id, have);
        if item.size.is_some_and(|size| have >= size) {
            return Ok(hasher.finish());
        }
        file.seek(io::SeekFrom::Start(have)).map_err(io_error)?;
        let mut file = io::BufWriter::with_capacity(1 << 20, file);
        let mut body = ResumableBody::new(&item.url, have, self.client.retry_policy(), |from| {
            self.open_from(&item.url, from)
        });
        while let Some(piece) = body.next().await? {
            match piece {
                Piece::Restart => {
                    file.flush().map_err(io_error)?;
                    file.get_mut().set_len(0).map_err(io_error)?;
                    file.seek(io::SeekFrom::Start(0)).map_err(io_error)?;
                    hasher = Hasher::new();
                    self.reporter.restart(id);
                    have = 0;
                }
                Piece::Bytes(chunk) => {
                    let found = have + chunk.len() as u64;
                    if let Some(expected) = item.size.filter(|&expected| found > expected) {
                        return Err(DownloadError::TooLarge {
                            url: item.url.clone(),
                            expected,
                            found,
                        });
                    }
                    file.write_all(&chunk).map_err(io_error)?;
                    hasher.update(&chunk);
                    have = found;
                    self.reporter.advance(id, chunk.len() as u64);
                }
            }
        }
        file.flush().map_err(io_error)?;
        drop(file);
        if let Some(expected) = item.size.filter(|&expected| have != expected) {
            return Err(DownloadError::TooSmall {
                url: item.url.clone(),
                expected,
                found: have,
            });
        }
        Ok(hasher.finish())
    }
}

impl Downloader {
    /// The response for `url` from byte `from`; `None` when a range past 0 is past the end
    /// (the partial already holds the whole file).
    async fn open_from(&self, url: &Url, from: u64) -> Result<Option<Response>, DownloadError> {
        match self.client.get(url, range_headers(from)).await {
            Ok(response) => Ok(Some(response)),
            Err(HttpError::Status { status, .. })
                if status == StatusCode::RANGE_NOT_SATISFIABLE && from > 0 =>
            {
                Ok(None)
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// Copy a `file://` artifact (a mirror directory) into the store, hash-checked. Only a
/// regular file under one of `mirrors` is read, and never more than its locked size + 1.
fn copy_local(
    store: &BlobStore,
    item: &FetchItem,
    mirrors: &[PathBuf],
    reporter: &dyn Reporter,
) -> Result<PathBuf, DownloadError> {
    let not_allowed = || DownloadError::LocalNotAllowed {
        url: item.url.clone(),
        mirrors: mirrors.to_vec(),
    };
    let source: PathBuf = item.url.to_file_path().map_err(|()| not_allowed())?;
    // Canonical paths on both sides: `..` and symlinks cannot lead out of a mirror.
    let source = fs_err::canonicalize(&source).map_err(|_| not_allowed())?;
    let inside = mirrors
        .iter()
        .any(|mirror| fs_err::canonicalize(mirror).is_ok_and(|mirror| source.starts_with(&mirror)));
    if !inside {
        return Err(not_allowed());
    }
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DownloadError::Io { path, source }
    };
    // Opened without blocking and checked as opened: a FIFO swapped in never stalls it.
    let Ok(input) = crate::contained_file::open_regular(&source).map_err(io_error(&source))? else {
        return Err(DownloadError::NotAFile {
            url: item.url.clone(),
        });
    };
    let limit = item.size.map_or(u64::MAX, |size| size.saturating_add(1));
    let mut input = input.take(limit);
    let id = reporter.start(&item.name, item.size);
    let mut copy = || -> Result<Digest, DownloadError> {
        let mut pending = store.begin()?;
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            let n = input.read(&mut buffer).map_err(io_error(&source))?;
            if n == 0 {
                break;
            }
            pending
                .write_all(&buffer[..n])
                .map_err(io_error(&store.tmp_dir()))?;
            reporter.advance(id, n as u64);
        }
        let found = pending.bytes_written();
        match item.size {
            // Dropping `pending` deletes its temp file.
            Some(expected) if found > expected => Err(DownloadError::TooLarge {
                url: item.url.clone(),
                expected,
                found,
            }),
            Some(expected) if found < expected => Err(DownloadError::TooSmall {
                url: item.url.clone(),
                expected,
                found,
            }),
            _ => Ok(pending.commit(Some(&item.sha256), item.url.as_str())?.0),
        }
    };
    let result = copy();
    reporter.finish(id);
    Ok(store.path(&result?))
}
