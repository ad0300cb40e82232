//! Layer compression: deterministic parallel gzip, multithreaded zstd, or none.
//!
//! Compression dominates build time (DESIGN.md, "Where the time goes"), so both codecs
//! use every core given to them, and both produce the same bytes whatever that number is:
//! - gzip is compressed pigz-style: the tar stream is cut into fixed 256 KiB blocks,
//!   each block is deflated on a worker with the previous block's last 32 KiB as its
//!   dictionary and ended with a sync flush, and the pieces are written in order. Block
//!   boundaries depend only on the byte stream, never on thread count or write sizes.
//!   The header has no name, mtime 0, XFL from the level and OS byte 255 ("unknown").
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
    /// gzip: what every runtime and importer reads. Levels 1-9.
    Gzip { level: u32 },
    /// zstd: faster and smaller, for registries whose consumers support it. Levels 1-19.
    Zstd { level: i32 },
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Gzip { level: 6 }
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

    /// Start compressing into `out` with up to `threads` worker threads.
    pub fn writer<W: Write + Send + 'static>(
        &self,
        out: W,
        threads: usize,
    ) -> io::Result<Compressor<W>> {
        Ok(match *self {
            Compression::None => Compressor::None(out),
            Compression::Gzip { level } => Compressor::Gzip(Box::new(ParallelGzip::new(
                out,
                level.clamp(1, 9),
                threads,
            )?)),
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

const GZIP_BLOCK: usize = 256 * 1024;
const DICTIONARY: usize = 32 * 1024;

struct Job {
    sequence: u64,
    dictionary: Vec<u8>,
    data: Vec<u8>,
    last: bool,
}

type JobResult = (u64, io::Result<Vec<u8>>);

/// Deterministic parallel gzip (see the module docs). With `threads <= 1` blocks are
/// compressed on the calling thread, producing the same bytes.
pub struct ParallelGzip<W: Write> {
    out: W,
    block: Vec<u8>,
    dictionary: Vec<u8>,
    crc: crc32fast::Hasher,
    total: u64,
    next_sequence: u64,
    next_to_write: u64,
    ready: BTreeMap<u64, Vec<u8>>,
    in_flight: usize,
    max_in_flight: usize,
    jobs: Option<Sender<Job>>,
    results: Option<Receiver<JobResult>>,
    workers: Vec<JoinHandle<()>>,
    /// Compress on the calling thread (no workers).
    inline: bool,
    level: u32,
}

impl<W: Write> ParallelGzip<W> {
    pub fn new(mut out: W, level: u32, threads: usize) -> io::Result<Self> {
        let xfl = match level {
            9 => 2,
            1 => 4,
            _ => 0,
        };
        out.write_all(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, xfl, 255])?;
        let mut gzip = Self {
            out,
            block: Vec::with_capacity(GZIP_BLOCK),
            dictionary: Vec::new(),
            crc: crc32fast::Hasher::new(),
            total: 0,
            next_sequence: 0,
            next_to_write: 0,
            ready: BTreeMap::new(),
            in_flight: 0,
            max_in_flight: threads.max(1) * 3,
            jobs: None,
            results: None,
            workers: Vec::new(),
            inline: threads <= 1,
            level,
        };
        if gzip.inline {
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
                .spawn(move || loop {
                    let job = match job_rx.lock() {
                        Ok(receiver) => receiver.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let output = deflate_block(level, &job);
                    if result_tx.send((job.sequence, output)).is_err() {
                        return;
                    }
                })?;
            gzip.workers.push(worker);
        }
        gzip.jobs = Some(job_tx);
        gzip.results = Some(result_rx);
        Ok(gzip)
    }

    fn dispatch(&mut self, last: bool) -> io::Result<()> {
        let data = std::mem::replace(&mut self.block, Vec::with_capacity(GZIP_BLOCK));
        let next_dictionary = data[data.len().saturating_sub(DICTIONARY)..].to_vec();
        let job = Job {
            sequence: self.next_sequence,
            dictionary: std::mem::replace(&mut self.dictionary, next_dictionary),
            data,
            last,
        };
        self.next_sequence += 1;
        if self.inline {
            let output = deflate_block(self.level, &job)?;
            self.out.write_all(&output)?;
            self.next_to_write += 1;
            return Ok(());
        }
        while self.in_flight >= self.max_in_flight {
            self.collect(true)?;
        }
        self.jobs
            .as_ref()
            .expect("workers run until finish")
            .send(job)
            .map_err(|_| io::Error::other("gzip worker thread stopped"))?;
        self.in_flight += 1;
        self.collect(false)
    }

    /// Receive finished blocks (waiting for one when `block`) and write those whose
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
        for (sequence, output) in received {
            self.in_flight -= 1;
            self.ready.insert(sequence, output?);
        }
        while let Some(output) = self.ready.remove(&self.next_to_write) {
            self.out.write_all(&output)?;
            self.next_to_write += 1;
        }
        Ok(())
    }

    /// Compress what is left, write the gzip trailer, stop the workers.
    pub fn finish(mut self) -> io::Result<W> {
        self.dispatch(true)?;
        while self.in_flight > 0 {
            self.collect(true)?;
        }
        self.jobs = None;
        for worker in self.workers.drain(..) {
            worker
                .join()
                .map_err(|_| io::Error::other("gzip worker thread panicked"))?;
        }
        let crc = std::mem::take(&mut self.crc).finalize();
        let mut out = self.out;
        out.write_all(&crc.to_le_bytes())?;
        out.write_all(&(self.total as u32).to_le_bytes())?;
        out.flush()?;
        Ok(out)
    }
}

impl<W: Write> Write for ParallelGzip<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = GZIP_BLOCK - self.block.len();
        let n = room.min(buf.len());
        self.block.extend_from_slice(&buf[..n]);
        self.crc.update(&buf[..n]);
        self.total += n as u64;
        if self.block.len() == GZIP_BLOCK {
            self.dispatch(false)?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Deflate one block: raw deflate, primed with the dictionary, ended with a sync flush
/// (or the final block when `last`), so the pieces concatenate into one stream.
///
/// Every block gets a fresh deflate state. A reset state is NOT equivalent: zlib-rs's
/// reset does not clear the window, and with reused per-worker states the output
/// depended on which block each worker had compressed before (seen on a 2 GB tree:
/// the same tar gave different gzip bytes from run to run; fresh states fixed it).
fn deflate_block(level: u32, job: &Job) -> io::Result<Vec<u8>> {
    let mut deflate = flate2::Compress::new(flate2::Compression::new(level), false);
    let deflate = &mut deflate;
    if !job.dictionary.is_empty() {
        deflate
            .set_dictionary(&job.dictionary)
            .map_err(io::Error::other)?;
    }
    let flush = if job.last {
        flate2::FlushCompress::Finish
    } else {
        flate2::FlushCompress::Sync
    };
    let mut output = Vec::with_capacity(job.data.len() / 2 + 1024);
    let start_in = deflate.total_in();
    loop {
        if output.capacity() - output.len() < 1024 {
            output.reserve(output.capacity().max(64 * 1024));
        }
        let consumed = (deflate.total_in() - start_in) as usize;
        let status = deflate
            .compress_vec(&job.data[consumed..], &mut output, flush)
            .map_err(io::Error::other)?;
        let consumed = (deflate.total_in() - start_in) as usize;
        let done = match status {
            flate2::Status::StreamEnd => true,
            _ if job.last => false,
            // A sync flush is complete once all input is taken and the output was
            // not filled to capacity (so nothing is left pending inside deflate).
            _ => consumed == job.data.len() && output.len() < output.capacity(),
        };
        if done {
            return Ok(output);
        }
    }
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
        let data = sample(12 * GZIP_BLOCK + 12345);
        let gzip = Compression::Gzip { level: 6 };
        let one = compress(gzip, 1, &data, 4096);
        let two = compress(gzip, 2, &data, 777);
        let three = compress(gzip, 3, &data, GZIP_BLOCK * 2);
        let two_again = compress(gzip, 2, &data, 100_000);
        assert_eq!(one, two);
        assert_eq!(one, three);
        assert_eq!(one, two_again);
        assert_eq!(&one[..10], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(&one[..])
            .read_to_end(&mut decoded)
            .unwrap();
        assert_eq!(decoded, data);
        assert!(one.len() < data.len() / 2);
    }

    #[test]
    fn gzip_of_real_binary_data_does_not_depend_on_worker_scheduling() {
        // The test executable itself: real ELF code and data, like the libraries that
        // make up CUDA layers. (Reused deflate states made this differ between runs.)
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let data = &exe[..exe.len().min(3 << 20)];
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
        for len in [0, GZIP_BLOCK, 2 * GZIP_BLOCK] {
            let data = sample(len);
            let out = compress(Compression::Gzip { level: 1 }, 2, &data, 10_000);
            let mut decoded = Vec::new();
            flate2::read::GzDecoder::new(&out[..])
                .read_to_end(&mut decoded)
                .unwrap();
            assert_eq!(decoded, data, "length {len}");
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
