//! The `copy` layer: the recipe's `copy:` entries, the team's code, as the image's top
//! layer, so a code change rebuilds this layer alone and a push uploads it alone.
//!
//! Planning reads every source file once (its sha256 goes into the key: the key is the
//! content, not a timestamp); staging copies the files and checks each against what
//! planning read, so a file edited during the build fails it rather than ship a layer
//! whose key says otherwise. Files are root's, 0644 or 0755 by their owner-execute bit,
//! symlinks are kept as links (never followed: a link cannot pull a host file in).
//! Every source file is read through [`ContainedFile`]: no link is followed on the way, a
//! FIFO or device swapped in is refused without blocking, staging opens the same inode of
//! the same size planning read and copies exactly that many bytes.
//! A directory above a destination that the `user` layer gives the user (home, workdir)
//! keeps that owner: a layer's directory entry replaces the lower one's, and a checkpoint
//! written next to the code must stay writable.

pub mod dockerignore;
pub(crate) mod error;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::below::{walk_down, Below, LowerKind};
use super::view::LayerBelow;
use super::{LayerStager, Part, ASSEMBLER};
use crate::cache::Staging;
use crate::contained_file::{ContainedFile, FileIdentity};
use crate::digest::{Digest, Hasher, HashingWriter};
use crate::layer::{CacheKey, DirOptions, LayerPath, RecordedOwners};
use crate::recipe::CopyEntry;
use crate::stack::error::{io_error, BuildError};
use crate::stack::files::write_record;
use dockerignore::IgnorePatterns;
pub use error::CopyError;

/// What one image path of the layer is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Dir,
    File {
        /// Relative to the recipe's directory, read through [`ContainedFile`].
        source: PathBuf,
        /// The file planning read: staging must find the same.
        identity: FileIdentity,
        sha256: Digest,
        executable: bool,
        /// Starts with the ELF magic: a library or program the audit must see.
        elf: bool,
    },
    Symlink {
        target: String,
    },
}

/// The copy layer of a recipe with `copy:` entries.
pub(crate) struct CopyLayer {
    key: CacheKey,
    /// The recipe's directory, canonical: every source is read below it.
    context: PathBuf,
    /// Image path (relative, `/`-separated) -> what goes there, parents before children.
    items: BTreeMap<String, Item>,
    /// Directories on the way to the destinations (they keep a lower layer's owner).
    on_the_way: Vec<LayerPath>,
    /// Every layer below, bottom first.
    below: Vec<LayerBelow>,
    /// This layer's owners record (the directories on the way, as the layers below have them).
    owners_record: PathBuf,
}

impl CopyLayer {
    /// Read the sources of `entries` from `context` (the recipe's directory); None without
    /// entries. `below` are the layers under this one, bottom first: the directories on the
    /// way keep their owner and mode, and no path may go through one of their links.
    pub fn plan(
        entries: &[CopyEntry],
        context: &Path,
        below: &[&dyn LayerStager],
        staging: &Staging,
    ) -> Result<Option<Self>, BuildError> {
        if entries.is_empty() {
            return Ok(None);
        }
        let context = context.canonicalize().map_err(io_error(context))?;
        let dockerignore = IgnorePatterns::load(&context).map_err(CopyError::Patterns)?;
        let mut items: BTreeMap<String, (Item, String)> = BTreeMap::new();
        let mut on_the_way = Vec::new();
        for entry in entries {
            let planned = plan_entry(entry, &context, &dockerignore)?;
            on_the_way.extend(directories_above(&entry.dst, planned.dst_is_dir));
            for (path, item) in planned.items {
                if let Some((_, first)) = items.get(&path) {
                    if !(item == Item::Dir && items[&path].0 == Item::Dir) {
                        return Err(CopyError::Overlap {
                            first: first.clone(),
                            second: entry.to_string(),
                            path,
                        }
                        .into());
                    }
                }
                items.insert(path, (item, entry.to_string()));
            }
        }
        refuse_writes_through_links(&items)?;
        let items: BTreeMap<String, Item> = items.into_iter().map(|(p, (i, _))| (p, i)).collect();
        on_the_way.sort();
        on_the_way.dedup();
        // The top layer below names every layer under it: a change there re-checks this
        // small layer against the new trees.
        let inputs: Vec<Digest> = [manifest_digest(&items)]
            .into_iter()
            .chain(below.last().map(|layer| layer.key().digest()))
            .collect();
        let key = CacheKey::new(
            &format!("{ASSEMBLER}/copy"),
            &inputs,
            &on_the_way.iter().map(LayerPath::as_str).collect::<Vec<_>>(),
        );
        Ok(Some(Self {
            owners_record: staging.dir(&key).with_extension("owners.json"),
            key,
            context,
            items,
            on_the_way,
            below: below
                .iter()
                .map(|layer| LayerBelow::of(*layer, staging))
                .collect(),
        }))
    }
}

