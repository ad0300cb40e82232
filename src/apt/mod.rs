//! Debian and Ubuntu packages, locked like every other byte of the image (issue 18).
//!
//! At lock time, [`resolve`] runs apt itself, as a normal user, against a throwaway root
//! whose only trusted key is the archive's keyring: apt checks InRelease against the
//! keyring and every Packages file against Release, and its solver decides the package set
//! (cudastack never re-implements Debian dependency resolution). What it chose is recorded
//! as [`DebPackage`]s (name, version, architecture, URL, sha256, size, suite, component, and
//! a snapshot-archive URL for when the mirror has moved on).
//!
//! At build time, [`repo`] turns the locked .debs, fetched by hash, into a local repository
//! that mmdebstrap installs from; the mirror's index of the day is never read.

pub mod repo;
pub mod resolve;
pub mod sources;

pub use repo::{write_repo, DebFile, RepoError};
pub use resolve::{AptError, DebPackage, Resolution};
pub use sources::{AptSources, ArchiveSuite};
