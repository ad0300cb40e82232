//! Debian and Ubuntu packages, locked like every other byte of the image.
//!
//! At lock time, [`resolve`] runs apt itself, as a normal user, against a throwaway root
//! whose only trusted key is the archive's keyring: apt checks InRelease against the
//! keyring and every Packages file against Release, and its solver decides the package set
//! (cudastack never re-implements Debian dependency resolution). What it chose is recorded
//! as [`DebPackage`]s (name, version, architecture, URL, sha256, size, suite, component, and
//! a snapshot-archive URL for when the mirror has moved on).
//!
//! At build time, [`trust`] checks every locked .deb against the archive's signed index
//! (a lock from a pull request cannot name bytes the archive did not sign), and
//! [`repo`] turns the .debs, fetched by hash, into a local repository that mmdebstrap
//! installs from: the index is read to check the lock, never to choose a package.

pub mod repo;
pub mod resolve;
pub mod sources;
pub mod trust;

pub use repo::{write_repo, DebFile, RepoError};
pub use resolve::{AptError, DebPackage, Resolution};
pub use sources::{AptSources, ArchiveSuite};

/// `major.minor` of a Debian version's upstream part: `3.11.2-1+b1` -> (3, 11),
/// `2.36-9+deb12u14` -> (2, 36), `1:2.39-0ubuntu8` -> (2, 39) (the epoch is skipped).
pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let without_epoch = version
        .split_once(':')
        .map(|(_, rest)| rest)
        .unwrap_or(version);
    let mut parts = without_epoch.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}
