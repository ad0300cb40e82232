//! Layer files whose bytes are members of a zip archive (a wheel), and gzip layers that
//! take those members' deflate data as it is.
//!
//! A zip member is a raw deflate stream with its CRC-32 and size; so is a gzip member
//! (RFC 1952). A file that comes unchanged from a wheel therefore goes into a gzip layer as
//! a gzip member of its own whose deflate bytes are copied from the wheel: the wheel's
//! builder compressed it once, and the layer does not inflate and deflate it again
//! ([`super::compress`] writes the member; `TarWriter::append_deflated` decides). The tar
//! headers and padding between such files, and files that are small ([`COPY_DEFLATE_FROM`]),
//! stored or generated, are compressed like every other byte of a layer.
//!
//! The uncompressed tar is the same either way, so the diff_id does not change; only the
//! blob's bytes do. A copied stream is still inflated on the way, to hash the tar and to
//! prove the stream is what the header says: it must end exactly where the member ends and
//! give the size and CRC-32 the archive declares, else the layer is not written (a deflate
//! stream with bytes after its end would make a gzip member no reader can read, and one
//! that inflates to other bytes would make a layer whose diff_id lies).

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use flate2::{Decompress, FlushDecompress, Status};

use super::LayerError;

/// Files from this size up have their deflate data copied into gzip layers; smaller ones
/// are compressed with the tar stream around them. A copied member costs 36 bytes of gzip
/// framing (its own and that of the member cut short before it) and the shared window of
/// its neighbours, which a small file would feel; the time is in the large libraries
/// (docs/benchmarks.md). Part of the gzip encoder's identity (`Compression::encoder`), so
/// changing it changes the layer cache keys.
pub const COPY_DEFLATE_FROM: u64 = 64 * 1024;

/// Read buffer for a member's compressed bytes, and the inflater's output buffer.
const BUFFER: usize = 256 * 1024;

/// How a zip member's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Stored,
    Deflated,
}

/// A member of a zip archive on disk, located: where its data starts and what the
/// archive's central directory declares of it. The declarations are checked whenever the
/// data is read ([`ZipMember::inflate_to`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipMember {
    pub archive: PathBuf,
    pub name: String,
    data_start: u64,
    compressed_size: u64,
    pub size: u64,
    crc32: u32,
    pub method: Method,
}

impl ZipMember {
    /// Locate `names` in the zip archive `archive`, in the order given. A name that is not
    /// a member, is encrypted, or is compressed otherwise than stored or deflated is an
    /// error.
    pub fn locate(archive: &Path, names: &[&str]) -> Result<Vec<ZipMember>, LayerError> {
        let refuse = |name: &str, reason: String| LayerError::ArchiveMember {
            archive: archive.to_path_buf(),
            member: name.to_string(),
            reason,
        };
        let file = std::fs::File::open(archive).map_err(|source| LayerError::Io {
            path: archive.to_path_buf(),
            source,
        })?;
        let mut zip = zip::ZipArchive::new(file).map_err(|e| refuse("", e.to_string()))?;
        let mut members = Vec::with_capacity(names.len());
        for name in names {
            let index = zip
                .index_for_name(name)
                .ok_or_else(|| refuse(name, "is not in the archive".to_string()))?;
            let raw = zip
                .by_index_raw(index)
                .map_err(|e| refuse(name, e.to_string()))?;
            if raw.encrypted() {
                return Err(refuse(name, "is encrypted".to_string()));
            }
            let method = match raw.compression() {
                zip::CompressionMethod::Stored => Method::Stored,
                zip::CompressionMethod::Deflated => Method::Deflated,
                other => return Err(refuse(name, format!("is compressed with {other:?}"))),
            };
            let data_start = raw
                .data_start()
                .ok_or_else(|| refuse(name, "has no data offset".to_string()))?;
            members.push(ZipMember {
                archive: archive.to_path_buf(),
                name: name.to_string(),
                data_start,
                compressed_size: raw.compressed_size(),
                size: raw.size(),
                crc32: raw.crc32(),
                method,
            });
        }
        Ok(members)
    }

    /// Whether a gzip layer takes this member's deflate data as it is.
    pub fn copies_deflate(&self) -> bool {
        self.method == Method::Deflated && self.size >= COPY_DEFLATE_FROM
    }

    pub fn crc32(&self) -> u32 {
        self.crc32
    }

    /// `wheel.whl!torch/lib/libtorch.so`, for messages.
    pub fn describe(&self) -> String {
        format!("{}!{}", self.archive.display(), self.name)
    }