impl LayerStager for CopyLayer {
    fn name(&self) -> &str {
        "copy"
    }
    fn part(&self) -> Part {
        Part::Team
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let owners = self.check_against_below()?;
        for (path, item) in &self.items {
            let target = dir.join(path);
            if let Some(parent) = target.parent() {
                fs_err::create_dir_all(parent).map_err(io_error(parent))?;
            }
            match item {
                Item::Dir => fs_err::create_dir_all(&target).map_err(io_error(&target))?,
                Item::File {
                    source,
                    identity,
                    sha256,
                    executable,
                    ..
                } => {
                    let file = ContainedFile::open_planned(&self.context, source, *identity)
                        .map_err(|error| CopyError::Source {
                            entry: source.display().to_string(),
                            error,
                        })?;
                    copy_checked(file, *sha256, &target, *executable)?
                }
                Item::Symlink { target: link } => {
                    std::os::unix::fs::symlink(link, &target).map_err(io_error(&target))?
                }
            }
        }
        write_record(&self.owners_record, &owners.to_json())
    }
    /// Root's files, modes normalised; the user's directories as the user layer made them.
    fn walk(&self) -> DirOptions {
        DirOptions {
            recorded: Some(self.owners_record.clone()),
            ..DirOptions::default()
        }
    }
}

impl CopyLayer {
    /// Whether the layer cannot change the static audit's verdict on the layers `below`
    /// (their staged trees): it adds only plain files that are no ELF object, no Python
    /// distribution metadata or `.pth`, and replace nothing below (directories may merge).
    /// Then the audit of the layers below stands for the image, and a code change is not
    /// re-audited file by file.
    pub fn cannot_change_the_audit(&self, below: &[LayerBelow]) -> Result<bool, BuildError> {
        let below = open_below(below)?;
        Ok(self.items.iter().all(|(path, item)| match item {
            Item::Dir => true,
            Item::Symlink { .. } | Item::File { elf: true, .. } => false,
            Item::File { .. } => {
                let python_metadata = path
                    .split('/')
                    .any(|part| part.ends_with(".dist-info") || part.ends_with(".egg-info"))
                    || path.ends_with(".pth");
                !python_metadata
                    && walk_down(&below, path)
                        .last()
                        .is_none_or(|(found, _)| found != path)
            }
        }))
    }

