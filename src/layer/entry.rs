//! What goes into a layer: normalised paths, entries, and the one canonical order.
//!
//! Every input (a directory on disk, a wheel's zip members, a `.tar.xz` from NVIDIA) is
//! turned into [`Entry`] values and then into [`LayerContents`], which is where the
//! determinism and safety rules of a layer live (STYLE.md 8, "determinism is one named
//! step"):
//! - paths are relative, `/`-separated, without `.`/`..`/empty components; absolute paths
//!   and `..` are rejected, never silently rewritten;
//! - entries are sorted by the bytes of the name they get in the tar, so parents always
//!   precede their children and the order never depends on how inputs were discovered;
//! - every parent directory is present (mode 0755, owner 0:0 unless given);
//! - a symlink whose relative target climbs above the layer root is rejected;
//! - a hardlink's content lives in the entry that sorts first in its group, so the tar
//!   never references a file it has not written yet.
//!
//! File content is not read here: a [`FileSource`] opens it when the tar writer gets to it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use super::deflated::{ContentOnly, ZipMember};
use super::LayerError;

/// A normalised path inside a layer: relative, `/`-separated, no `.`, `..` or empty
/// components, never empty (the layer root itself is not an entry).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LayerPath(String);

impl LayerPath {
    /// Parse a member name from any source (`./usr/lib/`, `usr//lib`, `usr/lib`).
    /// A leading `./`, repeated and trailing slashes and `.` components are dropped;
    /// absolute paths and `..` components are errors, because they would write outside
    /// the layer root.
    pub fn parse(raw: &str) -> Result<Self, LayerError> {
        if raw.contains('\0') {
            return Err(LayerError::InvalidPath {
                path: raw.to_string(),
                reason: "contains a NUL byte",
            });
        }
        if raw.starts_with('/') {
            return Err(LayerError::InvalidPath {
                path: raw.to_string(),
                reason: "is absolute; layer paths are relative to the image root",
            });
        }
        let mut parts = Vec::new();
        for component in raw.split('/') {
            match component {
                "" | "." => {}
                ".." => {
                    return Err(LayerError::InvalidPath {
                        path: raw.to_string(),
                        reason: "contains a `..` component",
                    })
                }
                // An OCI runtime reads `.wh.X` as "delete X from the layers below" and
                // `.wh..wh..opq` as "hide the directory's contents": a file of that name
                // cannot be written, only a whiteout ([`EntryKind::Whiteout`]) can.
                other if other.starts_with(".wh.") => {
                    return Err(LayerError::InvalidPath {
                        path: raw.to_string(),
                        reason: "has a name starting with `.wh.`, which marks a whiteout in an OCI layer: the runtime would delete a file of the layers below instead of writing this one",
                    })
                }
                other => parts.push(other),
            }
        }
        if parts.is_empty() {
            return Err(LayerError::InvalidPath {
                path: raw.to_string(),
                reason: "names the layer root itself",
            });
        }
        Ok(LayerPath(parts.join("/")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parent directory, or `None` for a top-level entry.
    pub fn parent(&self) -> Option<LayerPath> {
        self.0
            .rsplit_once('/')
            .map(|(parent, _)| LayerPath(parent.to_string()))
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit_once('/').map_or(&self.0, |(_, name)| name)
    }

    /// A child of this path; `name` must be a single normal component.
    pub fn join(&self, name: &str) -> Result<LayerPath, LayerError> {
        LayerPath::parse(&format!("{}/{}", self.0, name)).and_then(|joined| {
            if name.contains('/') || name == "." || name == ".." || name.is_empty() {
                Err(LayerError::InvalidPath {
                    path: format!("{}/{}", self.0, name),
                    reason: "child name is not a single path component",
                })
            } else {
                Ok(joined)
            }
        })
    }

    /// Number of components.
    fn depth(&self) -> usize {
        self.0.split('/').count()
    }
}

impl fmt::Display for LayerPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LayerPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::str::FromStr for LayerPath {
    type Err = LayerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LayerPath::parse(s)
    }
}

/// Produces a file's content when the tar writer reaches it. Implement it for archive
/// members (a wheel's zip entry, a member of a `.tar.xz`) so their bytes stream straight
/// into the layer without being staged on disk: open the archive, find the member and
/// copy it into `sink`. Writing the wrong number of bytes is an error.
pub trait OpenContent: Send + Sync {
    /// Copy the whole content into `sink`; returns the number of bytes copied.
    fn copy_to(&self, sink: &mut dyn Write) -> io::Result<u64>;
    /// Where the bytes come from, for error messages (`x.whl!torch/lib/libtorch.so`).
    fn describe(&self) -> String;
}

/// Where a regular file's bytes come from.
#[derive(Clone)]
pub enum FileSource {
    /// A file on disk, opened when written (its size is checked against the entry's).
    Path(PathBuf),
    /// Small content held in memory (generated config files, probe scripts).
    Bytes(Arc<[u8]>),
    /// Content produced lazily by the caller.
    Lazy(Arc<dyn OpenContent>),
    /// A member of a zip archive (a wheel), inflated when written; a gzip layer may take
    /// its deflate data instead ([`super::deflated`]).
    ZipMember(Arc<ZipMember>),
}

impl FileSource {
    /// Copy the content into `sink`, returning the number of bytes copied.
    pub fn copy_to(&self, sink: &mut dyn Write) -> io::Result<u64> {
        match self {
            FileSource::Path(path) => {
                let mut file = fs_err::File::open(path)?;
                let mut buffer = vec![0u8; 256 * 1024];
                let mut total = 0u64;
                loop {
                    let n = match file.read(&mut buffer) {
                        Ok(0) => return Ok(total),
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    sink.write_all(&buffer[..n])?;
                    total += n as u64;
                }
            }
            FileSource::Bytes(bytes) => {
                sink.write_all(bytes)?;
                Ok(bytes.len() as u64)
            }
            FileSource::Lazy(opener) => opener.copy_to(sink),
            FileSource::ZipMember(member) => member.inflate_to(&mut ContentOnly(sink)),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            FileSource::Path(path) => path.display().to_string(),
            FileSource::Bytes(_) => "in-memory content".to_string(),
            FileSource::Lazy(opener) => opener.describe(),
            FileSource::ZipMember(member) => member.describe(),
        }
    }
}

impl fmt::Debug for FileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileSource::Path(path) => write!(f, "Path({})", path.display()),
            FileSource::Bytes(bytes) => write!(f, "Bytes({} bytes)", bytes.len()),
            FileSource::Lazy(opener) => write!(f, "Lazy({})", opener.describe()),
            FileSource::ZipMember(member) => write!(f, "ZipMember({})", member.describe()),
        }
    }
}