    /// Read the member into `sink`: each piece of its compressed bytes, then the content
    /// it gives. Fails with `InvalidData` unless the data gives exactly the declared size
    /// and CRC-32 and a deflate stream ends exactly where the member does.
    pub fn inflate_to(&self, sink: &mut dyn MemberSink) -> io::Result<u64> {
        let mut file = std::fs::File::open(&self.archive)?;
        file.seek(SeekFrom::Start(self.data_start))?;
        let mut input = file.take(self.compressed_size);
        let mut checked = CheckedContent {
            sink,
            crc: flate2::Crc::new(),
            written: 0,
            limit: self.size,
        };
        match self.method {
            Method::Stored => copy_stored(&mut input, &mut checked)?,
            Method::Deflated => inflate(&mut input, &mut checked)?,
        }
        if input.limit() != 0 {
            return Err(self.invalid("the archive ends inside it"));
        }
        let written = checked.written;
        let crc = checked.crc.sum();
        if written != self.size || crc != self.crc32 {
            return Err(self.invalid(&format!(
                "it gives {written} bytes with CRC-32 {crc:08x}; the archive declares {} bytes with CRC-32 {:08x}",
                self.size, self.crc32
            )));
        }
        Ok(written)
    }

    fn invalid(&self, why: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("member `{}`: {why}", self.describe()),
        )
    }
}

/// What reading a member feeds: its compressed bytes as they are read, and the content
/// they give.
pub trait MemberSink {
    fn compressed(&mut self, bytes: &[u8]) -> io::Result<()>;
    fn content(&mut self, bytes: &[u8]) -> io::Result<()>;
}

/// A member's content into a writer; its compressed bytes are not wanted.
pub struct ContentOnly<'a>(pub &'a mut dyn Write);

impl MemberSink for ContentOnly<'_> {
    fn compressed(&mut self, _: &[u8]) -> io::Result<()> {
        Ok(())
    }
    fn content(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }
}

/// The member read into a sink, its content counted and checksummed; more than `limit`
/// bytes is an error at once (a deflate bomb stops at the declared size).
struct CheckedContent<'a> {
    sink: &'a mut dyn MemberSink,
    crc: flate2::Crc,
    written: u64,
    limit: u64,
}

impl CheckedContent<'_> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.written + bytes.len() as u64 > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the data gives more than the declared {} bytes", self.limit),
            ));
        }
        self.crc.update(bytes);
        self.written += bytes.len() as u64;
        self.sink.content(bytes)
    }
}

fn copy_stored(input: &mut dyn Read, content: &mut CheckedContent) -> io::Result<()> {
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let n = read_some(input, &mut buffer)?;
        if n == 0 {
            return Ok(());
        }
        content.sink.compressed(&buffer[..n])?;
        content.put(&buffer[..n])?;
    }
}

fn inflate(input: &mut dyn Read, content: &mut CheckedContent) -> io::Result<()> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    let mut inflater = Decompress::new(false);
    let (mut raw, mut out) = (vec![0u8; BUFFER], vec![0u8; BUFFER]);
    let mut ended = false;
    loop {
        let n = read_some(input, &mut raw)?;
        if n == 0 {
            break;
        }
        if ended {
            return Err(invalid("bytes follow the end of its deflate stream".into()));
        }
        content.sink.compressed(&raw[..n])?;
        let mut chunk = &raw[..n];
        loop {
            let (before_in, before_out) = (inflater.total_in(), inflater.total_out());
            let status = inflater
                .decompress(chunk, &mut out, FlushDecompress::None)
                .map_err(|e| invalid(format!("its deflate data is corrupt: {e}")))?;
            let consumed = (inflater.total_in() - before_in) as usize;
            let made = (inflater.total_out() - before_out) as usize;
            chunk = &chunk[consumed..];
            content.put(&out[..made])?;
            if status == Status::StreamEnd {
                ended = true;
                if !chunk.is_empty() {
                    return Err(invalid("bytes follow the end of its deflate stream".into()));
                }
                break;
            }
            // More input is needed once this chunk is used up and the output has room.
            if (chunk.is_empty() && made < out.len()) || (consumed == 0 && made == 0) {
                break;
            }
        }
    }
    if !ended {
        return Err(invalid("its deflate stream is cut short".into()));
    }
    Ok(())
}

