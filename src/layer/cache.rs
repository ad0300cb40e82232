//! The layer cache: an unchanged layer is never re-tarred or re-compressed.
//!
//! A layer's bytes are a function of its inputs, so the cache is keyed by a digest of
//! them: the assembler's version string, the digests of the input artifacts, the
//! assembler's options (any serialisable value, hashed as canonical JSON), and the
//! [`BuildOptions`] that change bytes (mtime and compression, not thread count).
//! ```text
//! <root>/layers/<key-hex>.json   -> the Layer descriptor (digest, diff_id, size, media type);
//!                                   its mtime is the entry's last use
//! <root>/layers/<key-hex>.lock   -> held while the entry is looked up and built
//! <root>/blobs/sha256/<hex>      -> the blob itself (the shared BlobStore)
//! ```
//! The index file is written after the blob is committed and is itself renamed into
//! place atomically, so an interrupted build leaves no entry that points at nothing.
//! A hit is only a hit if the blob is present and its bytes still hash to its digest
//! ([`BlobStore::verified`]: an integrity record, rehashing when it no longer matches); a
//! missing or corrupt blob, or an unreadable index entry, is a miss, repaired by building
//! the layer again (with a warning).
//!
//! Concurrent builds sharing one cache: each entry has a lock file
//! (`<key-hex>.lock`, `flock(2)`), taken by [`LayerCache::get_or_build`] around the
//! lookup and the build, so two builds of the same layer build it once and different
//! layers build in parallel. Blobs and index entries are renamed into place, so readers
//! that take no lock see a whole entry or none.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::{build, BuildOptions, Layer, LayerContents, LayerError};
use crate::canonical::to_canonical_json;
use crate::cas::BlobStore;
use crate::digest::Digest;

/// The identity of a layer's inputs, computed by the caller's assembler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey(Digest);

#[derive(Serialize)]
struct KeyMaterial<'a, O: Serialize> {
    schema: &'static str,
    assembler: &'a str,
    inputs: &'a [Digest],
    options: &'a O,
}

impl CacheKey {
    /// `assembler`: name and version of the code that decides the layer's contents
    /// (bump it when that code changes); `inputs`: digests of every artifact read;
    /// `options`: everything else that changes the contents.
    pub fn new<O: Serialize>(assembler: &str, inputs: &[Digest], options: &O) -> Self {
        let material = KeyMaterial {
            schema: "cudastack.layer-cache.v1",
            assembler,
            inputs,
            options,
        };
        let bytes = to_canonical_json(&material).expect("cache key material serialises");
        CacheKey(Digest::of_bytes(&bytes))
    }

    /// The key combined with the build options that change the blob's bytes.
    fn with_build(&self, options: &BuildOptions) -> Digest {
        let bytes = to_canonical_json(&serde_json::json!({
            "key": self.0,
            "mtime": options.mtime,
            "compression": options.compression,
            // The engine too: the same settings give other bytes after an upgrade.
            "encoder": options.compression.encoder(),
        }))
        .expect("cache key serialises");
        Digest::of_bytes(&bytes)
    }

    pub fn digest(&self) -> Digest {
        self.0
    }
}

/// Counters, so callers and tests can see what a build actually did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the index with no tar or compression work.
    pub hits: u64,
    /// Layers tarred and compressed.
    pub builds: u64,
}

/// One entry of the layer cache's index (`layers/<hex>.json`).
#[derive(Debug, Clone)]
pub struct IndexEntry {
    pub path: PathBuf,
    /// The entry's descriptor; None when the file cannot be read as one.
    pub layer: Option<Layer>,
    /// Size of the index file itself.
    pub size: u64,
    pub last_use: std::time::SystemTime,
}

/// A layer cache over a [`BlobStore`].
#[derive(Debug)]
pub struct LayerCache {
    store: BlobStore,
    index_dir: PathBuf,
    hits: AtomicU64,
    builds: AtomicU64,
}

impl LayerCache {
    /// Open the cache whose index lives in `<store root>/layers`.
    pub fn open(store: BlobStore) -> Result<Self, LayerError> {
        let index_dir = store.root().join("layers");
        fs_err::create_dir_all(&index_dir).map_err(|source| LayerError::Io {
            path: index_dir.clone(),
            source,
        })?;
        Ok(Self {
            store,
            index_dir,
            hits: AtomicU64::new(0),
            builds: AtomicU64::new(0),
        })
    }