/// The kind of a layer entry.
#[derive(Debug, Clone)]
pub enum EntryKind {
    Dir,
    File {
        size: u64,
        source: FileSource,
    },
    /// A symbolic link; the target is stored verbatim (absolute targets resolve inside
    /// the container's root, relative ones from the link's directory).
    Symlink {
        target: String,
    },
    /// A hard link to another regular file of the same layer.
    Hardlink {
        target: LayerPath,
    },
    /// Deletes `path` from the layers below (OCI `.wh.<name>`).
    Whiteout,
    /// Hides everything the layers below have inside directory `path` (`.wh..wh..opq`).
    OpaqueWhiteout,
}

/// One entry of a layer.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: LayerPath,
    pub kind: EntryKind,
    /// Permission bits including setuid/setgid/sticky (`0o1777` for `/tmp`), stored as given.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Entry {
    /// A directory owned by root.
    pub fn dir(path: LayerPath, mode: u32) -> Self {
        Self::new(path, EntryKind::Dir, mode)
    }

    /// A regular file owned by root.
    pub fn file(path: LayerPath, mode: u32, size: u64, source: FileSource) -> Self {
        Self::new(path, EntryKind::File { size, source }, mode)
    }

    /// A regular file with in-memory content.
    pub fn file_bytes(path: LayerPath, mode: u32, bytes: impl Into<Arc<[u8]>>) -> Self {
        let bytes = bytes.into();
        let size = bytes.len() as u64;
        Self::file(path, mode, size, FileSource::Bytes(bytes))
    }

    pub fn symlink(path: LayerPath, target: impl Into<String>) -> Self {
        Self::new(
            path,
            EntryKind::Symlink {
                target: target.into(),
            },
            0o777,
        )
    }

    pub fn hardlink(path: LayerPath, target: LayerPath) -> Self {
        Self::new(path, EntryKind::Hardlink { target }, 0o644)
    }

    pub fn whiteout(path: LayerPath) -> Self {
        Self::new(path, EntryKind::Whiteout, 0o644)
    }

    pub fn opaque_whiteout(dir: LayerPath) -> Self {
        Self::new(dir, EntryKind::OpaqueWhiteout, 0o644)
    }

    pub fn new(path: LayerPath, kind: EntryKind, mode: u32) -> Self {
        Self {
            path,
            kind,
            mode,
            uid: 0,
            gid: 0,
        }
    }

    pub fn with_owner(mut self, uid: u32, gid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// The name this entry has in the tar stream, without the trailing `/` of
    /// directories; this is also the sort key of the canonical order.
    pub fn tar_name(&self) -> String {
        match self.kind {
            EntryKind::Whiteout => match self.path.parent() {
                Some(parent) => format!("{}/.wh.{}", parent, self.path.file_name()),
                None => format!(".wh.{}", self.path.file_name()),
            },
            EntryKind::OpaqueWhiteout => format!("{}/.wh..wh..opq", self.path),
            _ => self.path.0.clone(),
        }
    }
}