fn read_some(input: &mut dyn Read, buffer: &mut [u8]) -> io::Result<usize> {
    loop {
        match input.read(buffer) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        let mut state = 0x9e37_79b9u32;
        (0..len)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                if i % 7 == 0 {
                    (state & 0xff) as u8
                } else {
                    b'a' + (i % 13) as u8
                }
            })
            .collect()
    }

    #[derive(Default)]
    struct Both {
        compressed: Vec<u8>,
        content: Vec<u8>,
    }

    impl MemberSink for Both {
        fn compressed(&mut self, bytes: &[u8]) -> io::Result<()> {
            self.compressed.extend_from_slice(bytes);
            Ok(())
        }
        fn content(&mut self, bytes: &[u8]) -> io::Result<()> {
            self.content.extend_from_slice(bytes);
            Ok(())
        }
    }

    fn archive(dir: &Path, members: &[(&str, &[u8], zip::CompressionMethod)]) -> PathBuf {
        let path = dir.join("x.whl");
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        for (name, bytes, method) in members {
            let options = zip::write::SimpleFileOptions::default().compression_method(*method);
            zip.start_file(*name, options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
        path
    }

    #[test]
    fn members_are_read_back_with_their_compressed_bytes() {
        let temp = tempfile::tempdir().unwrap();
        let big = sample(300_000);
        let path = archive(
            temp.path(),
            &[
                ("a/big.so", &big, zip::CompressionMethod::Deflated),
                (
                    "a/small.py",
                    b"print(1)\n",
                    zip::CompressionMethod::Deflated,
                ),
                (
                    "a/stored.bin",
                    &big[..70_000],
                    zip::CompressionMethod::Stored,
                ),
            ],
        );
        let members =
            ZipMember::locate(&path, &["a/big.so", "a/small.py", "a/stored.bin"]).unwrap();
        assert!(members[0].copies_deflate());
        assert!(!members[1].copies_deflate(), "small");
        assert!(!members[2].copies_deflate(), "stored");
        for (member, expected) in members
            .iter()
            .zip([&big[..], b"print(1)\n", &big[..70_000]])
        {
            let mut both = Both::default();
            member.inflate_to(&mut both).unwrap();
            assert_eq!(both.content, expected, "{}", member.name);
            assert_eq!(both.compressed.len() as u64, member.compressed_size);
        }
        let missing = ZipMember::locate(&path, &["a/none"])
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("a/none") && missing.contains("not in the archive"),
            "{missing}"
        );
    }

    /// Bytes after the end of a deflate stream (inside the member's declared length) would
    /// be read as the gzip trailer; other content would make the diff_id lie. Both are
    /// refused, as is a stream cut short.
    #[test]
    fn a_member_whose_deflate_data_is_not_what_it_declares_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let big = sample(200_000);
        let path = archive(
            temp.path(),
            &[("big.so", &big, zip::CompressionMethod::Deflated)],
        );
        let member = ZipMember::locate(&path, &["big.so"]).unwrap().remove(0);
        let read = |member: &ZipMember| {
            member
                .inflate_to(&mut ContentOnly(&mut io::sink()))
                .map_err(|e| e.to_string())
        };
        let with = |change: &dyn Fn(&mut ZipMember)| {
            let mut changed = member.clone();
            change(&mut changed);
            read(&changed).unwrap_err()
        };
        assert!(read(&member).is_ok());
        let trailing = with(&|m| m.compressed_size += 4);
        assert!(
            trailing.contains("follow the end") || trailing.contains("ends inside"),
            "{trailing}"
        );
        assert!(with(&|m| m.compressed_size -= 100).contains("cut short"));
        assert!(with(&|m| m.crc32 ^= 1).contains("CRC-32"));
        assert!(with(&|m| m.size -= 1).contains("more than the declared"));
        assert!(with(&|m| m.size += 1).contains("declares"));
    }

    /// Every gzip member of `blob`, decoded on its own: (compressed bytes, content).
    fn members_of(mut blob: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut members = Vec::new();
        while !blob.is_empty() {
            let mut decoder = flate2::bufread::GzDecoder::new(blob);
            let mut content = Vec::new();
            io::Read::read_to_end(&mut decoder, &mut content).unwrap();
            let rest = decoder.into_inner();
            members.push((blob[..blob.len() - rest.len()].to_vec(), content));
            blob = rest;
        }
        members
    }

    /// The layer from wheel members: the same tar (diff_id) as from the staged files, each
    /// large deflated member's bytes copied into a gzip member of its own, the same blob
    /// for any thread count, and readable as one gzip stream.
    #[test]
    fn a_gzip_layer_copies_large_members_deflate_data_and_keeps_the_tar() {
        use crate::layer::{
            build, BuildOptions, Compression, Entry, FileSource, LayerContents, LayerPath,
        };
        let temp = tempfile::tempdir().unwrap();
        let big = sample(3 << 20);
        let medium = sample(100_000);
        let members: [(&str, &[u8], zip::CompressionMethod); 4] = [
            ("lib/libbig.so", &big, zip::CompressionMethod::Deflated),
            (
                "lib/libmedium.so",
                &medium,
                zip::CompressionMethod::Deflated,
            ),
            ("pkg/small.py", b"x = 1\n", zip::CompressionMethod::Deflated),
            (
                "pkg/stored.bin",
                &medium[..80_000],
                zip::CompressionMethod::Stored,
            ),
        ];
        let path = archive(temp.path(), &members);
        let staged = temp.path().join("staged");
        let mut files = Vec::new();
        for (name, bytes, _) in &members {
            let file = staged.join(name);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, bytes).unwrap();
            let entry = Entry::file(
                LayerPath::parse(name).unwrap(),
                0o644,
                bytes.len() as u64,
                FileSource::Path(file),
            );
            files.push(entry);
        }
        let from_files = LayerContents::from_entries(files).unwrap();
        let mut from_wheel = from_files.clone();
        let names: Vec<&str> = members.iter().map(|(name, ..)| *name).collect();
        let located = ZipMember::locate(&path, &names).unwrap();
        let copied: Vec<Vec<u8>> = located
            .iter()
            .filter(|m| m.copies_deflate())
            .map(|m| {
                let mut both = Both::default();
                m.inflate_to(&mut both).unwrap();
                both.compressed
            })
            .collect();
        assert_eq!(copied.len(), 2, "libbig and libmedium");
        from_wheel
            .take_from_zip_members(
                names
                    .iter()
                    .map(|name| LayerPath::parse(name).unwrap())
                    .zip(located),
            )
            .unwrap();
        let store = crate::cache::BlobStore::open(temp.path().join("store")).unwrap();
        let gzip = Compression::Gzip { level: 1 };
        let options = |threads| BuildOptions {
            mtime: 1_700_000_000,
            compression: gzip,
            threads,
        };
        let files_layer = build(&store, &from_files, &options(2)).unwrap();
        let wheel_layer = build(&store, &from_wheel, &options(2)).unwrap();
        assert_eq!(wheel_layer.diff_id, files_layer.diff_id, "the same tar");
        assert_ne!(wheel_layer.digest, files_layer.digest);
        for threads in [1, 3] {
            assert_eq!(
                build(&store, &from_wheel, &options(threads)).unwrap(),
                wheel_layer
            );
        }
        let blob = std::fs::read(&wheel_layer.blob).unwrap();
        let tar = crate::layer::write_layer_tar(&from_files, 1_700_000_000, Vec::new()).unwrap();
        let mut decoded = Vec::new();
        io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(&blob[..]),
            &mut decoded,
        )
        .unwrap();
        assert!(
            decoded == tar,
            "the blob decodes to the tar of the staged files"
        );
        // Each copied member is a gzip member of its own: header, the wheel's bytes, trailer.
        let gzip_members = members_of(&blob);
        for (deflate, content) in copied.iter().zip([&big[..], &medium[..]]) {
            let member = gzip_members
                .iter()
                .find(|(_, decoded)| decoded == content)
                .expect("a gzip member holding exactly the file");
            assert_eq!(&member.0[10..member.0.len() - 8], &deflate[..]);
            assert_eq!(member.0[..10], [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
        }
        // zstd and uncompressed layers inflate the members into the stream.
        for compression in [Compression::None, Compression::Zstd { level: 3 }] {
            let options = BuildOptions {
                compression,
                ..options(2)
            };
            assert_eq!(
                build(&store, &from_wheel, &options).unwrap().diff_id,
                files_layer.diff_id
            );
        }
    }

    /// A member whose data is not what its archive declares fails the layer, and the store
    /// keeps nothing of it.
    #[test]
    fn a_layer_with_a_lying_member_is_not_written() {
        use crate::layer::{
            build, BuildOptions, Compression, Entry, FileSource, LayerContents, LayerPath,
        };
        let temp = tempfile::tempdir().unwrap();
        let big = sample(500_000);
        let path = archive(
            temp.path(),
            &[("libbig.so", &big, zip::CompressionMethod::Deflated)],
        );
        let mut member = ZipMember::locate(&path, &["libbig.so"]).unwrap().remove(0);
        member.crc32 ^= 0x100;
        let contents = LayerContents::from_entries([Entry::file(
            LayerPath::parse("libbig.so").unwrap(),
            0o644,
            big.len() as u64,
            FileSource::ZipMember(std::sync::Arc::new(member)),
        )])
        .unwrap();
        let store_dir = temp.path().join("store");
        let store = crate::cache::BlobStore::open(&store_dir).unwrap();
        let options = BuildOptions {
            mtime: 0,
            compression: Compression::Gzip { level: 1 },
            threads: 2,
        };
        let error = build(&store, &contents, &options).unwrap_err();
        let text = format!("{error}: {}", std::error::Error::source(&error).unwrap());
        assert!(
            text.contains("libbig.so") && text.contains("CRC-32"),
            "{text}"
        );
        let left: Vec<_> = walkdir(&store_dir);
        assert!(left.is_empty(), "left in the store: {left:?}");
    }

    fn walkdir(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(walkdir(&path));
            } else {
                files.push(path);
            }
        }
        files
    }
}
