//! The recipe's `wheels:` directories as a package source, like pip's `--find-links`: the
//! team's own wheels (a flash-attn compiled for its CUDA, an internal package) beside the
//! recipe, offered to the resolver before every index.
//!
//! Each directory is read once, when the recipe is resolved, through
//! [`crate::contained_file`]: no symbolic link is followed, a FIFO or device is refused, and
//! every `*.whl` is hashed and its METADATA read (bounded) and held to its file name, so
//! `validate`, `lock` and `build` see the same wheels and refuse the same ones. Paths are
//! relative to the recipe's directory, so a lock made here means the same on CI.
//!
//! Must not: read outside the recipe's directory, keep a wheel whose METADATA names another
//! distribution, list another file than the ones read here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use reqwest::Url;

use crate::contained_file::{ContainedError, ContainedFile};
use crate::digest::{Digest, HashingWriter};
use crate::fetch::file_name::FileName;
use crate::fetch::index::{CoreMetadata, DistFile, ProjectPage};
use crate::fetch::metadata::{zip_metadata, Metadata, MetadataError};
use crate::names::{PackageName, WheelFilename};

/// More wheels than any team keeps beside a recipe; each is hashed on every resolve.
pub const MAX_LOCAL_WHEELS: usize = 1024;

/// A wheel larger than this is not a wheel a team builds (torch's is 0.8 GiB).
pub const MAX_LOCAL_WHEEL_BYTES: u64 = 8 << 30;

#[derive(Debug, thiserror::Error)]
pub enum LocalWheelsError {
    // Causes are in the messages, not chained: `validate` prints one line per problem.
    #[error("`wheels: {dir}`: {error}")]
    Directory { dir: String, error: ContainedError },
    #[error("`wheels: {dir}` holds no wheel (no `*.whl` file)\n  hint: put the wheels there (`pip wheel --no-deps -w {dir} .`), or take the directory out of `wheels:`")]
    Empty { dir: String },
    #[error("`wheels:` directories hold more than {MAX_LOCAL_WHEELS} wheels\n  hint: keep only the wheels the recipe needs beside it")]
    TooMany,
    #[error("`{path}` (wheels:) is not a wheel file name: {reason}\n  hint: keep the name the build gave it: `NAME-VERSION-PYTHON-ABI-PLATFORM.whl` (PEP 427)")]
    BadName { path: String, reason: String },
    #[error("`{path}` (wheels:): {error}")]
    File { path: String, error: ContainedError },
    #[error("`{path}` (wheels:) is {size} bytes, more than the {MAX_LOCAL_WHEEL_BYTES} a wheel may be here")]
    TooLarge { path: String, size: u64 },
    #[error("`{path}` (wheels:) is not a wheel cudastack can read: {}\n  hint: rebuild it (`pip wheel`, `python -m build`)", crate::net::error_chain(.error))]
    Metadata { path: String, error: MetadataError },
    #[error("`{path}` (wheels:): its METADATA describes another distribution than its file name says\n  Expected: {expected}\n  Found:    {found}\n  hint: rebuild the wheel, or name the file after what it holds")]
    MetadataDisagrees {
        path: String,
        expected: String,
        found: String,
    },
    #[error("`{first}` and `{second}` (wheels:) are both `{filename}`; the lock could not tell which one it means\n  hint: keep one of them")]
    Twice {
        filename: String,
        first: String,
        second: String,
    },
}

/// One wheel of a `wheels:` directory, read and checked.
#[derive(Debug, Clone)]
pub struct LocalWheel {
    /// Relative to the recipe's directory, `/`-separated (`wheelhouse/x-1.0-py3-none-any.whl`).
    pub path: String,
    pub filename: FileName,
    pub wheel: WheelFilename,
    pub sha256: Digest,
    pub size: u64,
    /// The METADATA text, as the resolver reads an index's.
    pub metadata: String,
    requires_python: Option<pep440_rs::VersionSpecifiers>,
    /// Where it is on this machine, for the resolver's listing and the downloader.
    url: Url,
}

/// The wheels of a recipe's `wheels:` directories; empty for a recipe without any.
#[derive(Debug, Clone, Default)]
pub struct LocalWheels {
    /// The directories as the recipe names them, and where they are here (canonical).
    directories: Vec<(String, PathBuf)>,
    wheels: Arc<Vec<LocalWheel>>,
}