/// The entries of one layer in canonical order, validated. Build it with
/// [`LayerContents::from_entries`] or [`LayerContents::from_dir`](super::walk).
#[derive(Debug, Clone)]
pub struct LayerContents {
    entries: Vec<Entry>,
}

impl LayerContents {
    /// Validate and canonicalise a list of entries given in any order.
    pub fn from_entries(entries: impl IntoIterator<Item = Entry>) -> Result<Self, LayerError> {
        let mut by_name: BTreeMap<String, Entry> = BTreeMap::new();
        let mut opaque_dirs = Vec::new();
        for entry in entries {
            if matches!(entry.kind, EntryKind::OpaqueWhiteout) {
                // The directory an opaque whiteout lives in must exist in this layer;
                // it is added below unless the caller lists it.
                opaque_dirs.push(entry.path.clone());
            }
            if entry.mode > 0o7777 {
                return Err(LayerError::InvalidMode {
                    path: entry.path.to_string(),
                    mode: entry.mode,
                });
            }
            let name = entry.tar_name();
            match by_name.get(&name) {
                None => {
                    by_name.insert(name, entry);
                }
                // Two identical directories are the same thing said twice.
                Some(existing)
                    if matches!(existing.kind, EntryKind::Dir)
                        && matches!(entry.kind, EntryKind::Dir) =>
                {
                    if existing.mode != entry.mode
                        || existing.uid != entry.uid
                        || existing.gid != entry.gid
                    {
                        return Err(LayerError::Duplicate { path: name });
                    }
                }
                Some(_) => return Err(LayerError::Duplicate { path: name }),
            }
        }
        for dir in opaque_dirs {
            match by_name.get(dir.as_str()) {
                None => {
                    by_name.insert(dir.0.clone(), Entry::dir(dir, 0o755));
                }
                Some(existing) if matches!(existing.kind, EntryKind::Dir) => {}
                Some(_) => {
                    return Err(LayerError::ParentNotDirectory {
                        path: format!("{dir}/.wh..wh..opq"),
                        parent: dir.to_string(),
                    })
                }
            }
        }

        // Explicit parent directories, and no entry below a non-directory.
        let mut missing: Vec<LayerPath> = Vec::new();
        for entry in by_name.values() {
            let mut parent = entry.path.parent();
            while let Some(dir) = parent {
                match by_name.get(dir.as_str()) {
                    Some(existing) if matches!(existing.kind, EntryKind::Dir) => {}
                    Some(_) => {
                        return Err(LayerError::ParentNotDirectory {
                            path: entry.path.to_string(),
                            parent: dir.to_string(),
                        })
                    }
                    None => missing.push(dir.clone()),
                }
                parent = dir.parent();
            }
        }
        for dir in missing {
            by_name
                .entry(dir.0.clone())
                .or_insert_with(|| Entry::dir(dir, 0o755));
        }

        for entry in by_name.values() {
            if let EntryKind::Symlink { target } = &entry.kind {
                check_symlink_target(&entry.path, target)?;
            }
        }

        let mut entries: Vec<Entry> = by_name.into_values().collect();
        assign_hardlink_holders(&mut entries)?;
        Ok(Self { entries })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Take the content of the files at `members`' paths from those zip members (a tree
    /// staged from wheels, whose files are the members' bytes): a gzip layer then copies
    /// their deflate data instead of compressing the staged files again. Each path must be
    /// a regular file of this layer with the member's size.
    pub fn take_from_zip_members(
        &mut self,
        members: impl IntoIterator<Item = (LayerPath, ZipMember)>,
    ) -> Result<(), LayerError> {
        for (path, member) in members {
            let found = self
                .entries
                .binary_search_by(|entry| entry.tar_name().as_str().cmp(path.as_str()));
            let entry = found.ok().map(|index| &mut self.entries[index]);
            let Some(Entry {
                kind: EntryKind::File { size, source },
                ..
            }) = entry
            else {
                return Err(LayerError::ArchiveMember {
                    archive: member.archive.clone(),
                    member: member.name.clone(),
                    reason: format!("is recorded at `{path}`, which is not a file of the layer"),
                });
            };
            if *size != member.size {
                return Err(LayerError::SizeMismatch {
                    source_name: member.describe(),
                    expected: *size,
                    found: member.size,
                });
            }
            *source = FileSource::ZipMember(Arc::new(member));
        }
        Ok(())
    }

    /// Total bytes of regular-file content (hardlinks counted once).
    pub fn content_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|entry| match entry.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum()
    }
}

