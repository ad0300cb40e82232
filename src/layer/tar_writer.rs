//! A deterministic tar writer: headers are written here, byte by byte.
//!
//! The `tar` crate's builder follows symlinks and its deterministic mode resets modes
//! (CRATES.md pitfall 2), so cudastack writes POSIX ustar headers itself:
//! - mtime is the caller's SOURCE_DATE_EPOCH for every entry, uid/gid as the entry says
//!   (0 by default), uname/gname empty, device numbers zero, no atime/ctime;
//! - modes are written exactly as given (0o1777 survives);
//! - a PAX extended header (`x`) is written only when a value does not fit ustar: a name
//!   or link target over 100 bytes or not ASCII, a size of 8 GiB or more, an id over
//!   0o7777777. Its own header is deterministic too (`PaxHeaders/<name>`).
//!
//! The same writer produces the docker-archive stream in `oci::docker_archive`.

use std::io::{self, Read, Write};

use super::deflated::{MemberSink, ZipMember};
use super::entry::{Entry, EntryKind, FileSource, LayerContents};
use super::LayerError;

const BLOCK: usize = 512;
const MAX_OCTAL_11: u64 = 0o77777777777;
const MAX_OCTAL_7: u64 = 0o7777777;

/// Header fields of one tar member.
#[derive(Debug, Clone)]
pub struct Header<'a> {
    /// Full member name (directories end with `/`).
    pub name: &'a str,
    pub typeflag: u8,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub link_name: &'a str,
}

/// Writes tar members to `inner` with a fixed mtime.
pub struct TarWriter<W: Write> {
    inner: W,
    mtime: u64,
    copy_buffer: Vec<u8>,
}