impl LocalWheels {
    /// Read every `*.whl` of `dirs` (relative to `root`, the recipe's directory). Other
    /// files are skipped; a directory without a wheel is an error. Blocking.
    pub fn read(root: &Path, dirs: &[&Path]) -> Result<LocalWheels, LocalWheelsError> {
        let mut local = LocalWheels::default();
        let mut wheels: Vec<LocalWheel> = Vec::new();
        for dir in dirs {
            let shown = display(dir);
            let directory_error = |error| LocalWheelsError::Directory {
                dir: shown.clone(),
                error,
            };
            let names = crate::contained_file::read_dir(root, dir).map_err(directory_error)?;
            let canonical = std::fs::canonicalize(root.join(dir)).map_err(|error| {
                directory_error(ContainedError::Io {
                    path: root.join(dir),
                    error,
                })
            })?;
            let before = wheels.len();
            for name in names {
                if !name.as_encoded_bytes().ends_with(b".whl") {
                    continue;
                }
                if wheels.len() >= MAX_LOCAL_WHEELS {
                    return Err(LocalWheelsError::TooMany);
                }
                let wheel = read_wheel(root, dir, &name, &canonical)?;
                if let Some(first) = wheels.iter().find(|w| w.filename == wheel.filename) {
                    return Err(LocalWheelsError::Twice {
                        filename: wheel.filename.to_string(),
                        first: first.path.clone(),
                        second: wheel.path,
                    });
                }
                wheels.push(wheel);
            }
            if wheels.len() == before {
                return Err(LocalWheelsError::Empty { dir: shown });
            }
            local.directories.push((shown, canonical));
        }
        local.wheels = Arc::new(wheels);
        Ok(local)
    }

    pub fn is_empty(&self) -> bool {
        self.wheels.is_empty()
    }

    /// Every wheel offered, in the recipe's directory order, each directory's by name.
    pub fn wheels(&self) -> &[LocalWheel] {
        &self.wheels
    }

    /// Where the directories are on this machine: what the downloader may copy from.
    pub fn directories(&self) -> Vec<PathBuf> {
        self.directories.iter().map(|(_, p)| p.clone()).collect()
    }

    /// The wheel the resolver was offered at `url`.
    pub fn by_url(&self, url: &Url) -> Option<&LocalWheel> {
        self.wheels.iter().find(|w| &w.url == url)
    }

    /// The wheel at `path` (relative to the recipe's directory, as the lock names it).
    pub fn by_path(&self, path: &str) -> Option<&LocalWheel> {
        self.wheels.iter().find(|w| w.path == path)
    }

    /// What `wheels:` offers of `name`, as an index page; `None` when it has none.
    pub fn project(&self, name: &PackageName) -> Option<ProjectPage> {
        let files: Vec<DistFile> = self
            .wheels
            .iter()
            .filter(|w| &w.wheel.name == name)
            .map(|w| DistFile {
                filename: w.filename.clone(),
                url: w.url.clone(),
                sha256: Some(w.sha256),
                size: Some(w.size),
                requires_python: w.requires_python.clone(),
                yanked: false,
                yanked_reason: None,
                upload_time: None,
                core_metadata: CoreMetadata::Absent,
            })
            .collect();
        let first = self.wheels.iter().find(|w| &w.wheel.name == name)?;
        let directory = first.url.join(".").ok()?;
        Some(ProjectPage {
            name: name.clone(),
            url: directory,
            files,
        })
    }

    /// The recipe's names of the directories, for messages and the lock's `source`.
    pub fn label(&self) -> String {
        let names: Vec<&str> = self.directories.iter().map(|(n, _)| n.as_str()).collect();
        format!("wheels: [{}]", names.join(", "))
    }

    /// Each offered wheel's path and sha256, sorted: what makes a lock of them stale.
    pub fn digests(&self) -> BTreeMap<String, Digest> {
        self.wheels
            .iter()
            .map(|w| (w.path.clone(), w.sha256))
            .collect()
    }
}

