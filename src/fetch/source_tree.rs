//! A project's source tree, in memory, and its canonical archive: what a git requirement's
//! commit or a local project directory becomes before it is built like an sdist.
//!
//! The archive depends on the tree alone: entries sorted by path, files 0644 or 0755,
//! directories 0755, symbolic links as they are (never followed), owner 0, one fixed mtime,
//! and no compression (a compressor's output may change between its versions; fixed tar
//! headers do not). So its sha256, which the lock records, names the tree.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::contained_file::{self, ContainedFile};
use crate::digest::Digest;

/// The most a tree may hold, as for an sdist: source, not data.
pub const MAX_TREE_BYTES: u64 = 256 * 1024 * 1024;
pub const MAX_TREE_ENTRIES: usize = 200_000;

/// The mtime of every entry of a source archive: 2000-01-01T00:00:00Z (zip, which a
/// wheel is, cannot hold times before 1980 in any time zone).
pub const ARCHIVE_MTIME: u64 = 946_684_800;

/// One entry of a source tree.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TreeEntry {
    Dir,
    File { executable: bool, bytes: Vec<u8> },
    Symlink(String),
}

/// A source tree in memory: paths relative to its top.
#[derive(Debug, Clone, Default)]
pub struct SourceTree {
    entries: BTreeMap<String, TreeEntry>,
}