    pub fn store(&self) -> &BlobStore {
        &self.store
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            builds: self.builds.load(Ordering::Relaxed),
        }
    }

    fn index_path(&self, key: &CacheKey, options: &BuildOptions) -> PathBuf {
        self.index_dir
            .join(format!("{}.json", key.with_build(options).hex()))
    }

    /// The cached layer for these inputs, if its index entry and blob are present.
    pub fn get(&self, key: &CacheKey, options: &BuildOptions) -> Result<Option<Layer>, LayerError> {
        let path = self.index_path(key, options);
        let bytes = match fs_err::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(LayerError::Io { path, source }),
        };
        let mut layer: Layer = match serde_json::from_slice(&bytes) {
            Ok(layer) => layer,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "unreadable layer cache entry; building the layer again");
                return Ok(None);
            }
        };
        match self.store.verified(&layer.digest)? {
            Some(blob) if fs_err::metadata(&blob).is_ok_and(|m| m.len() == layer.size) => {
                // The entry's mtime is its last use (`cudastack cache prune`).
                crate::cas::touch_last_use(&path);
                layer.blob = blob;
                Ok(Some(layer))
            }
            // Missing, or removed by `verified` as corrupt (it warned): build it again.
            _ => Ok(None),
        }
    }

    fn lock_path(&self, key: &CacheKey, options: &BuildOptions) -> PathBuf {
        self.index_dir
            .join(format!("{}.lock", key.with_build(options).hex()))
    }

    /// Return the cached layer, or build it from `contents()` and record it. On a hit
    /// `contents` is not called and nothing is tarred or compressed.
    pub fn get_or_build(
        &self,
        key: &CacheKey,
        options: &BuildOptions,
        contents: impl FnOnce() -> Result<LayerContents, LayerError>,
    ) -> Result<Layer, LayerError> {
        if let Some(layer) = self.get(key, options)? {
            self.hits.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(digest = %layer.digest, "layer cache hit");
            return Ok(layer);
        }
        // Another build may be writing this layer: wait for it, then look again.
        let lock_path = self.lock_path(key, options);
        let _lock = crate::atomic_file::lock(&lock_path).map_err(|source| LayerError::Io {
            path: lock_path.clone(),
            source,
        })?;
        if let Some(layer) = self.get(key, options)? {
            self.hits.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(digest = %layer.digest, "layer cache hit after waiting for another build");
            return Ok(layer);
        }
        let contents = contents()?;
        let layer = build(&self.store, &contents, options)?;
        self.builds.fetch_add(1, Ordering::Relaxed);
        self.record(key, options, &layer)?;
        Ok(layer)
    }

    /// Every entry of the index, for `cudastack cache`: its file, its layer (None when it
    /// cannot be read) and its last use (the file's mtime, touched by [`LayerCache::get`]).
    pub fn entries(&self) -> Result<Vec<IndexEntry>, LayerError> {
        let io = |path: &PathBuf| {
            let path = path.clone();
            move |source| LayerError::Io { path, source }
        };
        let mut entries = Vec::new();
        for dirent in fs_err::read_dir(&self.index_dir).map_err(io(&self.index_dir))? {
            let path = dirent.map_err(io(&self.index_dir))?.path();
            if path.extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            let Ok(meta) = fs_err::metadata(&path) else {
                continue; // removed by a concurrent prune
            };
            let layer = fs_err::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Layer>(&bytes).ok());
            entries.push(IndexEntry {
                last_use: meta.modified().map_err(io(&path))?,
                size: meta.len(),
                path,
                layer,
            });
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    /// Remove `entry` if no build used it since `cutoff` and none is building it now (its
    /// lock is free). Returns whether it was removed; its blob is the store's to prune.
    pub fn remove_if_unused_since(
        &self,
        entry: &IndexEntry,
        cutoff: std::time::SystemTime,
    ) -> Result<bool, LayerError> {
        let lock_path = entry.path.with_extension("lock");
        let io = |path: &PathBuf| {
            let path = path.clone();
            move |source| LayerError::Io { path, source }
        };
        let Some(_lock) = crate::cas::try_lock(&lock_path).map_err(io(&lock_path))? else {
            return Ok(false);
        };
        // Looked at again under the lock: a build may have used it since it was listed.
        let used = fs_err::metadata(&entry.path).and_then(|m| m.modified());
        if used.is_ok_and(|used| used >= cutoff) {
            return Ok(false);
        }
        match fs_err::remove_file(&entry.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(LayerError::Io {
                path: entry.path.clone(),
                source,
            }),
        }
    }

    fn record(
        &self,
        key: &CacheKey,
        options: &BuildOptions,
        layer: &Layer,
    ) -> Result<(), LayerError> {
        let path = self.index_path(key, options);
        let bytes = to_canonical_json(layer).expect("layer descriptor serialises");
        let tmp_dir = self.store.tmp_dir();
        let io = |path: PathBuf| move |source| LayerError::Io { path, source };
        let mut temp =
            crate::atomic_file::temp_in(&tmp_dir, "layer-index-").map_err(io(tmp_dir.clone()))?;
        std::io::Write::write_all(&mut temp, &bytes).map_err(io(temp.path().to_path_buf()))?;
        crate::atomic_file::persist(temp, &path).map_err(io(path.clone()))
    }
}