    /// What the layers below have where this layer writes: a path through one of their
    /// links, or a file where they have a directory (or the reverse), is refused, since the
    /// layer would replace the link or the directory in the image (`/bin` is a link to
    /// `usr/bin` on Debian). Returns the owners and modes of the directories on the way,
    /// as the layers below have them (`/tmp` stays 1777, the user's workdir the user's).
    fn check_against_below(&self) -> Result<RecordedOwners, BuildError> {
        let below = open_below(&self.below)?;
        let mut owners = RecordedOwners::default();
        for dir in &self.on_the_way {
            for (found, entry) in walk_down(&below, dir.as_str()) {
                if let LowerKind::Symlink(target) = &entry.kind {
                    return Err(CopyError::ThroughLink {
                        path: format!("/{}", dir.as_str()),
                        link: format!("/{found}"),
                        target: target.clone(),
                    }
                    .into());
                }
                if found == dir.as_str() {
                    if entry.kind != LowerKind::Dir {
                        return Err(CopyError::Replaces {
                            path: format!("/{found}"),
                            what: "a directory over a file",
                        }
                        .into());
                    }
                    owners.insert(dir, entry.recorded);
                }
            }
        }
        for (path, item) in &self.items {
            let Some((found, entry)) = walk_down(&below, path).pop() else {
                continue;
            };
            match (&entry.kind, item) {
                (LowerKind::Symlink(target), _) if found != *path => {
                    return Err(CopyError::ThroughLink {
                        path: format!("/{path}"),
                        link: format!("/{found}"),
                        target: target.clone(),
                    }
                    .into())
                }
                (LowerKind::Dir, Item::File { .. } | Item::Symlink { .. }) if found == *path => {
                    return Err(CopyError::Replaces {
                        path: format!("/{found}"),
                        what: "a file over a directory",
                    }
                    .into())
                }
                _ => {}
            }
        }
        Ok(owners)
    }
}

fn open_below(layers: &[LayerBelow]) -> Result<Vec<Below>, BuildError> {
    layers.iter().map(Below::open).collect()
}

/// Refuse an entry that writes through a link another entry copies (`code/k -> /home/ci`
/// and a file for `k/authorized_keys`): staging would follow it on the host.
fn refuse_writes_through_links(items: &BTreeMap<String, (Item, String)>) -> Result<(), CopyError> {
    for (path, (_, entry)) in items {
        let mut parent = path.as_str();
        while let Some((above, _)) = parent.rsplit_once('/') {
            if let Some((Item::Symlink { target }, link_entry)) = items.get(above) {
                return Err(CopyError::ThroughCopiedLink {
                    path: format!("/{path}"),
                    entry: entry.clone(),
                    link: format!("/{above}"),
                    target: target.clone(),
                    link_entry: link_entry.clone(),
                });
            }
            parent = above;
        }
    }
    Ok(())
}

/// One entry's image paths.
struct PlannedEntry {
    items: Vec<(String, Item)>,
    /// The source is a directory: its contents go into `dst`.
    dst_is_dir: bool,
}

fn plan_entry(
    entry: &CopyEntry,
    context: &Path,
    dockerignore: &IgnorePatterns,
) -> Result<PlannedEntry, BuildError> {
    let shown = entry.to_string();
    let written = context.join(&entry.src);
    let source = written.canonicalize().map_err(|_| CopyError::Missing {
        entry: shown.clone(),
        path: written.clone(),
        context: context.to_path_buf(),
    })?;
    let in_context = source
        .strip_prefix(context)
        .map_err(|_| CopyError::Escapes {
            entry: shown.clone(),
            path: written.clone(),
            context: context.to_path_buf(),
        })?
        .to_path_buf();
    let excludes = IgnorePatterns::parse(
        entry.exclude.iter().map(String::as_str),
        &format!("copy `{shown}` exclude"),
    )
    .map_err(CopyError::Patterns)?;
    let walk = SourceWalk {
        entry: &shown,
        context,
        dockerignore,
        excludes: &excludes,
    };
    let context_relative = utf8(&in_context, &shown)?;
    if !context_relative.is_empty() && dockerignore.excludes(&context_relative) {
        return Err(CopyError::Excluded {
            entry: shown,
            path: written,
            why: "the recipe directory's .dockerignore".into(),
        }
        .into());
    }
    let dst = entry.dst.trim_start_matches('/').to_string();
    let meta = fs_err::metadata(&source).map_err(io_error(&source))?;
    if !meta.is_dir() {
        let item = walk.item(&source, &context_relative)?;
        return Ok(PlannedEntry {
            items: vec![(dst, item)],
            dst_is_dir: false,
        });
    }
    let mut items = Vec::new();
    walk.directory(&source, &context_relative, "", &dst, &mut items)?;
    Ok(PlannedEntry {
        items,
        dst_is_dir: true,
    })
}