impl<W: Write> TarWriter<W> {
    pub fn new(inner: W, mtime: u64) -> Self {
        Self {
            inner,
            mtime,
            copy_buffer: vec![0; 256 * 1024],
        }
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Write a header (and its PAX extension when needed).
    pub fn write_header(&mut self, header: &Header<'_>) -> io::Result<()> {
        let mut pax: Vec<(&str, String)> = Vec::new();
        let fits = |s: &str| s.len() <= 100 && s.is_ascii();
        if !fits(header.name) {
            pax.push(("path", header.name.to_string()));
        }
        if !fits(header.link_name) {
            pax.push(("linkpath", header.link_name.to_string()));
        }
        if header.size > MAX_OCTAL_11 {
            pax.push(("size", header.size.to_string()));
        }
        if u64::from(header.uid) > MAX_OCTAL_7 {
            pax.push(("uid", header.uid.to_string()));
        }
        if u64::from(header.gid) > MAX_OCTAL_7 {
            pax.push(("gid", header.gid.to_string()));
        }
        if !pax.is_empty() {
            let mut records = Vec::new();
            for (key, value) in &pax {
                records.extend_from_slice(pax_record(key, value).as_bytes());
            }
            let base = header.name.trim_end_matches('/');
            let base = base.rsplit('/').next().unwrap_or(base);
            let pax_name: String = format!("PaxHeaders/{base}")
                .chars()
                .filter(|c| c.is_ascii() && *c != '\0')
                .take(100)
                .collect();
            let pax_header = self.ustar_block(&Header {
                name: &pax_name,
                typeflag: b'x',
                mode: 0o644,
                uid: 0,
                gid: 0,
                size: records.len() as u64,
                link_name: "",
            });
            self.inner.write_all(&pax_header)?;
            self.inner.write_all(&records)?;
            self.pad(records.len() as u64)?;
        }
        let block = self.ustar_block(header);
        self.inner.write_all(&block)
    }

    /// Build a ustar header block; fields that do not fit are truncated or zeroed
    /// (their real values are in the PAX record written before it).
    fn ustar_block(&self, header: &Header<'_>) -> [u8; BLOCK] {
        let mut block = [0u8; BLOCK];
        let put_str = |block: &mut [u8; BLOCK], offset: usize, len: usize, value: &str| {
            let bytes = value.as_bytes();
            let n = bytes.len().min(len);
            block[offset..offset + n].copy_from_slice(&bytes[..n]);
        };
        let put_octal = |block: &mut [u8; BLOCK], offset: usize, len: usize, value: u64| {
            let max = (1u64 << (3 * (len as u32 - 1))) - 1;
            let value = if value > max { 0 } else { value };
            let text = format!("{:0width$o}", value, width = len - 1);
            block[offset..offset + len - 1].copy_from_slice(text.as_bytes());
            block[offset + len - 1] = 0;
        };
        put_str(&mut block, 0, 100, header.name);
        put_octal(&mut block, 100, 8, u64::from(header.mode));
        put_octal(&mut block, 108, 8, u64::from(header.uid));
        put_octal(&mut block, 116, 8, u64::from(header.gid));
        put_octal(&mut block, 124, 12, header.size);
        put_octal(&mut block, 136, 12, self.mtime);
        block[156] = header.typeflag;
        put_str(&mut block, 157, 100, header.link_name);
        block[257..263].copy_from_slice(b"ustar\0");
        block[263..265].copy_from_slice(b"00");
        put_octal(&mut block, 329, 8, 0);
        put_octal(&mut block, 337, 8, 0);
        // Checksum: the sum of all bytes with the checksum field read as spaces.
        block[148..156].copy_from_slice(b"        ");
        let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
        let text = format!("{sum:06o}\0 ");
        block[148..156].copy_from_slice(text.as_bytes());
        block
    }

    /// Zero padding after `size` bytes of content.
    pub fn pad(&mut self, size: u64) -> io::Result<()> {
        let rest = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
        self.inner.write_all(&[0u8; BLOCK][..rest as usize])
    }

    /// Write a regular file member whose content comes from `reader`, which must yield
    /// exactly `size` bytes (the header is written first; a mismatch is an error).
    pub fn append_reader(
        &mut self,
        header: &Header<'_>,
        reader: &mut dyn Read,
    ) -> Result<(), ContentError> {
        self.write_header(header).map_err(ContentError::Write)?;
        let mut remaining = header.size;
        while remaining > 0 {
            let want = remaining.min(self.copy_buffer.len() as u64) as usize;
            let n = match reader.read(&mut self.copy_buffer[..want]) {
                Ok(0) => {
                    return Err(ContentError::SizeMismatch {
                        found: header.size - remaining,
                    })
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ContentError::Read(e)),
            };
            self.inner
                .write_all(&self.copy_buffer[..n])
                .map_err(ContentError::Write)?;
            remaining -= n as u64;
        }
        // The source must be exhausted too: a file that grew is not what was declared.
        let mut probe = [0u8; 1];
        loop {
            match reader.read(&mut probe) {
                Ok(0) => break,
                Ok(_) => {
                    return Err(ContentError::SizeMismatch {
                        found: header.size + 1,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ContentError::Read(e)),
            }
        }
        self.pad(header.size).map_err(ContentError::Write)
    }

    /// Write one layer entry, opening its content if it is a regular file.
    pub fn append_entry(&mut self, entry: &Entry) -> Result<(), LayerError> {
        let name = entry.tar_name();
        let write_err = |source| LayerError::WriteTar {
            entry: entry.path.to_string(),
            source,
        };
        match &entry.kind {
            EntryKind::Dir => {
                let dir_name = format!("{name}/");
                self.write_header(&self.header(entry, &dir_name, b'5', 0, ""))
                    .map_err(write_err)
            }
            EntryKind::Symlink { target } => self
                .write_header(&self.header(entry, &name, b'2', 0, target))
                .map_err(write_err),
            EntryKind::Hardlink { target } => self
                .write_header(&self.header(entry, &name, b'1', 0, target.as_str()))
                .map_err(write_err),
            EntryKind::Whiteout | EntryKind::OpaqueWhiteout => self
                .write_header(&self.header(entry, &name, b'0', 0, ""))
                .map_err(write_err),
            EntryKind::File { size, source } => {
                let header = self.header(entry, &name, b'0', *size, "");
                self.write_header(&header).map_err(write_err)?;
                let mut sink = SizedSink {
                    inner: &mut self.inner,
                    remaining: *size,
                    written: 0,
                    overflow: false,
                    write_error: None,
                };
                let copied = source.copy_to(&mut sink);
                let (written, overflow) = (sink.written, sink.overflow);
                if let Some(e) = sink.write_error.take() {
                    return Err(write_err(e));
                }
                let mismatch = |found| LayerError::SizeMismatch {
                    source_name: source.describe(),
                    expected: *size,
                    found,
                };
                if overflow {
                    return Err(mismatch(*size + 1));
                }
                if let Err(e) = copied {
                    return Err(LayerError::ReadContent {
                        source_name: source.describe(),
                        source: e,
                    });
                }
                if written != *size {
                    return Err(mismatch(written));
                }
                self.pad(*size).map_err(write_err)
            }
        }
    }

    fn header<'h>(
        &self,
        entry: &Entry,
        name: &'h str,
        typeflag: u8,
        size: u64,
        link_name: &'h str,
    ) -> Header<'h> {
        Header {
            name,
            typeflag,
            mode: entry.mode,
            uid: entry.uid,
            gid: entry.gid,
            size,
            link_name,
        }
    }

    /// Write the end-of-archive marker (two zero blocks) and return the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.inner.write_all(&[0u8; 2 * BLOCK])?;
        Ok(self.inner)
    }
}

