//! Layers: from entries to a verified, compressed blob in the content-addressed store.
//!
//! Position in the pipeline: after `fetch` (which puts artifacts in the [`BlobStore`])
//! and the assemblers in `stack` (which decide *what* goes into each layer), before
//! `oci` (which puts layers into images and writes them out).
//!
//! ```text
//! Entry list / directory ──LayerContents (sort, parents, escape checks)──┐
//!   [producer thread] tar writer (fixed mtime, owners, modes) ─> sha256 = diff_id
//!     ─> 1 MiB chunks ─> [caller thread] compressor (gzip: one libdeflate member per
//!        1 MiB block on workers | zstd MT)
//!     ─> sha256 = digest ─> BlobStore (uncompressed layers skip the pipeline:
//!        the blob is the tar and its digest is the diff_id)
//! ```
//! One pass produces the diff_id, the digest and the size; no layer is held in memory
//! and nothing is read twice. A [`LayerCache`] keyed by the layer's inputs makes an
//! unchanged layer cost one small JSON read.
//!
//! This module must not decide what a layer contains, and must not know about images.

mod cache;
mod compress;
mod deflated;
mod entry;
mod tar_writer;
mod walk;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use oci_spec::image::MediaType;
use serde::{Deserialize, Serialize};

use crate::cache::{BlobStore, CacheError};
use crate::digest::{Digest, HashingWriter};

pub use cache::{CacheKey, CacheStats, LayerCache};
pub use compress::{Compression, Compressor, ParallelGzip, DEFAULT_GZIP_LEVEL};
pub use deflated::{Method, ZipMember, COPY_DEFLATE_FROM};
pub use entry::{Entry, EntryKind, FileSource, LayerContents, LayerPath, OpenContent};
pub use tar_writer::{
    write_layer_tar, write_layer_tar_deflated, ContentError, DeflatedSink, Header, TarWriter,
};
pub use walk::{DirOptions, ModePolicy, Recorded, RecordedOwners};