/// Walking one entry's source directory with its exclude patterns.
struct SourceWalk<'a> {
    entry: &'a str,
    /// The recipe's directory: files are read below it without following links.
    context: &'a Path,
    dockerignore: &'a IgnorePatterns,
    excludes: &'a IgnorePatterns,
}

impl SourceWalk<'_> {
    /// Add what `dir` holds (sorted), `context_rel` and `src_rel` being its path relative to
    /// the recipe directory and to the entry's source. Returns whether anything was added.
    fn directory(
        &self,
        dir: &Path,
        context_rel: &str,
        src_rel: &str,
        dst: &str,
        items: &mut Vec<(String, Item)>,
    ) -> Result<bool, BuildError> {
        let mut names = Vec::new();
        for child in fs_err::read_dir(dir).map_err(io_error(dir))? {
            let child = child.map_err(io_error(dir))?;
            names.push(utf8(Path::new(&child.file_name()), self.entry)?);
        }
        names.sort();
        let mut added = false;
        for name in names {
            let path = dir.join(&name);
            let context_child = join(context_rel, &name);
            let src_child = join(src_rel, &name);
            let image_path = join(dst, &name);
            let excluded =
                self.dockerignore.excludes(&context_child) || self.excludes.excludes(&src_child);
            let meta = fs_err::symlink_metadata(&path).map_err(io_error(&path))?;
            if meta.is_dir() {
                let may_reinclude =
                    self.dockerignore.has_exceptions() || self.excludes.has_exceptions();
                if excluded && !may_reinclude {
                    continue;
                }
                let at = items.len();
                items.push((image_path.clone(), Item::Dir));
                let inner =
                    self.directory(&path, &context_child, &src_child, &image_path, items)?;
                if excluded && !inner {
                    items.remove(at);
                    continue;
                }
                added = true;
            } else if !excluded {
                items.push((image_path, self.item(&path, &context_child)?));
                added = true;
            }
        }
        Ok(added)
    }

    /// A file or symbolic link (`path`, `context_rel` below the recipe's directory), read
    /// and hashed.
    fn item(&self, path: &Path, context_rel: &str) -> Result<Item, BuildError> {
        let meta = fs_err::symlink_metadata(path).map_err(io_error(path))?;
        let file_type = meta.file_type();
        if file_type.is_symlink() {
            let target = fs_err::read_link(path).map_err(io_error(path))?;
            return Ok(Item::Symlink {
                target: utf8(&target, self.entry)?,
            });
        }
        if !file_type.is_file() {
            return Err(CopyError::SpecialFile {
                entry: self.entry.to_string(),
                path: path.to_path_buf(),
                kind: special_kind(&file_type),
            }
            .into());
        }
        // Opened again without following links: the file may have been swapped for a
        // link, a FIFO or a device since the lstat above.
        let file = ContainedFile::open(self.context, Path::new(context_rel)).map_err(|error| {
            CopyError::Source {
                entry: self.entry.to_string(),
                error,
            }
        })?;
        let identity = file.identity();
        let executable = file.mode() & 0o100 != 0;
        let (sha256, elf) = sha256_of(file, self.entry)?;
        Ok(Item::File {
            source: PathBuf::from(context_rel),
            identity,
            sha256,
            executable,
            elf,
        })
    }
}

fn special_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "named pipe"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// `a`, `b` -> `a/b`; `` , `b` -> `b`.
fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