/// Where a gzip layer's tar stream goes when some files' deflate data is copied from their
/// archives ([`super::deflated`]): between `begin_deflated` and `end_deflated`, what is
/// written is the file's content (for the diff_id), and `deflated` gets the compressed
/// bytes that stand for it in the blob.
pub trait DeflatedSink: Write {
    fn begin_deflated(&mut self) -> io::Result<()>;
    fn deflated(&mut self, compressed: &[u8]) -> io::Result<()>;
    fn end_deflated(&mut self, crc32: u32, size: u64) -> io::Result<()>;
}

impl<W: DeflatedSink> DeflatedSink for crate::digest::HashingWriter<W> {
    fn begin_deflated(&mut self) -> io::Result<()> {
        self.get_mut().begin_deflated()
    }
    fn deflated(&mut self, compressed: &[u8]) -> io::Result<()> {
        self.get_mut().deflated(compressed)
    }
    fn end_deflated(&mut self, crc32: u32, size: u64) -> io::Result<()> {
        self.get_mut().end_deflated(crc32, size)
    }
}

impl<W: DeflatedSink> TarWriter<W> {
    /// Write a regular file whose content is `member`, its deflate data copied as the
    /// compressed form of the content: the content is still inflated and written (hashed),
    /// and checked against the member's size and CRC-32.
    fn append_deflated(&mut self, entry: &Entry, member: &ZipMember) -> Result<(), LayerError> {
        let name = entry.tar_name();
        let write_err = |source| LayerError::WriteTar {
            entry: entry.path.to_string(),
            source,
        };
        let header = self.header(entry, &name, b'0', member.size, "");
        self.write_header(&header).map_err(write_err)?;
        self.inner.begin_deflated().map_err(write_err)?;
        let mut splice = Splice {
            inner: &mut self.inner,
            write_error: None,
        };
        let inflated = member.inflate_to(&mut splice);
        if let Some(e) = splice.write_error.take() {
            return Err(write_err(e));
        }
        inflated.map_err(|source| LayerError::ReadContent {
            source_name: member.describe(),
            source,
        })?;
        self.inner
            .end_deflated(member.crc32(), member.size)
            .map_err(write_err)?;
        self.pad(member.size).map_err(write_err)
    }
}

/// A member's compressed bytes to the blob, its content to the tar stream; write errors are
/// kept apart from the member's read errors, as in [`SizedSink`].
struct Splice<'a, W> {
    inner: &'a mut W,
    write_error: Option<io::Error>,
}

impl<W> Splice<'_, W> {
    fn keep(&mut self, error: io::Error) -> io::Error {
        let kind = error.kind();
        self.write_error.get_or_insert(error);
        io::Error::new(kind, "layer stream write failed")
    }
}

impl<W: DeflatedSink> MemberSink for Splice<'_, W> {
    fn compressed(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.deflated(bytes).map_err(|e| self.keep(e))
    }
    fn content(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes).map_err(|e| self.keep(e))
    }
}

/// Passes at most `remaining` bytes through; more is recorded as an overflow (the
/// header already declared the size). Write errors are kept apart from the source's
/// read errors so the message blames the right side.
struct SizedSink<'a, W: Write> {
    inner: &'a mut W,
    remaining: u64,
    written: u64,
    overflow: bool,
    write_error: Option<io::Error>,
}