/// Reject a relative symlink target that climbs above the layer root when resolved
/// (lexically) from the link's directory. Absolute targets are resolved by the runtime
/// inside the container root, so they cannot escape it.
fn check_symlink_target(path: &LayerPath, target: &str) -> Result<(), LayerError> {
    if target.is_empty() || target.contains('\0') {
        return Err(LayerError::SymlinkEscape {
            path: path.to_string(),
            target: target.to_string(),
        });
    }
    if target.starts_with('/') {
        return Ok(());
    }
    let mut depth = path.depth() as i64 - 1;
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return Err(LayerError::SymlinkEscape {
                        path: path.to_string(),
                        target: target.to_string(),
                    });
                }
            }
            _ => depth += 1,
        }
    }
    Ok(())
}

/// Make the first entry (in canonical order) of every hardlink group hold the content,
/// and every other member a link to it. Targets must be regular files of this layer.
fn assign_hardlink_holders(entries: &mut [Entry]) -> Result<(), LayerError> {
    let index: HashMap<String, usize> = entries
        .iter()
        .enumerate()
        .map(|(i, entry)| (entry.tar_name(), i))
        .collect();
    // Resolve each link to the regular file at the end of its chain.
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..entries.len() {
        let EntryKind::Hardlink { target } = &entries[i].kind else {
            continue;
        };
        let mut target = target.clone();
        let mut hops = 0;
        let file_index = loop {
            let Some(&t) = index.get(target.as_str()) else {
                return Err(LayerError::HardlinkTarget {
                    path: entries[i].path.to_string(),
                    target: target.to_string(),
                    reason: "is not in this layer",
                });
            };
            match &entries[t].kind {
                EntryKind::File { .. } => break t,
                EntryKind::Hardlink { target: next } if hops < entries.len() => {
                    target = next.clone();
                    hops += 1;
                }
                _ => {
                    return Err(LayerError::HardlinkTarget {
                        path: entries[i].path.to_string(),
                        target: target.to_string(),
                        reason: "is not a regular file",
                    })
                }
            }
        };
        groups.entry(file_index).or_default().push(i);
    }
    for (file_index, links) in groups {
        let holder = links.iter().copied().chain([file_index]).min().unwrap();
        if holder != file_index {
            // Move the content (and the inode's mode and owner) to the first entry.
            let content = entries[file_index].clone();
            entries[holder].kind = content.kind;
            entries[holder].mode = content.mode;
            entries[holder].uid = content.uid;
            entries[holder].gid = content.gid;
        }
        let holder_path = entries[holder].path.clone();
        for member in links.into_iter().chain([file_index]) {
            if member != holder {
                entries[member].kind = EntryKind::Hardlink {
                    target: holder_path.clone(),
                };
                entries[member].mode = entries[holder].mode;
                entries[member].uid = entries[holder].uid;
                entries[member].gid = entries[holder].gid;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> LayerPath {
        LayerPath::parse(s).unwrap()
    }

    #[test]
    fn paths_normalise_and_reject_escapes() {
        assert_eq!(p("./usr//lib/").as_str(), "usr/lib");
        assert_eq!(p("a/./b").as_str(), "a/b");
        for bad in ["/etc/passwd", "../x", "a/../../b", "a/..", ".", "", "a\0b"] {
            assert!(LayerPath::parse(bad).is_err(), "{bad:?} accepted");
        }
        let message = LayerPath::parse("usr/../../etc").unwrap_err().to_string();
        assert!(message.contains("usr/../../etc"), "{message}");
        // A file named `.wh.X` would delete X below instead of being written (a copied
        // `usr/share/.wh.cudastack` removed the probe's expectations at run time).
        for whiteout in ["usr/share/.wh.cudastack", ".wh..wh..opq", "a/.wh.b/c"] {
            let message = LayerPath::parse(whiteout).unwrap_err().to_string();
            assert!(message.contains("whiteout"), "{whiteout}: {message}");
        }
        assert_eq!(p("a/.whiteout").as_str(), "a/.whiteout");
    }

    #[test]
    fn canonical_order_adds_parents_and_is_input_order_independent() {
        let make = |reverse: bool| {
            let mut list = vec![
                Entry::file_bytes(p("usr/lib/libfoo.so.1.2.3"), 0o755, &b"elf"[..]),
                Entry::symlink(p("usr/lib/libfoo.so.1"), "libfoo.so.1.2.3"),
                Entry::symlink(p("usr/lib/libfoo.so"), "libfoo.so.1"),
                Entry::dir(p("tmp"), 0o1777),
                Entry::file_bytes(p("usr/lib-x/y"), 0o644, &b""[..]),
            ];
            if reverse {
                list.reverse();
            }
            LayerContents::from_entries(list).unwrap()
        };
        let names = |c: &LayerContents| -> Vec<String> {
            c.entries().iter().map(|e| e.tar_name()).collect()
        };
        assert_eq!(names(&make(false)), names(&make(true)));
        assert_eq!(
            names(&make(false)),
            [
                "tmp",
                "usr",
                "usr/lib",
                "usr/lib-x",
                "usr/lib-x/y",
                "usr/lib/libfoo.so",
                "usr/lib/libfoo.so.1",
                "usr/lib/libfoo.so.1.2.3"
            ]
        );
        let contents = make(false);
        assert_eq!(contents.entries()[0].mode, 0o1777);
        assert_eq!(contents.entries()[1].mode, 0o755);
    }

    #[test]
    fn symlinks_that_climb_out_are_rejected() {
        let ok = LayerContents::from_entries([
            Entry::symlink(p("a/b/c"), "../../x"),
            Entry::symlink(p("a/abs"), "/etc/../../passwd"),
        ]);
        assert!(ok.is_ok());
        let err = LayerContents::from_entries([Entry::symlink(p("a/b/c"), "../../../etc/passwd")])
            .unwrap_err();
        assert!(matches!(err, LayerError::SymlinkEscape { .. }), "{err}");
        assert!(err.to_string().contains("a/b/c"));
        // Nothing may be placed below a symlink (it could point anywhere).
        let err = LayerContents::from_entries([
            Entry::symlink(p("etc"), "/host"),
            Entry::file_bytes(p("etc/passwd"), 0o644, &b""[..]),
        ])
        .unwrap_err();
        assert!(
            matches!(err, LayerError::ParentNotDirectory { .. }),
            "{err}"
        );
    }

    #[test]
    fn hardlink_content_moves_to_the_first_entry() {
        let contents = LayerContents::from_entries([
            Entry::file_bytes(p("z/real"), 0o750, &b"data"[..]),
            Entry::hardlink(p("a/link"), p("z/real")),
            Entry::hardlink(p("m/link2"), p("a/link")),
        ])
        .unwrap();
        let by_name: HashMap<String, &Entry> = contents
            .entries()
            .iter()
            .map(|e| (e.tar_name(), e))
            .collect();
        assert!(matches!(
            by_name["a/link"].kind,
            EntryKind::File { size: 4, .. }
        ));
        assert_eq!(by_name["a/link"].mode, 0o750);
        for other in ["z/real", "m/link2"] {
            match &by_name[other].kind {
                EntryKind::Hardlink { target } => assert_eq!(target.as_str(), "a/link"),
                kind => panic!("{other}: {kind:?}"),
            }
        }
        let err = LayerContents::from_entries([Entry::hardlink(p("a"), p("missing"))]).unwrap_err();
        assert!(matches!(err, LayerError::HardlinkTarget { .. }));
    }

    #[test]
    fn duplicates_are_errors_and_whiteouts_get_oci_names() {
        let err = LayerContents::from_entries([
            Entry::file_bytes(p("a"), 0o644, &b"1"[..]),
            Entry::file_bytes(p("./a"), 0o644, &b"2"[..]),
        ])
        .unwrap_err();
        assert!(matches!(err, LayerError::Duplicate { .. }));
        let contents = LayerContents::from_entries([
            Entry::whiteout(p("etc/old.conf")),
            Entry::opaque_whiteout(p("var/cache")),
            Entry::dir(p("var/cache"), 0o700),
        ])
        .unwrap();
        assert_eq!(contents.entries()[3].mode, 0o700);
        let names: Vec<String> = contents.entries().iter().map(|e| e.tar_name()).collect();
        assert_eq!(
            names,
            [
                "etc",
                "etc/.wh.old.conf",
                "var",
                "var/cache",
                "var/cache/.wh..wh..opq"
            ]
        );
    }
}