fn utf8(path: &Path, entry: &str) -> Result<String, CopyError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| CopyError::NotUtf8 {
            entry: entry.to_string(),
            path: path.to_path_buf(),
        })
}

/// The directories above `dst` (and `dst` itself for a directory source): the way to
/// what the layer adds, not part of it.
fn directories_above(dst: &str, dst_is_dir: bool) -> Vec<LayerPath> {
    let relative = dst.trim_start_matches('/');
    let mut dirs: Vec<&str> = relative
        .match_indices('/')
        .map(|(i, _)| &relative[..i])
        .collect();
    if dst_is_dir {
        dirs.push(relative);
    }
    dirs.into_iter()
        .filter_map(|d| LayerPath::parse(d).ok())
        .collect()
}

/// The file's sha256, and whether it starts with the ELF magic.
fn sha256_of(file: ContainedFile, entry: &str) -> Result<(Digest, bool), BuildError> {
    let mut sink = MagicAndHash {
        hasher: Hasher::new(),
        magic: Vec::with_capacity(4),
    };
    file.copy_to(&mut sink).map_err(|error| CopyError::Source {
        entry: entry.to_string(),
        error,
    })?;
    Ok((sink.hasher.finish().0, sink.magic == b"\x7fELF"))
}

/// Hashes what is written, and keeps its first four bytes.
struct MagicAndHash {
    hasher: Hasher,
    magic: Vec<u8>,
}

