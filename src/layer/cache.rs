//! The layer cache: an unchanged layer is never re-tarred or re-compressed.
//!
//! A layer's bytes are a function of its inputs, so the cache is keyed by a digest of
//! them: the assembler's version string, the digests of the input artifacts, the
//! assembler's options (any serialisable value, hashed as canonical JSON), and the
//! [`BuildOptions`] that change bytes (mtime and compression, not thread count).
//! The entries are the cache directory's layer [`Records`] (`layers/<key-hex>.json`: the
//! Layer descriptor, whose top-level `digest` is the blob it keeps; its mtime is the
//! entry's last use), the blobs are the shared [`BlobStore`]'s. The record is written
//! after the blob is committed and is itself renamed into place atomically, so an
//! interrupted build leaves no entry that points at nothing.
//! A hit is only a hit if the blob is present and its bytes still hash to its digest
//! ([`BlobStore::verified`]: an integrity record, rehashing when it no longer matches); a
//! missing or corrupt blob, or an unreadable index entry, is a miss, repaired by building
//! the layer again (with a warning).
//!
//! Concurrent builds sharing one cache: each entry has a lock ([`Records::lock`]), taken
//! by [`LayerCache::get_or_build`] around the lookup and the build, so two builds of the same layer build it once and different
//! layers build in parallel. Blobs and index entries are renamed into place, so readers
//! that take no lock see a whole entry or none.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::{build, BuildOptions, Layer, LayerContents, LayerError};
use crate::cache::{BlobStore, Records};
use crate::canonical::to_canonical_json;
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

/// A key is its digest for the cache's staging area, which names trees by digest (the
/// cache sits below this module and knows no keys of its own).
impl std::borrow::Borrow<Digest> for CacheKey {
    fn borrow(&self) -> &Digest {
        &self.0
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

/// A layer cache over a [`BlobStore`].
#[derive(Debug)]
pub struct LayerCache {
    store: BlobStore,
    records: Records,
    hits: AtomicU64,
    builds: AtomicU64,
}

impl LayerCache {
    /// Open the cache whose records are the layer records of `store`'s cache directory.
    pub fn open(store: BlobStore) -> Result<Self, LayerError> {
        let records = Records::layers(store.cache_dir());
        records.create()?;
        Ok(Self {
            store,
            records,
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

    /// The cached layer for these inputs, if its index entry and blob are present.
    pub fn get(&self, key: &CacheKey, options: &BuildOptions) -> Result<Option<Layer>, LayerError> {
        let record = key.with_build(options);
        let Some(bytes) = self.records.read(&record)? else {
            return Ok(None);
        };
        let mut layer: Layer = match serde_json::from_slice(&bytes) {
            Ok(layer) => layer,
            Err(error) => {
                let path = self.records.path(&record);
                tracing::warn!(path = %path.display(), %error, "unreadable layer cache entry; building the layer again");
                return Ok(None);
            }
        };
        match self.store.verified(&layer.digest)? {
            Some(blob) if fs_err::metadata(&blob).is_ok_and(|m| m.len() == layer.size) => {
                // The entry's mtime is its last use (`cudastack cache prune`).
                self.records.touch(&record);
                layer.blob = blob;
                Ok(Some(layer))
            }
            // Missing, or removed by `verified` as corrupt (it warned): build it again.
            _ => Ok(None),
        }
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
        let _lock = self.records.lock(&key.with_build(options))?;
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

    fn record(
        &self,
        key: &CacheKey,
        options: &BuildOptions,
        layer: &Layer,
    ) -> Result<(), LayerError> {
        let bytes = to_canonical_json(layer).expect("layer descriptor serialises");
        Ok(self.records.write(&key.with_build(options), &bytes)?)
    }
}