impl SourceTree {
    /// Read a tar stream (`git archive`'s) into a tree, bounded by [`MAX_TREE_BYTES`] and
    /// [`MAX_TREE_ENTRIES`].
    pub fn read_tar(reader: impl Read) -> Result<SourceTree, String> {
        let mut archive = tar::Archive::new(reader.take(2 * MAX_TREE_BYTES));
        let mut tree = SourceTree::default();
        let mut total = 0u64;
        let entries = archive
            .entries()
            .map_err(|e| format!("its archive is not a tar: {e}"))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| format!("its archive is not a readable tar: {e}"))?;
            let kind = entry.header().entry_type();
            if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
                continue;
            }
            let path = entry
                .path()
                .map_err(|e| format!("an entry has an unreadable name: {e}"))?
                .into_owned();
            let name = plain_path(&path)?;
            let value = if kind.is_dir() {
                TreeEntry::Dir
            } else if kind.is_symlink() {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .and_then(|t| t.to_str().map(str::to_string))
                    .ok_or_else(|| format!("the link `{name}` has no readable target"))?;
                TreeEntry::Symlink(target)
            } else if kind.is_file() {
                total += entry.size();
                if total > MAX_TREE_BYTES {
                    return Err(format!("it holds more than {} MiB", MAX_TREE_BYTES >> 20));
                }
                let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
                let mut bytes = Vec::with_capacity(entry.size() as usize);
                entry
                    .read_to_end(&mut bytes)
                    .map_err(|e| format!("`{name}` could not be read: {e}"))?;
                TreeEntry::File { executable, bytes }
            } else {
                return Err(format!(
                    "`{name}` is neither a file, a directory nor a link"
                ));
            };
            if name.is_empty() {
                continue;
            }
            tree.entries.insert(name, value);
            if tree.entries.len() > MAX_TREE_ENTRIES {
                return Err(format!("it has more than {MAX_TREE_ENTRIES} entries"));
            }
        }
        Ok(tree)
    }

    /// Read a local project's directory: in a git work tree the files git would commit
    /// (tracked, and untracked ones it does not ignore: `.gitignore` applies), elsewhere
    /// every file; never what changes when the source does not ([`left_out`]). Nothing is
    /// followed (a link is kept as a link) and nothing but regular files is opened
    /// (`contained_file`). Directories are those that hold something. Bounded as
    /// [`Self::read_tar`] is.
    pub fn read_dir(root: &Path) -> Result<SourceTree, String> {
        let listed = match git_listed(root) {
            Some(listed) => listed,
            None => walk(root)?,
        };
        let mut tree = SourceTree::default();
        let mut total = 0u64;
        let mut layouts = BTreeMap::new();
        for relative in listed {
            let shown = plain_path(&relative)?;
            let mut names = shown.split('/');
            let top = names.next().unwrap_or_default();
            if left_out(top, true) || names.any(|name| left_out(name, false)) {
                continue;
            }
            if in_oci_layout(root, &relative, &mut layouts) {
                continue;
            }
            let path = root.join(&relative);
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                // Tracked by git, deleted in the work tree.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("`{shown}` could not be read: {e}")),
            };
            let entry = if meta.file_type().is_dir() {
                // A submodule (git lists it as one path): its files are not the project's.
                continue;
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path)
                    .map_err(|e| format!("`{shown}` could not be read: {e}"))?;
                let target = target
                    .to_str()
                    .ok_or_else(|| format!("the link `{shown}` has a target that is not UTF-8"))?;
                TreeEntry::Symlink(target.to_string())
            } else {
                let file = ContainedFile::open(root, &relative).map_err(|e| e.to_string())?;
                total += file.size();
                if total > MAX_TREE_BYTES {
                    return Err(format!("it holds more than {} MiB", MAX_TREE_BYTES >> 20));
                }
                let executable = file.mode() & 0o111 != 0;
                let bytes = file
                    .read_to_vec(MAX_TREE_BYTES)
                    .map_err(|e| e.to_string())?;
                TreeEntry::File { executable, bytes }
            };
            let mut parent = Path::new(&shown).parent();
            while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
                tree.entries
                    .insert(dir.to_string_lossy().into_owned(), TreeEntry::Dir);
                parent = dir.parent();
            }
            tree.entries.insert(shown, entry);
            if tree.entries.len() > MAX_TREE_ENTRIES {
                return Err(format!("it has more than {MAX_TREE_ENTRIES} entries"));
            }
        }
        Ok(tree)
    }

    /// The bytes of the regular file at `path` (relative to the top), if there is one.
    pub fn file(&self, path: &str) -> Option<&[u8]> {
        match self.entries.get(path) {
            Some(TreeEntry::File { bytes, .. }) => Some(bytes),
            _ => None,
        }
    }

    /// The canonical source archive: every entry under `top/`, sorted, with fixed modes,
    /// owner and time (see the module's text).
    pub fn archive(&self, top: &str) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let header = |kind: tar::EntryType, mode: u32, size: u64| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_size(size);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(ARCHIVE_MTIME);
            header
        };
        let mut top_header = header(tar::EntryType::Directory, 0o755, 0);
        builder
            .append_data(&mut top_header, format!("{top}/"), std::io::empty())
            .expect("writing to memory");
        for (path, entry) in &self.entries {
            let name = format!("{top}/{path}");
            let written = match entry {
                TreeEntry::Dir => {
                    let mut h = header(tar::EntryType::Directory, 0o755, 0);
                    builder.append_data(&mut h, format!("{name}/"), std::io::empty())
                }
                TreeEntry::File { executable, bytes } => {
                    let mode = if *executable { 0o755 } else { 0o644 };
                    let mut h = header(tar::EntryType::Regular, mode, bytes.len() as u64);
                    builder.append_data(&mut h, &name, bytes.as_slice())
                }
                TreeEntry::Symlink(target) => {
                    let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                    builder.append_link(&mut h, &name, target)
                }
            };
            written.expect("writing to memory");
        }
        builder.into_inner().expect("writing to memory")
    }

    /// The sha256 of [`Self::archive`].
    pub fn archive_digest(&self, top: &str) -> Digest {
        Digest::of_bytes(&self.archive(top))
    }
}

/// The files (not directories) below `root`, relative to it, when `root` is in a git work
/// tree: those git would commit. None elsewhere, or when git cannot say.
fn git_listed(root: &Path) -> Option<Vec<PathBuf>> {
    let output = super::git::isolated_git()
        .arg("-C")
        .arg(root)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            ".",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let mut listed: Vec<PathBuf> = output
        .stdout
        .split(|b| *b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| PathBuf::from(std::ffi::OsStr::from_bytes(name)))
        .collect();
    listed.dedup();
    Some(listed)
}

