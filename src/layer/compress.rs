//! Layer compression: deterministic parallel gzip, multithreaded zstd, or none.
//!
//! Compression dominates build time (DESIGN.md, "Where the time goes"), so both codecs
//! use every core given to them, and both produce the same bytes whatever that number is:
//! - gzip is libdeflate (docs/compression.md: at level 6 1.3-1.7x the speed of zlib-rs,
//!   the engine before it, and smaller; at level 1, the default, 2.5x).
//!   libdeflate has no streaming API and no preset dictionary, so the tar stream is cut
//!   into fixed [`GZIP_BLOCK`] blocks and each block becomes a complete gzip member of its
//!   own, compressed on a worker; the members are written in order. RFC 1952 section 2.2
//!   lets a gzip file be a series of members, and every reader of layers decompresses
//!   them as one stream (Go's compress/gzip in Docker, containerd, skopeo and crane;
//!   gunzip, pigz, Python's gzip, flate2's `MultiGzDecoder`). Block boundaries depend only
//!   on the byte stream, never on thread count or write sizes. Every member header has no
//!   name, mtime 0, XFL from the level and OS byte 255 ("unknown").
//!   libdeflate's compressor picks SIMD code only where the result cannot differ (CRC-32,
//!   hash-table fills), so the bytes are also the same on every CPU
//!   (tests/gzip_bytes.rs runs it under emulated CPUs without SSE4/AVX/PCLMUL).
//! - zstd always runs in zstd's multithreaded mode (at least one worker): its output
//!   then does not depend on the number of workers, while the single-threaded mode
//!   would produce a different (equally valid) frame layout.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use oci_spec::image::MediaType;
use serde::{Deserialize, Serialize};

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "codec")]
pub enum Compression {
    /// Plain tar, for outputs that only go to the local daemon (`docker load`).
    None,
    /// gzip: what every runtime and importer reads. Levels 1-9 (libdeflate's 10-12 are
    /// left out: 4-6x the time of 6 and 9 MB per worker for 1-2% less; docs/compression.md).
    Gzip { level: u32 },
    /// zstd: faster and smaller, for registries whose consumers support it. Levels 1-19.
    Zstd { level: i32 },
}

/// The default gzip level: libdeflate's 1, 1.7x the speed of 6 for about 4% more bytes on
/// CUDA libraries (docs/compression.md has the measurements).
pub const DEFAULT_GZIP_LEVEL: u32 = 1;

impl Default for Compression {
    /// gzip level 1: on 2 cores the build's time goal needs the fastest level, which costs
    /// 1.5-7% in size against 6 (the tables in docs/compression.md).
    fn default() -> Self {
        Compression::Gzip {
            level: DEFAULT_GZIP_LEVEL,
        }
    }
}

impl Compression {
    /// The OCI media type of a layer compressed this way.
    pub fn media_type(&self) -> MediaType {
        match self {
            Compression::None => MediaType::ImageLayer,
            Compression::Gzip { .. } => MediaType::ImageLayerGzip,
            Compression::Zstd { .. } => MediaType::ImageLayerZstd,
        }
    }

    /// What makes the bytes beyond these settings (library, its version, framing): part
    /// of the layer cache key, so an upgrade never reuses layers the old encoder made.
    pub fn encoder(&self) -> String {
        match self {
            Compression::None => "tar".to_string(),
            // Which files' deflate data is copied changes the bytes too.
            Compression::Gzip { .. } => format!(
                "{GZIP_ENCODER}-copies-deflate-from-{}",
                super::deflated::COPY_DEFLATE_FROM
            ),
            Compression::Zstd { .. } => format!("zstd-{}", zstd::zstd_safe::version_string()),
        }
    }

    /// Start compressing into `out` with up to `threads` worker threads.
    pub fn writer<W: Write + Send + 'static>(
        &self,
        out: W,
        threads: usize,
    ) -> io::Result<Compressor<W>> {
        Ok(match *self {
            Compression::None => Compressor::None(out),
            Compression::Gzip { level } => {
                Compressor::Gzip(Box::new(ParallelGzip::new(out, level, threads)?))
            }
            Compression::Zstd { level } => {
                let mut encoder = zstd::stream::write::Encoder::new(out, level)?;
                // Always multithreaded (>= 1 worker) so the frame does not depend on
                // the thread count; see the module docs.
                encoder.multithread(threads.max(1) as u32)?;
                encoder.include_checksum(true)?;
                encoder.include_contentsize(false)?;
                Compressor::Zstd(encoder)
            }
        })
    }
}