/// Errors from building layers.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("path `{path}` cannot be used in a layer: it {reason}")]
    InvalidPath { path: String, reason: &'static str },
    #[error("symlink `{path}` -> `{target}` points outside the layer root")]
    SymlinkEscape { path: String, target: String },
    #[error("hardlink `{path}` -> `{target}`: the target {reason}")]
    HardlinkTarget {
        path: String,
        target: String,
        reason: &'static str,
    },
    #[error("`{path}` appears twice in the layer")]
    Duplicate { path: String },
    #[error("`{path}` is below `{parent}`, which is not a directory in this layer")]
    ParentNotDirectory { path: String, parent: String },
    #[error("mode {mode:#o} of `{path}` has bits beyond 0o7777")]
    InvalidMode { path: String, mode: u32 },
    #[error("`{path}` is not valid UTF-8; layer paths must be")]
    NonUtf8Path { path: PathBuf },
    #[error("`{path}` is a device, fifo or socket; layers hold only files, directories and links")]
    UnsupportedFileType { path: PathBuf },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to read the content of `{source_name}`")]
    ReadContent {
        source_name: String,
        #[source]
        source: io::Error,
    },
    #[error("`{source_name}` changed while it was being archived\n  Expected: {expected} bytes\n  Found:    {found} bytes")]
    SizeMismatch {
        source_name: String,
        expected: u64,
        found: u64,
    },
    #[error("failed to write `{entry}` to the layer stream")]
    WriteTar {
        entry: String,
        #[source]
        source: io::Error,
    },
    #[error("`{member}` of `{archive}` {reason}")]
    ArchiveMember {
        archive: PathBuf,
        member: String,
        reason: String,
    },
    #[error("failed to compress the layer stream")]
    Compress(#[source] io::Error),
    #[error(transparent)]
    Store(#[from] CacheError),
}

/// How a layer is written: everything that changes its bytes, plus parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildOptions {
    /// SOURCE_DATE_EPOCH: the mtime of every entry, from the recipe/lock.
    pub mtime: u64,
    pub compression: Compression,
    /// Compression threads; never changes the output bytes.
    pub threads: usize,
}

impl BuildOptions {
    pub fn new(mtime: u64, compression: Compression) -> Self {
        Self {
            mtime,
            compression,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// A finished layer blob: what a manifest and a config need to know about it, and where
/// its bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// sha256 of the (compressed) blob.
    pub digest: Digest,
    /// sha256 of the uncompressed tar (the config's `rootfs.diff_ids`).
    pub diff_id: Digest,
    /// Size of the blob in bytes.
    pub size: u64,
    /// Size of the uncompressed tar, when known (unknown for layers read from a layout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncompressed_size: Option<u64>,
    pub media_type: MediaType,
    /// Where the blob's bytes are (a BlobStore or an OCI layout's `blobs/sha256`).
    #[serde(skip)]
    pub blob: PathBuf,
}

impl Layer {
    /// Reopen the blob's bytes.
    pub fn open(&self) -> Result<fs_err::File, LayerError> {
        fs_err::File::open(&self.blob).map_err(|source| LayerError::Io {
            path: self.blob.clone(),
            source,
        })
    }

    pub fn blob_path(&self) -> &Path {
        &self.blob
    }
}

const PIPELINE_CHUNK: usize = 1 << 20;
const PIPELINE_DEPTH: usize = 4;

/// What the producing thread sends the compressing one: tar bytes to compress, or a copied
/// member's deflate data (gzip layers only, [`deflated`]).
enum Piece {
    Tar(Vec<u8>),
    BeginDeflated,
    Deflated(Vec<u8>),
    EndDeflated { crc32: u32, size: u64 },
}

/// Cuts the tar stream into chunks for the compressing thread. While a member's deflate
/// data is copied, the content written (already hashed for the diff_id) is not sent: its
/// compressed bytes stand for it.
struct PieceSender {
    sender: mpsc::SyncSender<Piece>,
    chunk: Vec<u8>,
    in_deflated: bool,
}

impl PieceSender {
    fn send(&mut self, piece: Piece) -> io::Result<()> {
        self.sender
            .send(piece)
            .map_err(|_| io::Error::other("the layer compressor stopped"))
    }

    fn send_chunk(&mut self) -> io::Result<()> {
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(PIPELINE_CHUNK));
        self.send(Piece::Tar(chunk))
    }

    fn finish(mut self) -> io::Result<()> {
        if !self.chunk.is_empty() {
            self.send_chunk()?;
        }
        Ok(())
    }
}

impl Write for PieceSender {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.in_deflated {
            return Ok(buf.len());
        }
        let n = (PIPELINE_CHUNK - self.chunk.len()).min(buf.len());
        self.chunk.extend_from_slice(&buf[..n]);
        if self.chunk.len() == PIPELINE_CHUNK {
            self.send_chunk()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl DeflatedSink for PieceSender {
    fn begin_deflated(&mut self) -> io::Result<()> {
        if !self.chunk.is_empty() {
            self.send_chunk()?;
        }
        self.in_deflated = true;
        self.send(Piece::BeginDeflated)
    }
    fn deflated(&mut self, compressed: &[u8]) -> io::Result<()> {
        self.send(Piece::Deflated(compressed.to_vec()))
    }
    fn end_deflated(&mut self, crc32: u32, size: u64) -> io::Result<()> {
        self.in_deflated = false;
        self.send(Piece::EndDeflated { crc32, size })
    }
}

/// Pass one piece to the compressor.
fn compress_piece<W: Write>(compressor: &mut Compressor<W>, piece: Piece) -> io::Result<()> {
    match piece {
        Piece::Tar(chunk) => compressor.write_all(&chunk),
        Piece::BeginDeflated => compressor.gzip()?.begin_deflated(),
        Piece::Deflated(compressed) => compressor.gzip()?.write_deflated(&compressed),
        Piece::EndDeflated { crc32, size } => compressor.gzip()?.end_deflated(crc32, size),
    }
}

/// Write `contents` as a layer into `store`: tar, hash, compress, hash, commit, in one
/// streaming pass. Memory use is bounded by the compressor's in-flight blocks.
pub fn build(
    store: &BlobStore,
    contents: &LayerContents,
    options: &BuildOptions,
) -> Result<Layer, LayerError> {
    let pending = store.begin()?;
    if options.compression == Compression::None {
        // The blob is the tar: the store's own hash is the diff_id, so hash once.
        let pending = write_layer_tar(contents, options.mtime, pending)?;
        let (digest, size) = pending.commit(None, "layer")?;
        return Ok(Layer {
            digest,
            diff_id: digest,
            size,
            uncompressed_size: Some(size),
            media_type: options.compression.media_type(),
            blob: store.path(&digest),
        });
    }
    let mut compressor = options
        .compression
        .writer(pending, options.threads)
        .map_err(LayerError::Compress)?;
    // Two stages run at once: a producer thread walks the entries, reads the files and
    // hashes the tar (diff_id); this thread feeds the compressor, whose workers use the
    // other cores. Bounded chunks keep memory flat.
    let (sender, receiver) = mpsc::sync_channel::<Piece>(PIPELINE_DEPTH);
    let copy_deflate = matches!(options.compression, Compression::Gzip { .. });
    let (diff_id, uncompressed_size) = std::thread::scope(|scope| {
        let producer = scope.spawn(move || {
            let sink = HashingWriter::new(PieceSender {
                sender,
                chunk: Vec::with_capacity(PIPELINE_CHUNK),
                in_deflated: false,
            });
            let hashing = if copy_deflate {
                write_layer_tar_deflated(contents, options.mtime, sink)?
            } else {
                write_layer_tar(contents, options.mtime, sink)?
            };
            let (sink, diff_id, size) = hashing.finish();
            sink.finish().map_err(|source| LayerError::WriteTar {
                entry: "end of the layer".to_string(),
                source,
            })?;
            Ok::<_, LayerError>((diff_id, size))
        });
        let mut written = Ok(());
        for piece in receiver.iter() {
            if let Err(e) = compress_piece(&mut compressor, piece) {
                written = Err(e);
                break;
            }
        }
        // Dropping the receiver stops a producer that is still sending.
        drop(receiver);
        let produced = match producer.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        written.map_err(LayerError::Compress)?;
        produced
    })?;
    let pending = compressor.finish().map_err(LayerError::Compress)?;
    let (digest, size) = pending.commit(None, "layer")?;
    Ok(Layer {
        digest,
        diff_id,
        size,
        uncompressed_size: Some(uncompressed_size),
        media_type: options.compression.media_type(),
        blob: store.path(&digest),
    })
}