/// Whether `relative` is inside an OCI layout (a directory with an `oci-layout` file): the
/// image `build --layout ./image` wrote beside the recipe is cudastack's output, not the
/// project's source, and would change the tree on every build. `seen` remembers each
/// directory's answer.
fn in_oci_layout(root: &Path, relative: &Path, seen: &mut BTreeMap<PathBuf, bool>) -> bool {
    let mut dir = relative.parent();
    while let Some(current) = dir.filter(|d| !d.as_os_str().is_empty()) {
        let is_layout = *seen.entry(current.to_path_buf()).or_insert_with(|| {
            std::fs::symlink_metadata(root.join(current).join("oci-layout"))
                .is_ok_and(|m| m.is_file())
        });
        if is_layout {
            return true;
        }
        dir = current.parent();
    }
    false
}

/// Every file (not directory) below `root`, relative to it, not descending into what
/// [`left_out`] leaves out.
fn walk(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut listed = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        for name in contained_file::read_dir(root, &dir).map_err(|e| e.to_string())? {
            if left_out(&name.to_string_lossy(), dir.as_os_str().is_empty()) {
                continue;
            }
            let relative = dir.join(&name);
            let meta = std::fs::symlink_metadata(root.join(&relative))
                .map_err(|e| format!("`{}` could not be read: {e}", relative.display()))?;
            if meta.file_type().is_dir() {
                dirs.push(relative);
            } else {
                listed.push(relative);
            }
            if listed.len() > MAX_TREE_ENTRIES {
                return Err(format!("it has more than {MAX_TREE_ENTRIES} entries"));
            }
        }
    }
    Ok(listed)
}

/// Whether a local project's entry `name` is left out of its tree: version control, the
/// caches of Python and its tools, lock files, and (at the top) what a local build writes. They change
/// without the source changing, and a build makes them again.
fn left_out(name: &str, at_top: bool) -> bool {
    const ANYWHERE: &[&str] = &[
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
    ];
    // Locks (cudastack's own `NAME.lock` and `pylock.NAME.toml`, uv's, poetry's) are written
    // after the tree is read, and a build reads none.
    let lock = name.ends_with(".lock") || (name.starts_with("pylock.") && name.ends_with(".toml"));
    ANYWHERE.contains(&name)
        || lock
        || name.ends_with(".egg-info")
        || name.ends_with(".pyc")
        || (at_top && (name == "build" || name == "dist"))
}