/// A streaming compressor; call [`Compressor::finish`] to complete the stream.
pub enum Compressor<W: Write> {
    None(W),
    Gzip(Box<ParallelGzip<W>>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
}

impl<W: Write> Compressor<W> {
    /// Flush everything, write the trailer and return the inner writer.
    pub fn finish(self) -> io::Result<W> {
        match self {
            Compressor::None(mut out) => {
                out.flush()?;
                Ok(out)
            }
            Compressor::Gzip(gzip) => (*gzip).finish(),
            Compressor::Zstd(encoder) => encoder.finish(),
        }
    }
}

impl<W: Write> Compressor<W> {
    /// The gzip compressor, which alone can take deflate data as it is.
    pub fn gzip(&mut self) -> io::Result<&mut ParallelGzip<W>> {
        match self {
            Compressor::Gzip(gzip) => Ok(gzip),
            _ => Err(io::Error::other(
                "only a gzip layer takes deflate data as it is",
            )),
        }
    }
}

impl<W: Write> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Compressor::None(out) => out.write(buf),
            Compressor::Gzip(gzip) => gzip.write(buf),
            Compressor::Zstd(encoder) => encoder.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        // A flush must not change the compressed bytes, so it is a no-op for gzip
        // (blocks are cut by size only); finish() writes everything.
        match self {
            Compressor::None(out) => out.flush(),
            Compressor::Gzip(_) => Ok(()),
            Compressor::Zstd(_) => Ok(()),
        }
    }
}

/// Input bytes per gzip member. Larger blocks lose less to the restarted 32 KiB window
/// (docs/compression.md: 1 MiB costs 0.1% against one stream) but hold more memory per
/// block in flight. Changing it changes every gzip layer's bytes: see [`GZIP_ENCODER`].
pub const GZIP_BLOCK: usize = 1 << 20;

/// What makes the gzip bytes, beyond the level: part of the layer cache key, so a layer
/// compressed by another engine, libdeflate version or block size is never reused as if
/// this one had made it. Bump it with libdeflate-sys (a unit test compares Cargo.lock).
pub const GZIP_ENCODER: &str = "libdeflate-1.26.1-members-1MiB";

/// Blocks in flight beyond one per worker: enough to keep every worker busy while the
/// next block is filled and an earlier one is awaited; each block in flight holds its
/// input and then its member (about 1 MiB each), which bounds memory.
const SPARE_BLOCKS: u64 = 2;

struct Job {
    sequence: u64,
    data: Vec<u8>,
}

type JobResult = (u64, io::Result<Vec<u8>>);

/// Deterministic parallel gzip (see the module docs). With `threads <= 1` blocks are
/// compressed on the calling thread, producing the same bytes.
pub struct ParallelGzip<W: Write> {
    out: W,
    block: Vec<u8>,
    next_sequence: u64,
    next_to_write: u64,
    /// Members compressed out of order, waiting for those before them.
    ready: BTreeMap<u64, Vec<u8>>,
    /// Blocks dispatched but not yet written at most; bounds memory.
    max_outstanding: u64,
    jobs: Option<Sender<Job>>,
    results: Option<Receiver<JobResult>>,
    workers: Vec<JoinHandle<()>>,
    /// The compressor of the calling thread when there are no workers.
    inline: Option<libdeflater::Compressor>,
    /// Members whose deflate data the caller gave ([`Self::begin_deflated`]).
    copied_members: u64,
}