impl std::io::Write for MagicAndHash {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let wanted = 4 - self.magic.len();
        self.magic.extend(bytes.iter().take(wanted));
        self.hasher.update(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Copy `file` (opened as planning saw it) to `target` and check it is still the file
/// planning read.
fn copy_checked(
    file: ContainedFile,
    planned: Digest,
    target: &Path,
    executable: bool,
) -> Result<(), BuildError> {
    // One pass: the bytes are hashed as they are copied, so what was written is what
    // is checked.
    let source = file.path().to_path_buf();
    let out = fs_err::File::create(target).map_err(io_error(target))?;
    let mut writer = HashingWriter::new(out);
    file.copy_to(&mut writer)
        .map_err(|error| CopyError::Source {
            entry: source.display().to_string(),
            error,
        })?;
    let (_, staged, _) = writer.finish();
    if staged != planned {
        return Err(CopyError::Changed {
            path: source,
            planned,
            staged,
        }
        .into());
    }
    let mode = if executable { 0o755 } else { 0o644 };
    fs_err::set_permissions(target, std::fs::Permissions::from_mode(mode)).map_err(io_error(target))
}

/// The digest of what the layer holds: each path with its kind, content and mode.
fn manifest_digest(items: &BTreeMap<String, Item>) -> Digest {
    let mut manifest = String::new();
    for (path, item) in items {
        let line = match item {
            Item::Dir => format!("dir {path}\n"),
            Item::File {
                sha256, executable, ..
            } => format!("file {path} {} {}\n", sha256.hex(), u8::from(*executable)),
            Item::Symlink { target } => format!("link {path} -> {target}\n"),
        };
        manifest.push_str(&line);
    }
    Digest::of_bytes(manifest.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(src: &str, dst: &str, exclude: &[&str]) -> CopyEntry {
        CopyEntry {
            src: src.into(),
            dst: dst.into(),
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// A staging area (the owners records go there), removed with the TempDir.
    fn staging() -> (tempfile::TempDir, Staging) {
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging::open(dir.path()).unwrap();
        (dir, staging)
    }

    fn context() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs_err::create_dir_all(root.join("train/__pycache__")).unwrap();
        fs_err::create_dir_all(root.join("train/data")).unwrap();
        fs_err::write(root.join("train/train.py"), "print('step')\n").unwrap();
        fs_err::write(root.join("train/__pycache__/train.pyc"), "x").unwrap();
        fs_err::write(root.join("train/data/shard.bin"), "big").unwrap();
        fs_err::write(root.join("train/run.sh"), "#!/bin/sh\n").unwrap();
        fs_err::set_permissions(
            root.join("train/run.sh"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::os::unix::fs::symlink("train.py", root.join("train/main.py")).unwrap();
        fs_err::write(root.join(".dockerignore"), "**/__pycache__\n").unwrap();
        dir
    }

    #[test]
    fn plans_what_dockerignore_and_excludes_leave() {
        let dir = context();
        let (_staging_dir, staging) = staging();
        let layer = CopyLayer::plan(
            &[entry("train", "/workspace/train", &["data"])],
            dir.path(),
            &[],
            &staging,
        )
        .unwrap()
        .unwrap();
        let paths: Vec<&str> = layer.items.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "workspace/train/main.py",
                "workspace/train/run.sh",
                "workspace/train/train.py"
            ]
        );
        assert!(matches!(
            layer.items["workspace/train/run.sh"],
            Item::File {
                executable: true,
                ..
            }
        ));
        let on_the_way: Vec<&str> = layer.on_the_way.iter().map(LayerPath::as_str).collect();
        assert_eq!(on_the_way, ["workspace", "workspace/train"]);
    }

    #[test]
    fn the_key_follows_content_not_time() {
        let dir = context();
        let (_staging_dir, staging) = staging();
        let entries = [entry("train", "/workspace/train", &[])];
        let key = |dir: &Path| {
            CopyLayer::plan(&entries, dir, &[], &staging)
                .unwrap()
                .unwrap()
                .key
        };
        let first = key(dir.path());
        filetime_touch(&dir.path().join("train/train.py"));
        assert_eq!(key(dir.path()), first, "a touched file is the same file");
        fs_err::write(dir.path().join("train/train.py"), "print('step 2')\n").unwrap();
        assert_ne!(key(dir.path()), first);
    }

    fn filetime_touch(path: &Path) {
        let bytes = fs_err::read(path).unwrap();
        fs_err::remove_file(path).unwrap();
        fs_err::write(path, bytes).unwrap();
    }

    #[test]
    fn refuses_escapes_special_files_and_overlaps() {
        let dir = context();
        let (_staging_dir, staging) = staging();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("escape")).unwrap();
        let error = CopyLayer::plan(&[entry("escape", "/x", &[])], dir.path(), &[], &staging)
            .err()
            .unwrap();
        assert!(
            error.to_string().contains("outside the recipe's directory"),
            "{error}"
        );
        let error = CopyLayer::plan(&[entry("missing", "/x", &[])], dir.path(), &[], &staging)
            .err()
            .unwrap();
        assert!(error.to_string().contains("does not exist"), "{error}");
        let error = CopyLayer::plan(
            &[
                entry("train/train.py", "/w/a.py", &[]),
                entry("train/run.sh", "/w/a.py", &[]),
            ],
            dir.path(),
            &[],
            &staging,
        )
        .err()
        .unwrap();
        assert!(
            error.to_string().contains("both write `/w/a.py`"),
            "{error}"
        );
        let fifo = dir.path().join("train/pipe");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let error = CopyLayer::plan(&[entry("train", "/w", &[])], dir.path(), &[], &staging)
            .err()
            .unwrap();
        assert!(error.to_string().contains("named pipe"), "{error}");
    }

    #[test]
    fn plain_code_cannot_change_the_audit_but_libraries_and_shadows_can() {
        let dir = context();
        let (_staging_dir, staging) = staging();
        let below = tempfile::tempdir().unwrap();
        let plan = |src: &str, dst: &str| {
            CopyLayer::plan(&[entry(src, dst, &[])], dir.path(), &[], &staging)
                .unwrap()
                .unwrap()
        };
        let trees = [LayerBelow::tree(below.path())];
        assert!(plan("train/train.py", "/w/train.py")
            .cannot_change_the_audit(&trees)
            .unwrap());
        // A symlink, an ELF object, a file over one of a layer below: a full audit.
        assert!(!plan("train", "/w").cannot_change_the_audit(&trees).unwrap());
        fs_err::write(dir.path().join("lib.so"), b"\x7fELF\x02\x01\x01").unwrap();
        assert!(!plan("lib.so", "/w/lib.so")
            .cannot_change_the_audit(&trees)
            .unwrap());
        fs_err::create_dir_all(below.path().join("etc")).unwrap();
        fs_err::write(below.path().join("etc/hosts"), "").unwrap();
        assert!(!plan("train/train.py", "/etc/hosts")
            .cannot_change_the_audit(&trees)
            .unwrap());
    }

    /// A layer below, staged: what `CopyLayer` reads through its staging directory.
    struct Lower {
        key: CacheKey,
    }
    impl LayerStager for Lower {
        fn name(&self) -> &str {
            "lower"
        }
        fn part(&self) -> Part {
            Part::Stack
        }
        fn key(&self) -> &CacheKey {
            &self.key
        }
        fn stage(&self, _dir: &Path) -> Result<(), BuildError> {
            Ok(())
        }
    }

    /// A staged lower tree with /tmp 1777, /bin -> usr/bin and /etc/hosts.
    fn lower(staging: &Staging) -> Lower {
        let lower = Lower {
            key: CacheKey::new("test/lower", &[], &"lower"),
        };
        let tree = staging.dir(&lower.key);
        fs_err::create_dir_all(tree.join("tmp")).unwrap();
        fs_err::set_permissions(tree.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        fs_err::create_dir_all(tree.join("usr/bin")).unwrap();
        std::os::unix::fs::symlink("usr/bin", tree.join("bin")).unwrap();
        fs_err::create_dir_all(tree.join("etc/hosts.d")).unwrap();
        lower
    }

    #[test]
    fn the_layers_below_keep_their_directories_and_links() {
        let dir = context();
        let (_staging_dir, staging) = staging();
        let lower = lower(&staging);
        let below: [&dyn LayerStager; 1] = [&lower];
        let stage = |src: &str, dst: &str| {
            let layer = CopyLayer::plan(&[entry(src, dst, &[])], dir.path(), &below, &staging)
                .unwrap()
                .unwrap();
            let out = tempfile::tempdir().unwrap();
            layer.stage(out.path()).map(|()| (layer, out))
        };
        // /tmp keeps 1777: the layer records the lower directory's mode.
        let (layer, _out) = stage("train/train.py", "/tmp/cache/train.py").unwrap();
        let owners = RecordedOwners::read(&layer.owners_record).unwrap();
        assert_eq!(
            owners.get(&LayerPath::parse("tmp").unwrap()).unwrap().mode,
            0o1777
        );
        // Through /bin, a link of the image: refused, naming it.
        let error = stage("train/train.py", "/bin/train").err().unwrap();
        assert!(
            error.to_string().contains("`/bin`, a symbolic link"),
            "{error}"
        );
        // A file where the image has a directory.
        let error = stage("train/train.py", "/etc/hosts.d").err().unwrap();
        assert!(
            error.to_string().contains("a file over a directory"),
            "{error}"
        );
    }

    #[test]
    fn an_entry_cannot_write_through_a_link_another_copies() {
        let dir = context();
        let (_staging_dir, staging) = staging();
        std::os::unix::fs::symlink("/root", dir.path().join("train/k")).unwrap();
        let error = CopyLayer::plan(
            &[
                entry("train", "/w", &[]),
                entry("train/train.py", "/w/k/authorized_keys", &[]),
            ],
            dir.path(),
            &[],
            &staging,
        )
        .err()
        .unwrap();
        assert!(
            error.to_string().contains("staging would follow it"),
            "{error}"
        );
    }

    #[test]
    fn staging_checks_the_files_against_the_plan() {
        let dir = context();
        let (_staging_dir, staging) = staging();
        let layer = CopyLayer::plan(&[entry("train", "/w", &[])], dir.path(), &[], &staging)
            .unwrap()
            .unwrap();
        let staged = tempfile::tempdir().unwrap();
        layer.stage(staged.path()).unwrap();
        let mode = fs_err::metadata(staged.path().join("w/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            fs_err::read_link(staged.path().join("w/main.py")).unwrap(),
            Path::new("train.py")
        );
        fs_err::write(dir.path().join("train/train.py"), "edited\n").unwrap();
        let again = tempfile::tempdir().unwrap();
        let error = layer.stage(again.path()).unwrap_err();
        // Another size is seen before a byte is copied; same size, the sha256 differs.
        assert!(error.to_string().contains("changed while"), "{error}");
    }

    /// Plan `train` into `/w`, swap `train/train.py` for what `swap` makes, and stage on
    /// another thread: a stage that blocks or never ends fails after `seconds` instead of
    /// hanging the suite.
    fn stage_after_swap(swap: impl FnOnce(&Path), seconds: u64) -> Result<(), String> {
        let dir = context();
        let (staging_dir, staging) = staging();
        let layer = CopyLayer::plan(&[entry("train", "/w", &[])], dir.path(), &[], &staging)
            .unwrap()
            .unwrap();
        let source = dir.path().join("train/train.py");
        fs_err::remove_file(&source).unwrap();
        swap(&source);
        let staged = tempfile::tempdir().unwrap();
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let result = layer.stage(staged.path()).map_err(|e| e.to_string());
            let _ = send.send(result);
            drop((dir, staging_dir, staged));
        });
        receive
            .recv_timeout(std::time::Duration::from_secs(seconds))
            .expect("staging hung")
    }

    #[test]
    fn a_source_swapped_for_a_link_to_a_host_file_is_not_read() {
        // Root read the host file and printed its sha256 in the error.
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("id_ed25519");
        fs_err::write(&secret, "PRIVATE KEY\n").unwrap();
        let leaked = Digest::of_bytes(b"PRIVATE KEY\n").hex().to_string();
        let error = stage_after_swap(
            |source| std::os::unix::fs::symlink(&secret, source).unwrap(),
            10,
        )
        .unwrap_err();
        assert!(!error.contains(&leaked), "{error}");
        assert!(error.contains("symbolic link"), "{error}");
    }

    #[test]
    fn a_source_swapped_for_a_fifo_does_not_hang_the_build() {
        let error = stage_after_swap(
            |source| {
                let path = std::ffi::CString::new(source.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
            },
            10,
        )
        .unwrap_err();
        assert!(error.contains("named pipe"), "{error}");
    }

    #[test]
    fn a_source_swapped_for_dev_zero_does_not_fill_the_disk() {
        let error = stage_after_swap(
            |source| std::os::unix::fs::symlink("/dev/zero", source).unwrap(),
            10,
        )
        .unwrap_err();
        assert!(error.contains("symbolic link"), "{error}");
    }

    #[test]
    fn a_source_that_grew_after_planning_is_refused_without_reading_the_rest() {
        let error = stage_after_swap(
            |source| fs_err::write(source, "print('step')\n".repeat(1000)).unwrap(),
            10,
        )
        .unwrap_err();
        assert!(error.contains("changed while"), "{error}");
    }

    #[test]
    fn a_long_source_name_is_cut_in_the_message() {
        // A 100 KB name was echoed whole, twice.
        let dir = context();
        let (_staging_dir, staging) = staging();
        let long = "n".repeat(100_000);
        let error = CopyLayer::plan(&[entry(&long, "/x", &[])], dir.path(), &[], &staging)
            .err()
            .unwrap()
            .to_string();
        assert!(error.len() < 2000, "{} bytes", error.len());
        assert!(error.contains("… (100"), "{error}");
    }
}