/// `dir` as the recipe wrote it, `/`-separated, without `./`.
fn display(dir: &Path) -> String {
    let parts: Vec<String> = dir
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

/// Read, hash and check one `*.whl` entry `name` of `dir`.
fn read_wheel(
    root: &Path,
    dir: &Path,
    name: &std::ffi::OsStr,
    canonical: &Path,
) -> Result<LocalWheel, LocalWheelsError> {
    let shown = match display(dir).as_str() {
        "." => String::new(),
        dir => format!("{dir}/"),
    };
    let lossy = name.to_string_lossy();
    let path = format!("{shown}{}", crate::printable::short(&lossy));
    let bad = |reason: String| LocalWheelsError::BadName {
        path: path.clone(),
        reason,
    };
    let text = name.to_str().ok_or_else(|| bad("it is not UTF-8".into()))?;
    let filename = FileName::new(text).map_err(|e| bad(e.reason.to_string()))?;
    let wheel = WheelFilename::from_str(text).map_err(|e| bad(e.to_string()))?;
    let file_error = |error| LocalWheelsError::File {
        path: path.clone(),
        error,
    };
    let file = ContainedFile::open(root, &dir.join(name)).map_err(file_error)?;
    if file.size() > MAX_LOCAL_WHEEL_BYTES {
        return Err(LocalWheelsError::TooLarge {
            path,
            size: file.size(),
        });
    }
    let metadata_error = |error| LocalWheelsError::Metadata {
        path: path.clone(),
        error,
    };
    let metadata = zip_metadata(file.file(), file.path()).map_err(metadata_error)?;
    let parsed = Metadata::parse(&metadata, &path).map_err(metadata_error)?;
    if parsed.name != wheel.name || parsed.version != wheel.version {
        return Err(LocalWheelsError::MetadataDisagrees {
            path,
            expected: format!("{} {}", wheel.name, wheel.version),
            found: format!("{} {}", parsed.name, parsed.version),
        });
    }
    // The zip reader moved the offset; the hash is of the whole file.
    std::io::Seek::rewind(&mut file.file()).map_err(|error| {
        file_error(ContainedError::Io {
            path: file.path().to_path_buf(),
            error,
        })
    })?;
    let mut hashing = HashingWriter::new(std::io::sink());
    let size = file.copy_to(&mut hashing).map_err(file_error)?;
    let (_, sha256, _) = hashing.finish();
    let url = Url::from_file_path(canonical.join(text))
        .map_err(|()| bad("its directory is not an absolute path".into()))?;
    Ok(LocalWheel {
        path: format!("{shown}{text}"),
        filename,
        wheel,
        sha256,
        size,
        metadata,
        requires_python: parsed.requires_python,
        url,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;

    /// A wheel file `file_name` in `dir` whose METADATA says `name` `version`.
    fn write_wheel(dir: &Path, file_name: &str, name: &str, version: &str) -> Vec<u8> {
        let metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Python: >=3.8\nRequires-Dist: numpy\n");
        write_zip(
            dir,
            file_name,
            &format!("{name}-{version}.dist-info/METADATA"),
            metadata.as_bytes(),
        )
    }

    fn write_zip(dir: &Path, file_name: &str, member: &str, bytes: &[u8]) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(member, options).unwrap();
        zip.write_all(bytes).unwrap();
        let bytes = zip.finish().unwrap().into_inner();
        fs_err::create_dir_all(dir).unwrap();
        fs_err::write(dir.join(file_name), &bytes).unwrap();
        bytes
    }

    fn read(root: &Path, dirs: &[&str]) -> Result<LocalWheels, String> {
        let dirs: Vec<&Path> = dirs.iter().map(Path::new).collect();
        LocalWheels::read(root, &dirs).map_err(|e| e.to_string())
    }

    #[test]
    fn offers_each_wheel_with_its_hash_and_metadata() {
        let root = tempfile::tempdir().unwrap();
        let house = root.path().join("wheelhouse");
        let bytes = write_wheel(
            &house,
            "Acme_Ops-1.2-cp311-cp311-linux_x86_64.whl",
            "acme-ops",
            "1.2",
        );
        write_wheel(&house, "acme_ops-1.1-py3-none-any.whl", "acme-ops", "1.1");
        fs_err::write(house.join("README.md"), "not a wheel").unwrap();
        fs_err::create_dir(house.join("old")).unwrap();
        let local = read(root.path(), &["./wheelhouse"]).unwrap();
        let paths: Vec<&str> = local.wheels().iter().map(|w| w.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "wheelhouse/Acme_Ops-1.2-cp311-cp311-linux_x86_64.whl",
                "wheelhouse/acme_ops-1.1-py3-none-any.whl"
            ]
        );
        let wheel = local.by_path(paths[0]).unwrap();
        assert_eq!(wheel.sha256, Digest::of_bytes(&bytes));
        assert_eq!(wheel.size, bytes.len() as u64);
        let page = local
            .project(&PackageName::from_str("acme-ops").unwrap())
            .unwrap();
        assert_eq!(page.files.len(), 2);
        assert!(page.files[0].requires_python.is_some());
        assert_eq!(local.by_url(&page.files[0].url).unwrap().path, paths[0]);
        assert!(local
            .project(&PackageName::from_str("numpy").unwrap())
            .is_none());
        assert_eq!(local.label(), "wheels: [wheelhouse]");
        assert_eq!(local.digests().len(), 2);
        // The recipe's own directory is `.`.
        write_wheel(root.path(), "top-1.0-py3-none-any.whl", "top", "1.0");
        let local = read(root.path(), &["."]).unwrap();
        assert_eq!(local.wheels()[0].path, "top-1.0-py3-none-any.whl");
    }

    #[test]
    fn refuses_directories_that_are_missing_empty_or_links() {
        let root = tempfile::tempdir().unwrap();
        let error = read(root.path(), &["absent"]).unwrap_err();
        assert!(error.starts_with("`wheels: absent`: `"), "{error}");
        assert!(error.contains("does not exist"), "{error}");
        fs_err::create_dir(root.path().join("empty")).unwrap();
        fs_err::write(root.path().join("empty/notes.txt"), "x").unwrap();
        let error = read(root.path(), &["empty"]).unwrap_err();
        assert!(
            error.starts_with("`wheels: empty` holds no wheel"),
            "{error}"
        );
        let outside = tempfile::tempdir().unwrap();
        write_wheel(outside.path(), "a-1.0-py3-none-any.whl", "a", "1.0");
        std::os::unix::fs::symlink(outside.path(), root.path().join("linked")).unwrap();
        let error = read(root.path(), &["linked"]).unwrap_err();
        assert!(error.contains("a symbolic link"), "{error}");
        fs_err::write(root.path().join("file"), "x").unwrap();
        let error = read(root.path(), &["file"]).unwrap_err();
        assert!(error.contains("where a directory was expected"), "{error}");
    }

    /// A link, FIFO or device among the wheels, a bad name, a METADATA that is another
    /// distribution's or a bomb: each named, none read past what the check needs.
    #[test]
    fn hostile_entries_are_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let house = root.path().join("w");
        let outside = tempfile::tempdir().unwrap();
        write_wheel(
            outside.path(),
            "secret-1.0-py3-none-any.whl",
            "secret",
            "1.0",
        );
        let case = |setup: &dyn Fn(&Path), says: &[&str]| {
            let _ = fs_err::remove_dir_all(&house);
            fs_err::create_dir_all(&house).unwrap();
            setup(&house);
            let error = read(root.path(), &["w"]).unwrap_err();
            for said in says {
                assert!(error.contains(said), "{said}: {error}");
            }
        };
        case(
            &|d| {
                std::os::unix::fs::symlink(
                    outside.path().join("secret-1.0-py3-none-any.whl"),
                    d.join("secret-1.0-py3-none-any.whl"),
                )
                .unwrap()
            },
            &[
                "`w/secret-1.0-py3-none-any.whl` (wheels:)",
                "a symbolic link",
            ],
        );
        case(
            &|d| {
                let path =
                    std::ffi::CString::new(d.join("fifo-1.0-py3-none-any.whl").to_str().unwrap())
                        .unwrap();
                // SAFETY: a NUL-terminated path; mkfifo only creates the node.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
            },
            &[
                "`w/fifo-1.0-py3-none-any.whl` (wheels:)",
                "named pipe (FIFO)",
            ],
        );
        case(
            &|d| {
                write_wheel(d, "not a wheel.whl", "x", "1.0");
            },
            &["`w/not a wheel.whl` (wheels:) is not a wheel file name"],
        );
        case(
            &|d| {
                let name = std::ffi::OsStr::from_bytes(b"bad\xff-1.0-py3-none-any.whl");
                fs_err::write(d.join(name), "x").unwrap();
            },
            &["is not a wheel file name: it is not UTF-8"],
        );
        case(
            &|d| {
                write_wheel(d, "a\u{1b}b-1.0-py3-none-any.whl", "x", "1.0");
            },
            &["control character", "\\u{1b}"],
        );
        case(
            &|d| {
                write_wheel(d, "torch-2.4.1-py3-none-any.whl", "evil", "6.6.6");
            },
            &[
                "`w/torch-2.4.1-py3-none-any.whl` (wheels:): its METADATA describes another distribution",
                "Expected: torch 2.4.1\n  Found:    evil 6.6.6",
            ],
        );
        case(
            &|d| {
                // 9 MiB of METADATA deflates to a few kB.
                let mut bomb = b"Metadata-Version: 2.1\nName: bomb\nVersion: 1.0\n".to_vec();
                bomb.resize(9 << 20, b' ');
                write_zip(
                    d,
                    "bomb-1.0-py3-none-any.whl",
                    "bomb-1.0.dist-info/METADATA",
                    &bomb,
                );
            },
            &[
                "`w/bomb-1.0-py3-none-any.whl` (wheels:) is not a wheel cudastack can read",
                "at most 8388608",
            ],
        );
        case(
            &|d| {
                fs_err::write(d.join("junk-1.0-py3-none-any.whl"), "not a zip").unwrap();
            },
            &["`w/junk-1.0-py3-none-any.whl` (wheels:) is not a wheel cudastack can read"],
        );
    }

    #[test]
    fn a_file_name_in_two_directories_is_refused() {
        let root = tempfile::tempdir().unwrap();
        write_wheel(&root.path().join("a"), "x-1.0-py3-none-any.whl", "x", "1.0");
        write_wheel(&root.path().join("b"), "x-1.0-py3-none-any.whl", "x", "1.0");
        let error = read(root.path(), &["a", "b"]).unwrap_err();
        assert!(
            error.starts_with(
                "`a/x-1.0-py3-none-any.whl` and `b/x-1.0-py3-none-any.whl` (wheels:) are both"
            ),
            "{error}"
        );
    }
}