impl<W: Write> ParallelGzip<W> {
    /// `level`: 1-9, clamped (docs/compression.md says why not libdeflate's 10-12).
    pub fn new(out: W, level: u32, threads: usize) -> io::Result<Self> {
        let level = compression_level(level)?;
        let mut gzip = Self {
            out,
            block: Vec::with_capacity(GZIP_BLOCK),
            next_sequence: 0,
            next_to_write: 0,
            ready: BTreeMap::new(),
            max_outstanding: threads.max(1) as u64 + SPARE_BLOCKS,
            jobs: None,
            results: None,
            workers: Vec::new(),
            inline: None,
            copied_members: 0,
        };
        if threads <= 1 {
            gzip.inline = Some(libdeflater::Compressor::new(level));
            return Ok(gzip);
        }
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (result_tx, result_rx) = mpsc::channel::<JobResult>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        for index in 0..threads {
            let job_rx = Arc::clone(&job_rx);
            let result_tx = result_tx.clone();
            let worker = std::thread::Builder::new()
                .name(format!("gzip-{index}"))
                .spawn(move || {
                    // One compressor per worker: libdeflate keeps no state between calls,
                    // so reusing it cannot make a member depend on the one before.
                    let mut compressor = libdeflater::Compressor::new(level);
                    loop {
                        let job = match job_rx.lock() {
                            Ok(receiver) => receiver.recv(),
                            Err(_) => return,
                        };
                        let Ok(job) = job else { return };
                        // A panic must come back as this block's error: a worker that
                        // died silently would leave the writer waiting for it forever.
                        let member = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            gzip_member(&mut compressor, &job.data)
                        }))
                        .unwrap_or_else(|_| {
                            Err(io::Error::other("the gzip worker panicked on this block"))
                        });
                        if result_tx.send((job.sequence, member)).is_err() {
                            return;
                        }
                    }
                })?;
            gzip.workers.push(worker);
        }
        gzip.jobs = Some(job_tx);
        gzip.results = Some(result_rx);
        Ok(gzip)
    }

    fn dispatch(&mut self) -> io::Result<()> {
        let data = std::mem::replace(&mut self.block, Vec::with_capacity(GZIP_BLOCK));
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        if let Some(compressor) = self.inline.as_mut() {
            let member = gzip_member(compressor, &data)?;
            self.out.write_all(&member)?;
            self.next_to_write += 1;
            return Ok(());
        }
        while self.next_sequence - self.next_to_write > self.max_outstanding {
            self.collect(true)?;
        }
        self.jobs
            .as_ref()
            .expect("workers run until finish")
            .send(Job { sequence, data })
            .map_err(|_| io::Error::other("gzip worker thread stopped"))?;
        self.collect(false)
    }

    /// Receive finished members (waiting for one when `block`) and write those whose
    /// turn has come.
    fn collect(&mut self, block: bool) -> io::Result<()> {
        let Some(results) = self.results.as_ref() else {
            return Ok(());
        };
        let mut received = Vec::new();
        if block {
            received.push(
                results
                    .recv()
                    .map_err(|_| io::Error::other("gzip worker thread stopped"))?,
            );
        }
        while let Ok(result) = results.try_recv() {
            received.push(result);
        }
        for (sequence, member) in received {
            self.ready.insert(sequence, member?);
        }
        while let Some(member) = self.ready.remove(&self.next_to_write) {
            self.out.write_all(&member)?;
            self.next_to_write += 1;
        }
        Ok(())
    }

    /// Start a member whose deflate data the caller has (a wheel member's,
    /// [`super::deflated`]): what was written before it is compressed and written out
    /// first, then the member's header. Its bytes follow with [`Self::write_deflated`],
    /// its trailer with [`Self::end_deflated`].
    pub fn begin_deflated(&mut self) -> io::Result<()> {
        if !self.block.is_empty() {
            self.dispatch()?;
        }
        while self.next_to_write < self.next_sequence {
            self.collect(true)?;
        }
        // No name, mtime 0, XFL 0 (the level is the archive's, not known), OS 255.
        self.out
            .write_all(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255])?;
        self.copied_members += 1;
        Ok(())
    }

    pub fn write_deflated(&mut self, compressed: &[u8]) -> io::Result<()> {
        self.out.write_all(compressed)
    }

    /// The trailer of a copied member: the content's CRC-32 and its size modulo 2^32.
    pub fn end_deflated(&mut self, crc32: u32, size: u64) -> io::Result<()> {
        self.out.write_all(&crc32.to_le_bytes())?;
        self.out.write_all(&(size as u32).to_le_bytes())
    }

    /// Compress what is left, wait for every member, stop the workers.
    pub fn finish(mut self) -> io::Result<W> {
        // An empty layer is still one (empty) member: a gzip file has at least one.
        if !self.block.is_empty() || self.next_sequence + self.copied_members == 0 {
            self.dispatch()?;
        }
        while self.next_to_write < self.next_sequence {
            self.collect(true)?;
        }
        self.jobs = None;
        for worker in self.workers.drain(..) {
            worker
                .join()
                .map_err(|_| io::Error::other("gzip worker thread panicked"))?;
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> Write for ParallelGzip<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = GZIP_BLOCK - self.block.len();
        let n = room.min(buf.len());
        self.block.extend_from_slice(&buf[..n]);
        if self.block.len() == GZIP_BLOCK {
            self.dispatch()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// libdeflate's level for a gzip level: 1-9, clamped (0 would store, not compress).
fn compression_level(level: u32) -> io::Result<libdeflater::CompressionLvl> {
    let clamped = level.clamp(1, 9) as i32;
    libdeflater::CompressionLvl::new(clamped)
        .map_err(|error| io::Error::other(format!("gzip level {clamped}: {error:?}")))
}

/// One block as one complete gzip member: header (no name, mtime 0, XFL, OS 255),
/// deflate data, CRC-32 and length of this block.
fn gzip_member(compressor: &mut libdeflater::Compressor, data: &[u8]) -> io::Result<Vec<u8>> {
    let mut member = vec![0; compressor.gzip_compress_bound(data.len())];
    // The bound is libdeflate's worst case, so running out of room is a bug, not input.
    let size = compressor
        .gzip_compress(data, &mut member)
        .map_err(|error| {
            io::Error::other(format!("libdeflate gzip of {} bytes: {error}", data.len()))
        })?;
    member.truncate(size);
    Ok(member)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn sample(len: usize) -> Vec<u8> {
        // Compressible but not trivial: words with a pseudo-random walk.
        let mut state = 0x1234_5678u32;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            out.extend_from_slice(format!("word{} ", state % 5000).as_bytes());
        }
        out.truncate(len);
        out
    }

    fn compress(compression: Compression, threads: usize, data: &[u8], chunk: usize) -> Vec<u8> {
        let mut writer = compression.writer(Vec::new(), threads).unwrap();
        for piece in data.chunks(chunk) {
            writer.write_all(piece).unwrap();
        }
        writer.finish().unwrap()
    }

    #[test]
    fn gzip_is_identical_for_any_thread_count_and_write_size_and_round_trips() {
        // Enough blocks that workers are reused for non-consecutive blocks: a deflate
        // state that leaks from one block into the next shows up here.
        let data = sample(9 * GZIP_BLOCK + 12345);
        let gzip = Compression::Gzip { level: 6 };
        let one = compress(gzip, 1, &data, 4096);
        let two = compress(gzip, 2, &data, 777);
        let three = compress(gzip, 3, &data, GZIP_BLOCK * 2);
        let two_again = compress(gzip, 2, &data, 100_000);
        assert_eq!(one, two);
        assert_eq!(one, three);
        assert_eq!(one, two_again);
        assert_eq!(decode(&one), data);
        assert!(one.len() < data.len() / 2);
        assert_eq!(
            member_headers(&one).len(),
            10,
            "one member per started block"
        );
        for header in member_headers(&one) {
            assert_eq!(header, [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
        }
    }

    /// Every member's 10-byte header, walking the members by their own lengths (each
    /// decoded on its own, so a member that only decodes as part of the stream fails).
    fn member_headers(mut gzip: &[u8]) -> Vec<[u8; 10]> {
        let mut headers = Vec::new();
        while !gzip.is_empty() {
            headers.push(gzip[..10].try_into().unwrap());
            let mut decoder = flate2::bufread::GzDecoder::new(gzip);
            std::io::copy(&mut decoder, &mut std::io::sink()).unwrap();
            gzip = decoder.into_inner();
        }
        headers
    }

    fn decode(gzip: &[u8]) -> Vec<u8> {
        let mut decoded = Vec::new();
        flate2::read::MultiGzDecoder::new(gzip)
            .read_to_end(&mut decoded)
            .unwrap();
        decoded
    }

    #[test]
    fn gzip_levels_set_the_header_and_out_of_range_levels_are_clamped() {
        let data = sample(100_000);
        for (level, xfl) in [(0, 4), (1, 4), (6, 0), (9, 2), (12, 2), (99, 2)] {
            let out = compress(Compression::Gzip { level }, 1, &data, 4096);
            assert_eq!(out[8], xfl, "XFL of level {level}");
            assert_eq!(decode(&out), data, "level {level}");
        }
        let fastest = compress(Compression::Gzip { level: 1 }, 1, &data, 4096).len();
        let smallest = compress(Compression::Gzip { level: 9 }, 1, &data, 4096);
        assert!(
            smallest.len() < fastest,
            "level 9 {} bytes, level 1 {fastest}",
            smallest.len()
        );
        // Above 9 is 9, not libdeflate's near-optimal modes (slow, 9 MB per worker).
        assert_eq!(
            compress(Compression::Gzip { level: 12 }, 1, &data, 4096),
            smallest
        );
    }

    #[test]
    fn gzip_encoder_names_the_locked_libdeflate() {
        // The cache key's encoder identity must change when libdeflate does (its output
        // may): fail here when Cargo.lock moves libdeflate-sys without GZIP_ENCODER.
        let lock =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).unwrap();
        let entry = lock
            .split("[[package]]")
            .find(|entry| entry.contains("name = \"libdeflate-sys\""))
            .expect("libdeflate-sys in Cargo.lock");
        let version = entry
            .lines()
            .find_map(|line| line.strip_prefix("version = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap();
        assert!(
            GZIP_ENCODER.starts_with(&format!("libdeflate-{version}-")),
            "GZIP_ENCODER {GZIP_ENCODER} does not name libdeflate-sys {version}"
        );
        // And Cargo.toml pins it exactly, so `cargo install` without --locked cannot pick
        // another (libdeflater itself accepts any ^1.26).
        let manifest = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
        assert!(
            manifest.contains(&format!("libdeflate-sys = \"={version}\"")),
            "Cargo.toml must pin libdeflate-sys = \"={version}\""
        );
        assert!(GZIP_ENCODER.ends_with(&format!("-{}MiB", GZIP_BLOCK >> 20)));
    }

    #[test]
    fn gzip_of_real_binary_data_does_not_depend_on_worker_scheduling() {
        // The test executable itself: real ELF code and data, like the libraries that
        // make up CUDA layers. (Reused deflate states made this differ between runs.)
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let data = &exe[..exe.len().min(8 << 20)];
        let gzip = Compression::Gzip { level: 6 };
        let one = compress(gzip, 1, data, 65536);
        for threads in [2, 3, 2] {
            assert!(
                compress(gzip, threads, data, 100_000) == one,
                "{threads} threads"
            );
        }
    }

    #[test]
    fn gzip_of_nothing_and_of_exact_blocks_is_valid() {
        for (len, members) in [(0, 1), (1, 1), (GZIP_BLOCK, 1), (2 * GZIP_BLOCK, 2)] {
            let data = sample(len);
            let out = compress(Compression::Gzip { level: 1 }, 2, &data, 10_000);
            assert_eq!(decode(&out), data, "length {len}");
            assert_eq!(member_headers(&out).len(), members, "length {len}");
            assert_eq!(out, compress(Compression::Gzip { level: 1 }, 1, &data, 999));
        }
    }

    #[test]
    fn zstd_is_identical_for_any_thread_count_and_round_trips() {
        // Large enough for several zstd jobs (job size at level 3 is a few MiB).
        let data = sample(24 << 20);
        let zstd = Compression::Zstd { level: 3 };
        let one = compress(zstd, 1, &data, 65536);
        let two = compress(zstd, 2, &data, 1000);
        let three = compress(zstd, 3, &data, 1 << 20);
        assert_eq!(one, two);
        assert_eq!(one, three);
        assert_eq!(zstd::decode_all(&one[..]).unwrap(), data);
    }
}