/// A tree path as plain `/`-separated names, or why it is not one.
fn plain_path(path: &Path) -> Result<String, String> {
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => parts.push(
                name.to_str()
                    .ok_or_else(|| format!("`{}` is not UTF-8", path.display()))?,
            ),
            Component::CurDir => {}
            _ => {
                return Err(format!(
                    "`{}` is not a path inside the tree",
                    path.display()
                ))
            }
        }
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, tar::EntryType, u32, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, mode, bytes) in entries {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(*kind);
            header.set_mode(*mode);
            header.set_mtime(1_700_000_000);
            if kind.is_symlink() {
                header.set_size(0);
                builder
                    .append_link(&mut header, path, std::str::from_utf8(bytes).unwrap())
                    .unwrap();
            } else {
                header.set_size(bytes.len() as u64);
                builder.append_data(&mut header, path, *bytes).unwrap();
            }
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn the_archive_depends_on_the_tree_only() {
        use tar::EntryType::{Directory, Regular, Symlink};
        let one = tar_of(&[
            ("pkg/", Directory, 0o775, b""),
            ("pkg/__init__.py", Regular, 0o664, b"x = 1\n"),
            ("run.sh", Regular, 0o775, b"#!/bin/sh\n"),
            ("link", Symlink, 0o777, b"pkg/__init__.py"),
        ]);
        // The same tree, in another order, with other times and group bits.
        let two = tar_of(&[
            ("link", Symlink, 0o777, b"pkg/__init__.py"),
            ("run.sh", Regular, 0o755, b"#!/bin/sh\n"),
            ("pkg/__init__.py", Regular, 0o644, b"x = 1\n"),
            ("pkg/", Directory, 0o755, b""),
        ]);
        let (one, two) = (
            SourceTree::read_tar(&one[..]).unwrap(),
            SourceTree::read_tar(&two[..]).unwrap(),
        );
        assert_eq!(one.archive("lib-1.0"), two.archive("lib-1.0"));
        assert_eq!(one.file("pkg/__init__.py"), Some(&b"x = 1\n"[..]));
        assert_eq!(one.file("link"), None);
        let bytes = one.archive("lib-1.0");
        let mut archive = tar::Archive::new(&bytes[..]);
        let listed: Vec<(String, u32, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().display().to_string(),
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("lib-1.0/".to_string(), 0o755, ARCHIVE_MTIME),
                ("lib-1.0/link".to_string(), 0o777, ARCHIVE_MTIME),
                ("lib-1.0/pkg/".to_string(), 0o755, ARCHIVE_MTIME),
                ("lib-1.0/pkg/__init__.py".to_string(), 0o644, ARCHIVE_MTIME),
                ("lib-1.0/run.sh".to_string(), 0o755, ARCHIVE_MTIME),
            ]
        );
        let other = tar_of(&[("pkg/__init__.py", Regular, 0o644, b"x = 2\n")]);
        let other = SourceTree::read_tar(&other[..]).unwrap();
        assert_ne!(
            other.archive_digest("lib-1.0"),
            one.archive_digest("lib-1.0")
        );
    }

    #[test]
    fn a_local_project_is_read_without_links_followed_or_caches() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (path, text) in [
            ("pyproject.toml", "[project]\n"),
            ("src/lib/__init__.py", "x = 1\n"),
            ("src/lib/__pycache__/__init__.cpython-311.pyc", "cache"),
            (".git/HEAD", "ref: refs/heads/main\n"),
            ("build/lib/lib/__init__.py", "x = 1\n"),
            ("src/lib/build/keep.py", "kept: not at the top\n"),
            ("lib.egg-info/PKG-INFO", "Name: lib\n"),
            ("image/oci-layout", "{\"imageLayoutVersion\": \"1.0.0\"}"),
            ("image/blobs/sha256/00", "a layer"),
        ] {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), text).unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", root.join("src/passwd")).unwrap();
        let tree = SourceTree::read_dir(root).unwrap();
        let names: Vec<&str> = tree.entries.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "pyproject.toml",
                "src",
                "src/lib",
                "src/lib/__init__.py",
                "src/lib/build",
                "src/lib/build/keep.py",
                "src/passwd",
            ]
        );
        assert_eq!(
            tree.entries["src/passwd"],
            TreeEntry::Symlink("/etc/passwd".into()),
            "a link is kept, never followed"
        );
        // A FIFO is refused, not opened (it would block).
        let fifo = std::ffi::CString::new(root.join("src/pipe").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let error = SourceTree::read_dir(root).unwrap_err();
        assert!(error.contains("FIFO"), "{error}");
    }

    /// In a git work tree, what git would commit: `.gitignore` applies, and the locks
    /// cudastack writes beside the recipe are never part of it.
    #[test]
    fn a_project_in_a_git_work_tree_is_what_git_would_commit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .current_dir(root)
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        };
        git(&["init", "-q"]);
        for (path, text) in [
            (".gitignore", "*.env\nnode_modules/\n"),
            ("pyproject.toml", "[project]\n"),
            ("lib/__init__.py", "x = 1\n"),
            ("secret.env", "TOKEN=1\n"),
            ("node_modules/x/index.js", "1\n"),
            ("recipe.lock", "{}\n"),
            ("pylock.recipe.toml", "\n"),
        ] {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), text).unwrap();
        }
        git(&["add", "pyproject.toml", "recipe.lock"]);
        let tree = SourceTree::read_dir(root).unwrap();
        let names: Vec<&str> = tree.entries.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [".gitignore", "lib", "lib/__init__.py", "pyproject.toml"]
        );
    }

    #[test]
    fn a_tree_with_a_path_outside_or_a_device_is_refused() {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Char);
        header.set_size(0);
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .append_data(&mut header, "dev", std::io::empty())
            .unwrap();
        let bytes = builder.into_inner().unwrap();
        let error = SourceTree::read_tar(&bytes[..]).unwrap_err();
        assert!(error.contains("neither a file"), "{error}");
        // tar's writer refuses `..`, so the name is written into the header by hand.
        let mut header = tar::Header::new_gnu();
        header.as_old_mut().name[..9].copy_from_slice(b"../escape");
        header.set_size(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend([0u8; 1024]);
        let error = SourceTree::read_tar(&bytes[..]).unwrap_err();
        assert!(error.contains("not a path inside the tree"), "{error}");
    }
}
