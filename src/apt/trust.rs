//! A lock's .debs are what the archive signed, checked at build time.
//!
//! A lock arrives in pull requests. Its sha256 fixes the bytes, but only the archive's
//! signature says they are Debian's (or Ubuntu's, or the site mirror's): a lock whose .deb
//! names another URL and sha256 would otherwise have its maintainer scripts run as root on
//! the build host. So before any .deb is fetched:
//!
//! 1. [`check_origins`]: its URL must be under an archive cudastack knows for the base (the
//!    distribution's public archives, or the `--apt-mirror` given to the build), and its
//!    fallback under that archive's snapshot service;
//! 2. [`verify_signed`]: apt reads the archive's signed index with the keyring, in the same
//!    throwaway root as `lock` (apt's own signature and hash checks), live and, for versions
//!    the live archive no longer lists, as of the lock's `as_of` from the snapshot archive;
//!    every .deb's name, version, architecture, sha256 and size must be listed there.
//!
//! A verified set is remembered in the cache ([`VerifiedSets`]), keyed by the keyring and
//! the set: a warm build verifies nothing again and needs no network.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use reqwest::Url;

use crate::apt::resolve::{AptError, Resolution};
use crate::apt::sources::AptSources;
use crate::digest::Digest;

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("the lock's .deb `{package}` points at `{url}`, outside the archives this build trusts for the base ({allowed})\n  hint: a lock names only files of the base's archive, its snapshot archive, or the `--apt-mirror` given to the build; relock with `cudastack lock` and review where the URL came from (a lock edited by hand, or made against a mirror: pass the same `--apt-mirror URL --apt-keyring FILE` to build)")]
    OutsideArchive {
        package: String,
        url: String,
        allowed: String,
    },
    #[error("{} not in the archive's signed index with the locked sha256 and size ({searched}):\n{}\n  hint: the lock does not describe what the archive signed: it was edited, or made against another archive; relock with `cudastack lock --upgrade` from a trusted archive and review the diff", if packages.len() == 1 { "1 locked .deb is" } else { "locked .debs are" }, packages.iter().map(|p| format!("    {p}")).collect::<Vec<_>>().join("\n"))]
    NotSigned {
        packages: Vec<String>,
        searched: String,
    },
    #[error("the archive's signed index could not be read to check the lock's .debs\n  hint: a build checks every locked .deb against the archive's signature once per cache (then offline builds work); build online once, or name a reachable `--apt-mirror URL --apt-keyring FILE`")]
    IndexUnreadable(#[source] AptError),
    #[error("the snapshot archive as of the lock's moment ({as_of}) could not be read, and the live archive no longer lists {}\n  hint: name a reachable snapshot service with `--apt-snapshot URL`, or relock with `cudastack lock --upgrade` and review the diff", packages.join(", "))]
    SnapshotUnreadable {
        as_of: jiff::Timestamp,
        packages: Vec<String>,
        #[source]
        source: AptError,
    },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One .deb of a lock, as the archive must list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockedDeb {
    pub name: String,
    pub version: String,
    /// `amd64`, `arm64` or `all`.
    pub architecture: String,
    pub sha256: Digest,
    pub size: u64,
    pub url: Url,
    pub fallback_url: Option<Url>,
}

impl LockedDeb {
    fn describe(&self) -> String {
        format!(
            "{} {} {} ({}, {} bytes)",
            self.name, self.version, self.architecture, self.sha256, self.size
        )
    }
}

/// Every URL of `debs` under an archive root of `trusted` (the roots apt would read for
/// the base: public, or the build's mirror), or, for fallbacks, under a snapshot root.
/// `snapshot_service` (`--apt-snapshot`) is a snapshot root too.
pub fn check_origins(
    debs: &[LockedDeb],
    trusted: &[&AptSources],
    snapshot_service: Option<&Url>,
) -> Result<(), TrustError> {
    let roots: BTreeSet<String> = trusted
        .iter()
        .flat_map(|sources| &sources.suites)
        .map(|suite| suite.root.clone())
        .collect();
    let snapshots: BTreeSet<String> = trusted
        .iter()
        .flat_map(|sources| &sources.suites)
        .filter_map(|suite| suite.snapshot.clone())
        .chain(snapshot_service.map(|url| url.as_str().trim_end_matches('/').to_string()))
        .collect();
    let under = |url: &Url, roots: &BTreeSet<String>| {
        roots
            .iter()
            .any(|root| url.as_str().starts_with(&format!("{root}/")))
    };
    for deb in debs {
        let fallback_ok = deb
            .fallback_url
            .as_ref()
            .is_none_or(|url| under(url, &snapshots));
        for (url, ok) in [
            (Some(&deb.url), under(&deb.url, &roots)),
            (deb.fallback_url.as_ref(), fallback_ok),
        ] {
            if let (Some(url), false) = (url, ok) {
                return Err(TrustError::OutsideArchive {
                    package: format!("{} {}", deb.name, deb.version),
                    url: url.to_string(),
                    allowed: roots
                        .iter()
                        .chain(&snapshots)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
    }
    Ok(())
}

/// Every one of `debs` listed in the signed index of `sources` (live) or, for those the
/// live archive no longer lists, of its snapshot as of `as_of`. Blocking: runs apt.
pub fn verify_signed(
    debs: &[LockedDeb],
    sources: &AptSources,
    release: &str,
    as_of: Option<jiff::Timestamp>,
    snapshot_service: Option<&Url>,
) -> Result<(), TrustError> {
    let live = Resolution::update(sources, release).map_err(TrustError::IndexUnreadable)?;
    let mut unlisted = unlisted(&live, debs)?;
    if unlisted.is_empty() {
        return Ok(());
    }
    let mut searched = sources.describe();
    // A mirror without `--apt-snapshot` has no past to look in: what its live index does
    // not list is unsigned as far as this build can tell.
    let past_sources = as_of.and_then(|at| {
        sources
            .clone()
            .at_snapshot(at, snapshot_service)
            .ok()
            .map(|past| (at, past))
    });
    if let Some((at, past_sources)) = past_sources {
        let past = Resolution::update(&past_sources, release).map_err(|source| {
            TrustError::SnapshotUnreadable {
                as_of: at,
                packages: unlisted.iter().map(LockedDeb::describe).collect(),
                source,
            }
        })?;
        unlisted = self::unlisted(&past, &unlisted)?;
        searched = format!("{searched}; as of {at}: {}", past_sources.describe());
    }
    if unlisted.is_empty() {
        return Ok(());
    }
    Err(TrustError::NotSigned {
        packages: unlisted.iter().map(LockedDeb::describe).collect(),
        searched,
    })
}

/// The debs `index` does not list with their sha256 and size.
fn unlisted(index: &Resolution, debs: &[LockedDeb]) -> Result<Vec<LockedDeb>, TrustError> {
    let wanted: Vec<(String, String, String)> = debs
        .iter()
        .map(|d| (d.name.clone(), d.architecture.clone(), d.version.clone()))
        .collect();
    let listed = index.listed(&wanted).map_err(TrustError::IndexUnreadable)?;
    Ok(debs
        .iter()
        .filter(|deb| {
            !listed.contains(&(deb.name.clone(), deb.version.clone(), deb.sha256, deb.size))
        })
        .cloned()
        .collect())
}

/// The sets of .debs verified before, one marker file each under `dir`, named by the
/// digest of the keyring's bytes, the archive roots and the set.
pub struct VerifiedSets {
    dir: PathBuf,
}

impl VerifiedSets {
    pub fn new(dir: &Path) -> Self {
        VerifiedSets {
            dir: dir.to_path_buf(),
        }
    }

    /// The marker of `debs` checked against `sources`.
    fn marker(&self, debs: &[LockedDeb], sources: &AptSources) -> Result<PathBuf, TrustError> {
        let keyring = fs_err::read(&sources.keyring).map_err(|source| TrustError::Io {
            path: sources.keyring.clone(),
            source,
        })?;
        let mut text = format!("keyring {}\n", Digest::of_bytes(&keyring));
        for suite in &sources.suites {
            text.push_str(&format!("suite {} {}\n", suite.root, suite.suite));
        }
        let mut lines: Vec<String> = debs.iter().map(LockedDeb::describe).collect();
        lines.sort();
        text.push_str(&lines.join("\n"));
        Ok(self.dir.join(Digest::of_bytes(text.as_bytes()).hex()))
    }

    pub fn contains(&self, debs: &[LockedDeb], sources: &AptSources) -> Result<bool, TrustError> {
        Ok(self.marker(debs, sources)?.is_file())
    }

    pub fn remember(&self, debs: &[LockedDeb], sources: &AptSources) -> Result<(), TrustError> {
        let marker = self.marker(debs, sources)?;
        fs_err::create_dir_all(&self.dir).map_err(|source| TrustError::Io {
            path: self.dir.clone(),
            source,
        })?;
        crate::atomic_file::write(&marker, b"verified\n").map_err(|source| TrustError::Io {
            path: marker.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deb(url: &str, fallback: Option<&str>) -> LockedDeb {
        LockedDeb {
            name: "tzdata".into(),
            version: "2025b-0+deb12u1".into(),
            architecture: "all".into(),
            sha256: Digest::of_bytes(b"tzdata"),
            size: 6,
            url: url.parse().unwrap(),
            fallback_url: fallback.map(|f| f.parse().unwrap()),
        }
    }

    #[test]
    fn urls_must_stay_under_the_base_archive_its_snapshot_or_the_mirror() {
        let public = AptSources::for_release("debian", "bookworm", "amd64", None, None);
        let pool = "pool/main/t/tzdata/tzdata_2025b-0+deb12u1_all.deb";
        let snapshot =
            format!("https://snapshot.debian.org/archive/debian/20260101T000000Z/{pool}");
        let good = deb(
            &format!("http://deb.debian.org/debian/{pool}"),
            Some(&snapshot),
        );
        assert!(check_origins(std::slice::from_ref(&good), &[&public], None).is_ok());
        let security = deb(
            &format!("http://security.debian.org/debian-security/{pool}"),
            None,
        );
        assert!(check_origins(&[security], &[&public], None).is_ok());

        // Another host, a look-alike prefix, a fallback elsewhere: refused, naming the URL.
        for (url, fallback) in [
            (format!("http://127.0.0.1:8000/{pool}"), None),
            (format!("http://deb.debian.org/debian-evil/{pool}"), None),
            (
                format!("http://deb.debian.org/debian/{pool}"),
                Some(format!("https://evil.example/{pool}")),
            ),
        ] {
            let error = check_origins(&[deb(&url, fallback.as_deref())], &[&public], None)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("outside the archives this build trusts")
                    && error.contains("tzdata 2025b-0+deb12u1"),
                "{error}"
            );
        }

        // The build's mirror and snapshot service are trusted as well, the public archive
        // still (a lock made against it, built through the mirror).
        let mirror_url: Url = "http://127.0.0.1:9000/debian/".parse().unwrap();
        let mirror =
            AptSources::for_release("debian", "bookworm", "amd64", Some(&mirror_url), None);
        let service: Url = "http://127.0.0.1:9001/".parse().unwrap();
        let mirrored = deb(
            &format!("http://127.0.0.1:9000/debian/{pool}"),
            Some(&format!("http://127.0.0.1:9001/20260101T000000Z/{pool}")),
        );
        assert!(check_origins(
            std::slice::from_ref(&mirrored),
            &[&public, &mirror],
            Some(&service)
        )
        .is_ok());
        assert!(check_origins(&[good], &[&public, &mirror], Some(&service)).is_ok());
        assert!(check_origins(&[mirrored], &[&public], None).is_err());
    }

    #[test]
    fn a_verified_set_is_keyed_by_the_keyring_the_archive_and_the_set() {
        let dir = tempfile::tempdir().unwrap();
        let keyring = dir.path().join("keyring.gpg");
        fs_err::write(&keyring, b"key one").unwrap();
        let sources =
            AptSources::for_release("debian", "bookworm", "amd64", None, Some(keyring.clone()));
        let sets = VerifiedSets::new(&dir.path().join("verified"));
        let debs = [deb("http://deb.debian.org/debian/pool/x.deb", None)];
        assert!(!sets.contains(&debs, &sources).unwrap());
        sets.remember(&debs, &sources).unwrap();
        assert!(sets.contains(&debs, &sources).unwrap());
        let mut other = debs.clone();
        other[0].sha256 = Digest::of_bytes(b"other");
        assert!(!sets.contains(&other, &sources).unwrap());
        fs_err::write(&keyring, b"key two").unwrap();
        assert!(!sets.contains(&debs, &sources).unwrap());
    }
}