impl<W: Write> Write for SizedSink<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.remaining {
            self.overflow = true;
            return Err(io::Error::other("content is larger than its declared size"));
        }
        match self.inner.write(buf) {
            Ok(n) => {
                self.remaining -= n as u64;
                self.written += n as u64;
                Ok(n)
            }
            Err(e) => {
                let kind = e.kind();
                self.write_error = Some(e);
                Err(io::Error::new(kind, "layer stream write failed"))
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why a member's content could not be copied.
#[derive(Debug)]
pub enum ContentError {
    Read(io::Error),
    Write(io::Error),
    /// The reader yielded a different number of bytes than the header declared
    /// (`found` is a lower bound when the reader had more).
    SizeMismatch {
        found: u64,
    },
}

/// A PAX record: `"<len> <key>=<value>\n"`, where `len` counts the whole record
/// including its own digits.
fn pax_record(key: &str, value: &str) -> String {
    let base = key.len() + value.len() + 3;
    let mut len = base + 1;
    while base + len.to_string().len() != len {
        len = base + len.to_string().len();
    }
    format!("{len} {key}={value}\n")
}

/// Write a whole layer as an uncompressed tar stream; returns the writer.
pub fn write_layer_tar<W: Write>(
    contents: &LayerContents,
    mtime: u64,
    out: W,
) -> Result<W, LayerError> {
    let mut tar = TarWriter::new(out, mtime);
    for entry in contents.entries() {
        tar.append_entry(entry)?;
    }
    finish_layer_tar(tar)
}

/// [`write_layer_tar`] for a gzip layer: the files whose zip member
/// [`ZipMember::copies_deflate`] go to `out` with their deflate data.
pub fn write_layer_tar_deflated<W: DeflatedSink>(
    contents: &LayerContents,
    mtime: u64,
    out: W,
) -> Result<W, LayerError> {
    let mut tar = TarWriter::new(out, mtime);
    for entry in contents.entries() {
        match &entry.kind {
            EntryKind::File {
                source: FileSource::ZipMember(member),
                ..
            } if member.copies_deflate() => tar.append_deflated(entry, member)?,
            _ => tar.append_entry(entry)?,
        }
    }
    finish_layer_tar(tar)
}

fn finish_layer_tar<W: Write>(tar: TarWriter<W>) -> Result<W, LayerError> {
    tar.finish().map_err(|source| LayerError::WriteTar {
        entry: "end-of-archive marker".to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::entry::LayerPath;

    #[test]
    fn pax_record_length_counts_itself() {
        assert_eq!(pax_record("path", "a"), "9 path=a\n");
        let long = "x".repeat(95);
        let record = pax_record("path", &long);
        let (len, _) = record.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), record.len());
    }

    #[test]
    fn the_tar_crate_reads_back_modes_links_and_long_names() {
        let p = |s: &str| LayerPath::parse(s).unwrap();
        let long = format!("d/{}", "n".repeat(300));
        let contents = LayerContents::from_entries([
            Entry::dir(p("tmp"), 0o1777),
            Entry::file_bytes(p(&long), 0o600, &b"long"[..]).with_owner(1000, 3_000_000),
            Entry::symlink(p("d/link"), "n".repeat(150)),
            Entry::hardlink(p("d/hard"), p(&long)),
            Entry::file_bytes(p("d/é"), 0o644, &b""[..]),
        ])
        .unwrap();
        let bytes = write_layer_tar(&contents, 1_700_000_000, Vec::new()).unwrap();
        assert_eq!(bytes.len() % 512, 0);
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for member in archive.entries().unwrap() {
            let mut member = member.unwrap();
            let header = member.header().clone();
            let path = member.path().unwrap().to_string_lossy().into_owned();
            let link = member
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mut body = Vec::new();
            member.read_to_end(&mut body).unwrap();
            assert_eq!(header.mtime().unwrap(), 1_700_000_000);
            assert_eq!(header.username().unwrap(), Some(""));
            seen.push((path, header.mode().unwrap(), link, body));
        }
        let names: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["d/", "d/hard", "d/link", &long, "d/é", "tmp/"]);
        assert_eq!(seen[5].1, 0o1777);
        // d/hard sorts before the long name, so it holds the content.
        assert_eq!(seen[1].3, b"long");
        assert_eq!(seen[3].2.as_deref(), Some("d/hard"));
        assert_eq!(seen[2].2.as_deref(), Some("n".repeat(150).as_str()));
    }

    #[test]
    fn sizes_of_8_gib_and_more_go_to_a_pax_record() {
        let mut tar = TarWriter::new(Vec::new(), 0);
        let header = |size| Header {
            name: "big",
            typeflag: b'0',
            mode: 0o644,
            uid: 0,
            gid: 0,
            size,
            link_name: "",
        };
        tar.write_header(&header(MAX_OCTAL_11)).unwrap();
        assert_eq!(tar.get_mut().len(), 512, "no PAX below 8 GiB");
        tar.write_header(&header(9 << 30)).unwrap();
        let bytes = tar.get_mut().clone();
        assert_eq!(bytes.len(), 512 * 4);
        assert_eq!(bytes[512 + 156], b'x');
        let record = String::from_utf8_lossy(&bytes[1024..1536]);
        assert!(record.starts_with("19 size=9663676416\n"), "{record}");
        // The ustar field of the real header is zero; readers take the PAX value.
        assert_eq!(&bytes[1536 + 124..1536 + 136], b"00000000000\0");
        let parsed = tar::Header::from_byte_slice(&bytes[1536..2048]);
        assert_eq!(parsed.path().unwrap().to_str(), Some("big"));
    }

    #[test]
    fn a_reader_of_the_wrong_size_is_an_error() {
        let p = |s: &str| LayerPath::parse(s).unwrap();
        let mut entry = Entry::file_bytes(p("f"), 0o644, &b"abc"[..]);
        if let EntryKind::File { size, .. } = &mut entry.kind {
            *size = 5;
        }
        let contents = LayerContents::from_entries([entry]).unwrap();
        let err = write_layer_tar(&contents, 0, Vec::new()).unwrap_err();
        assert!(matches!(
            err,
            LayerError::SizeMismatch {
                expected: 5,
                found: 3,
                ..
            }
        ));
    }
}
