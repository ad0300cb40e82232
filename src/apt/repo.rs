//! A local repository of locked .debs, which mmdebstrap installs from at build time.
//!
//! Its `Packages` index is written from the .debs themselves (`dpkg-deb --field`), after
//! their sha256 was checked on download: the index a build reads is the lock, not the
//! mirror's index of the day. Each .deb must be the package the lock names (a lock that
//! says `libc6` cannot install another package under that name).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::digest::Digest;

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("`dpkg-deb` is not on PATH; `cudastack build` reads the locked .debs' control files with it\n  hint: build on a Debian or Ubuntu host (`dpkg` is always installed there)")]
    DpkgDebMissing,
    #[error("`dpkg-deb --field {}` failed: {output}", path.display())]
    DpkgDeb { path: PathBuf, output: String },
    #[error("the .deb locked as `{locked}` is `{found}`; the lock and the file disagree\n  hint: the lock or the mirror was tampered with; run `cudastack lock --upgrade` from a trusted mirror and review the diff")]
    NotTheLockedPackage { locked: String, found: String },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One locked .deb, fetched and checked against its sha256.
#[derive(Debug, Clone)]
pub struct DebFile {
    pub name: String,
    pub version: String,
    pub architecture: String,
    /// The pool file name (`libc6_2.36-9+deb12u14_amd64.deb`).
    pub filename: String,
    pub sha256: Digest,
    pub size: u64,
    /// Where its bytes are (the blob store).
    pub path: PathBuf,
}

impl DebFile {
    fn describe(&self) -> String {
        format!("{} {} {}", self.name, self.version, self.architecture)
    }
}

/// Write a flat repository (`deb [trusted=yes] copy://DIR ./`) of `debs` into `dir`: each
/// .deb linked under its file name and a `Packages` index in name order.
pub fn write_repo(dir: &Path, debs: &[DebFile]) -> Result<(), RepoError> {
    if crate::platform::which("dpkg-deb").is_none() {
        return Err(RepoError::DpkgDebMissing);
    }
    fs_err::create_dir_all(dir).map_err(io_error(dir))?;
    // Readable by mmdebstrap's unshared root (another uid) too.
    fs_err::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(io_error(dir))?;
    let mut sorted: Vec<&DebFile> = debs.iter().collect();
    sorted.sort_by(|a, b| (&a.name, &a.architecture).cmp(&(&b.name, &b.architecture)));
    let mut index = String::new();
    for deb in sorted {
        let control = control_of(&deb.path)?;
        let found = format!(
            "{} {} {}",
            field(&control, "Package").unwrap_or("?"),
            field(&control, "Version").unwrap_or("?"),
            field(&control, "Architecture").unwrap_or("?")
        );
        if found != deb.describe() {
            return Err(RepoError::NotTheLockedPackage {
                locked: deb.describe(),
                found,
            });
        }
        place(&deb.path, &dir.join(&deb.filename))?;
        index.push_str(control.trim_end());
        index.push_str(&format!(
            "\nFilename: ./{}\nSize: {}\nSHA256: {}\n\n",
            deb.filename,
            deb.size,
            deb.sha256.hex()
        ));
    }
    let packages = dir.join("Packages");
    fs_err::write(&packages, index).map_err(io_error(&packages))?;
    fs_err::set_permissions(
        &packages,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .map_err(io_error(&packages))
}

/// Put the blob `blob` at `target`, a new name in the repository: a hard link when the
/// blob is readable by everyone (mmdebstrap's unshare mode reads it as another uid), else
/// a copy made readable. Never writes through an existing name (that could be a link to
/// another blob).
fn place(blob: &Path, target: &Path) -> Result<(), RepoError> {
    use std::os::unix::fs::PermissionsExt;
    let readable = fs_err::metadata(blob)
        .map_err(io_error(blob))?
        .permissions()
        .mode()
        & 0o004
        != 0;
    if readable && fs_err::hard_link(blob, target).is_ok() {
        return Ok(());
    }
    let mut source = fs_err::File::open(blob).map_err(io_error(blob))?;
    let mut copy = fs_err::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(target)
        .map_err(io_error(target))?;
    std::io::copy(&mut source, &mut copy).map_err(io_error(target))?;
    fs_err::set_permissions(target, std::fs::Permissions::from_mode(0o644))
        .map_err(io_error(target))
}

/// The control fields of a .deb.
fn control_of(path: &Path) -> Result<String, RepoError> {
    let output = Command::new("dpkg-deb")
        .arg("--field")
        .arg(path)
        .env("LC_ALL", "C")
        .output()
        .map_err(io_error(Path::new("dpkg-deb")))?;
    if !output.status.success() {
        return Err(RepoError::DpkgDeb {
            path: path.to_path_buf(),
            output: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The value of `name:` in a control text.
fn field<'a>(control: &'a str, name: &str) -> Option<&'a str> {
    control.lines().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> RepoError {
    let path = path.to_path_buf();
    move |source| RepoError::Io { path, source }
}
