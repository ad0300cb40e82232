//! Real .debs from deb.debian.org for fixture archives, downloaded once.
//!
//! apt resolves and downloads them (checking each file against the signed index) from a
//! throwaway root under `target/tmp/apt-fixture-debs/ARCH/`; the files go to `ARCH/debs/`
//! and each requested set is recorded in `ARCH/sets/KEY.list`, so a later run (or test)
//! asking for the same set reads the list and touches no network. A set resolved on
//! another day may hold older versions than the mirror now serves: for a fixture that is
//! fine, it is the archive the test publishes that matters.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{gate, AptRoot, FixtureError, Result};

pub const MIRROR: &str = "http://deb.debian.org/debian";
pub const DIST: &str = "bookworm";
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// What cudastack's base installs: mmdebstrap's minbase variant (Essential: yes, Priority:
/// required, apt) plus python3 and ca-certificates (src/base_root/mod.rs).
pub const MINBASE: &[&str] = &[
    "?essential",
    "?priority(required)",
    "apt",
    "python3",
    "ca-certificates",
];

/// Whether a set is the named packages only or apt's closure over their dependencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    Exact,
    WithDependencies,
}

/// `target/tmp/apt-fixture-debs`.
pub fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("apt-fixture-debs")
}

/// Bookworm's minbase + python3 + ca-certificates for `architecture`, as apt resolves it
/// against deb.debian.org (about 136 packages, 50 MB), downloaded once.
pub fn minbase_set(architecture: &str) -> Result<Vec<PathBuf>> {
    fetch(architecture, MINBASE, Resolve::WithDependencies)
}

/// The .debs of `packages` (bookworm `main`, `architecture`), from the cache or downloaded.
pub fn fetch(architecture: &str, packages: &[&str], resolve: Resolve) -> Result<Vec<PathBuf>> {
    // Tests run in parallel threads, and test binaries of other checkouts may share a
    // target dir: one resolves a set while the others wait.
    static FETCHING: Mutex<()> = Mutex::new(());
    let _guard = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = cache_dir().join(architecture);
    fs_err::create_dir_all(&dir)?;
    let lock = fs_err::File::create(dir.join(".lock"))?;
    lock.file().lock()?;
    if let Some(paths) = cached(architecture, packages, resolve) {
        return Ok(paths);
    }
    let debs = dir.join("debs");
    let sources = format!("deb [signed-by={DEBIAN_KEYRING}] {MIRROR} {DIST} main");
    let root = AptRoot::create(&dir.join("root"), architecture, &[sources])?;
    root.update()?;
    let uris = match resolve {
        Resolve::Exact => root.download(packages, &debs)?,
        Resolve::WithDependencies => {
            let uris = root.resolve(packages)?;
            root.download_closure(packages, &debs)?;
            uris
        }
    };
    let mut names: Vec<String> = uris.into_iter().map(|u| u.file_name).collect();
    names.sort();
    for name in &names {
        if !debs.join(name).is_file() {
            return Err(FixtureError::Invalid(format!(
                "apt reported `{name}` but did not leave it in {}",
                debs.display()
            )));
        }
    }
    let list = set_list(architecture, packages, resolve);
    fs_err::create_dir_all(list.parent().expect("a set list has a parent"))?;
    // Renamed into place: a reader that does not hold the lock ([`cached`]) never sees a
    // partial list (a subset of the set).
    let staged = list.with_extension("list.new");
    fs_err::write(&staged, names.join("\n") + "\n")?;
    fs_err::rename(&staged, &list)?;
    Ok(names.iter().map(|n| debs.join(n)).collect())
}

/// The set when an earlier run downloaded it and every file is still there.
pub fn cached(architecture: &str, packages: &[&str], resolve: Resolve) -> Option<Vec<PathBuf>> {
    let text = std::fs::read_to_string(set_list(architecture, packages, resolve)).ok()?;
    let debs = cache_dir().join(architecture).join("debs");
    let paths: Vec<PathBuf> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| debs.join(l))
        .collect();
    (!paths.is_empty() && paths.iter().all(|p| p.is_file())).then_some(paths)
}

/// For tests: the set, from the cache or downloaded; None (after reporting the skip,
/// which fails under `CUDASTACK_REQUIRE=1`) when it must be downloaded and cannot be:
/// `CUDASTACK_OFFLINE_TESTS=1`, no Debian keyring, or deb.debian.org unreachable. A
/// download that fails with the mirror reachable panics: that is a fault, not a skip.
pub fn fetch_or_skip(
    architecture: &str,
    packages: &[&str],
    resolve: Resolve,
) -> Option<Vec<PathBuf>> {
    if let Some(paths) = cached(architecture, packages, resolve) {
        return Some(paths);
    }
    if gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |v| v == "1",
        "this test downloads .debs from http://deb.debian.org once",
    ) {
        return None;
    }
    if !Path::new(DEBIAN_KEYRING).is_file() {
        gate::skip(
            "debian-archive-keyring",
            format!("{DEBIAN_KEYRING} is missing (apt-get install debian-archive-keyring)"),
        );
        return None;
    }
    if let Err(why) = reachable("deb.debian.org:80") {
        gate::skip(
            "network",
            format!(
                "deb.debian.org is not reachable ({why}); the .debs are downloaded once into {}",
                cache_dir().display()
            ),
        );
        return None;
    }
    match fetch(architecture, packages, resolve) {
        Ok(paths) => Some(paths),
        Err(error) => {
            panic!("Failed to download {packages:?} ({architecture}) from {MIRROR}: {error}")
        }
    }
}

/// [`minbase_set`] for tests, with [`fetch_or_skip`]'s gate.
pub fn minbase_or_skip(architecture: &str) -> Option<Vec<PathBuf>> {
    fetch_or_skip(architecture, MINBASE, Resolve::WithDependencies)
}

fn reachable(address: &str) -> std::result::Result<(), String> {
    let addresses = address.to_socket_addrs().map_err(|e| format!("DNS: {e}"))?;
    let mut last = "no address".to_string();
    for socket in addresses {
        match TcpStream::connect_timeout(&socket, Duration::from_secs(5)) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{socket}: {e}"),
        }
    }
    Err(last)
}

/// `ARCH/sets/MODE-HASH.list`: one list per (architecture, mode, sorted package names).
fn set_list(architecture: &str, packages: &[&str], resolve: Resolve) -> PathBuf {
    let mut sorted: Vec<&str> = packages.to_vec();
    sorted.sort_unstable();
    let key = hex::encode(Sha256::digest(sorted.join("\n").as_bytes()));
    let mode = match resolve {
        Resolve::Exact => "exact",
        Resolve::WithDependencies => "closure",
    };
    cache_dir()
        .join(architecture)
        .join("sets")
        .join(format!("{mode}-{}.list", &key[..16]))
}
