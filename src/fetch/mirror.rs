//! A local mirror directory as a package source, for air-gapped sites.
//!
//! A mirror is a directory tree holding wheels (flat, or one sub-directory per project, as
//! `pip download -d` or `uv pip download` leave them) and any other archives. Listing a
//! project scans the tree for wheels whose normalised name matches and hashes each one
//! (streaming) so the lock records the same sha256 an online index would publish. File URLs
//! are `file://` URLs; the downloader copies them into the blob store with the same hash
//! check as any download.

use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use reqwest::Url;

use crate::digest::HashingReader;
use crate::fetch::file_name::FileName;
use crate::fetch::index::{CoreMetadata, DistFile, ProjectPage};
use crate::names::{PackageName, WheelFilename};

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("Mirror directory `{path}` does not exist or is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A directory of wheels and archives.
#[derive(Debug, Clone)]
pub struct MirrorDir {
    root: PathBuf,
}

impl MirrorDir {
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, MirrorError> {
        let root = root.into();
        let root = fs_err::canonicalize(&root)
            .map_err(|_| MirrorError::NotADirectory { path: root.clone() })?;
        if !root.is_dir() {
            return Err(MirrorError::NotADirectory { path: root });
        }
        Ok(MirrorDir { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The `file://` URL of the mirror root (used as the lock's `source`).
    pub fn url(&self) -> Url {
        Url::from_directory_path(&self.root).expect("canonical paths are absolute")
    }

    /// Every regular file under the root, sorted (deterministic listings).
    pub fn files(&self) -> Result<Vec<PathBuf>, MirrorError> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let entries = fs_err::read_dir(&dir).map_err(|source| MirrorError::Io {
                path: dir.clone(),
                source,
            })?;
            for entry in entries {
                let entry = entry.map_err(|source| MirrorError::Io {
                    path: dir.clone(),
                    source,
                })?;
                let path = entry.path();
                let file_type = entry.file_type().map_err(|source| MirrorError::Io {
                    path: path.clone(),
                    source,
                })?;
                if file_type.is_dir() {
                    stack.push(path);
                } else if file_type.is_file() {
                    out.push(path);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The mirror's wheels of one project, hashed. Blocking: call it from a blocking task.
    /// `None` when the mirror has no file of that project.
    pub fn project(&self, name: &PackageName) -> Result<Option<ProjectPage>, MirrorError> {
        let mut files = Vec::new();
        for path in self.files()? {
            let Some(filename) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Ok(wheel) = WheelFilename::from_str(filename) else {
                continue;
            };
            let Ok(filename) = FileName::new(filename) else {
                continue;
            };
            if &wheel.name != name {
                continue;
            }
            let (sha256, size) = hash_file(&path)?;
            files.push(DistFile {
                filename,
                url: Url::from_file_path(&path).expect("absolute path"),
                sha256: Some(sha256),
                size: Some(size),
                requires_python: None,
                yanked: false,
                yanked_reason: None,
                upload_time: None,
                core_metadata: CoreMetadata::Absent,
            });
        }
        if files.is_empty() {
            return Ok(None);
        }
        Ok(Some(ProjectPage {
            name: name.clone(),
            url: self.url(),
            files,
        }))
    }
}

/// Stream a file through sha256.
pub fn hash_file(path: &Path) -> Result<(crate::digest::Digest, u64), MirrorError> {
    let io_error = |source| MirrorError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = fs_err::File::open(path).map_err(io_error)?;
    let mut reader = HashingReader::new(io::BufReader::with_capacity(1 << 20, file));
    io::copy(&mut reader, &mut io::sink()).map_err(io_error)?;
    let (_, digest, size) = reader.finish();
    Ok((digest, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;

    #[test]
    fn lists_and_hashes_matching_wheels() {
        let dir = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(dir.path().join("sub")).unwrap();
        fs_err::write(dir.path().join("Foo_Bar-1.0-py3-none-any.whl"), b"one").unwrap();
        fs_err::write(dir.path().join("sub/foo_bar-2.0-py3-none-any.whl"), b"two").unwrap();
        fs_err::write(dir.path().join("other-1.0-py3-none-any.whl"), b"x").unwrap();
        fs_err::write(dir.path().join("README"), b"x").unwrap();
        let mirror = MirrorDir::open(dir.path()).unwrap();
        let page = mirror
            .project(&PackageName::from_str("foo-bar").unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(page.files.len(), 2);
        assert_eq!(page.files[0].sha256, Some(Digest::of_bytes(b"one")));
        assert_eq!(page.files[1].size, Some(3));
        assert_eq!(page.files[1].url.scheme(), "file");
        assert!(mirror
            .project(&PackageName::from_str("absent").unwrap())
            .unwrap()
            .is_none());
        assert!(MirrorDir::open(dir.path().join("missing")).is_err());
    }
}
