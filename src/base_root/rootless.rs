//! Building the base without root (docs/rootless.md): which of mmdebstrap's modes this
//! host can use ([`BuildHost`], also read by `doctor`), and the unpacking of the tar
//! mmdebstrap writes when it is not root.
//!
//! mmdebstrap run by a user other than root cannot give the files of a directory their
//! owners, but the tar it writes records them. So a rootless build has mmdebstrap write
//! the tar to a pipe, unpacks it as the user into the staging tree (the copy that
//! `inspect_rootfs`, `ldconfig` and the audit read) and records each entry's owner and
//! mode ([`RecordedOwners`]) beside the tree; the layer walk takes owners and modes from
//! that record. A root build is unchanged: mmdebstrap writes the directory.
//!
//! This module decides nothing about what the base contains.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

use crate::layer::{LayerPath, Recorded, RecordedOwners};

/// How mmdebstrap builds the base (its `--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BuildMode {
    /// As root: mmdebstrap writes the directory, owners and all.
    Root,
    /// A user namespace mapped to the user's subordinate ids (newuidmap); maintainer
    /// scripts run as in a root build.
    Unshare,
    /// fakeroot and fakechroot (LD_PRELOAD), no namespaces: what an unprivileged
    /// container allows.
    Fakechroot,
}

impl BuildMode {
    pub const ALL: [BuildMode; 3] = [BuildMode::Root, BuildMode::Unshare, BuildMode::Fakechroot];
    pub fn as_str(self) -> &'static str {
        match self {
            BuildMode::Root => "root",
            BuildMode::Unshare => "unshare",
            BuildMode::Fakechroot => "fakechroot",
        }
    }
}

impl std::fmt::Display for BuildMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RootlessError {
    #[error("no way to build the Debian base here: not root, and neither of mmdebstrap's rootless modes works\n  unshare: {unshare}\n  fakechroot: {fakechroot}\n  hint: {hint}")]
    NoMode {
        unshare: String,
        fakechroot: String,
        hint: String,
    },
    #[error("--build-mode {mode} does not work here: {why}\n  hint: {hint}")]
    Unavailable {
        mode: BuildMode,
        why: String,
        hint: String,
    },
    #[error("failed to unpack the base's tar from mmdebstrap into `{path}`")]
    Unpack {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A range of subordinate ids (`/etc/subuid`, `/etc/subgid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdRange {
    pub start: u64,
    pub count: u64,
}

/// What this host offers a build, as far as the build mode goes.
#[derive(Debug, Clone, Serialize)]
pub struct BuildHost {
    pub uid: u32,
    pub user: Option<String>,
    /// Why user namespaces cannot be used, when they cannot (`unshare --user` failed).
    pub user_namespaces: Result<(), String>,
    pub subuid: Option<IdRange>,
    pub subgid: Option<IdRange>,
    pub newuidmap: Option<PathBuf>,
    pub newgidmap: Option<PathBuf>,
    pub fakechroot: Option<PathBuf>,
    pub fakeroot: Option<PathBuf>,
}

/// mmdebstrap's unshare mode maps 65536 ids (a Debian root uses ids up to 65534).
pub const SUBORDINATE_IDS_NEEDED: u64 = 65_536;

impl BuildHost {
    /// Look at this process and host: uid, PATH, /etc/subuid and /etc/subgid, and a
    /// trial `unshare --user --map-root-user true`.
    pub fn detect() -> Self {
        let uid = effective_uid();
        let user = user_name(uid);
        let ranges = |file: &str| {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            subordinate_range(&text, user.as_deref(), uid)
        };
        BuildHost {
            uid,
            user_namespaces: user_namespaces_work(),
            subuid: ranges("/etc/subuid"),
            subgid: ranges("/etc/subgid"),
            newuidmap: which("newuidmap"),
            newgidmap: which("newgidmap"),
            fakechroot: which("fakechroot"),
            fakeroot: which("fakeroot"),
            user,
        }
    }

    /// Why unshare mode cannot work here, or None when it can.
    pub fn unshare_missing(&self) -> Option<String> {
        let mut missing = Vec::new();
        if let Err(why) = &self.user_namespaces {
            missing.push(format!("user namespaces are not usable ({why})"));
        }
        for (what, found) in [
            ("newuidmap", &self.newuidmap),
            ("newgidmap", &self.newgidmap),
        ] {
            if found.is_none() {
                missing.push(format!("`{what}` is not on PATH"));
            }
        }
        let who = self.user.clone().unwrap_or_else(|| self.uid.to_string());
        for (file, range) in [("/etc/subuid", &self.subuid), ("/etc/subgid", &self.subgid)] {
            match range {
                Some(r) if r.count >= SUBORDINATE_IDS_NEEDED => {}
                Some(r) => missing.push(format!(
                    "{file} gives {who} {} ids, fewer than {SUBORDINATE_IDS_NEEDED}",
                    r.count
                )),
                None => missing.push(format!("{file} has no range for {who}")),
            }
        }
        (!missing.is_empty()).then(|| missing.join("; "))
    }

    /// Why fakechroot mode cannot work here, or None when it can.
    pub fn fakechroot_missing(&self) -> Option<String> {
        let missing: Vec<String> = [
            ("fakechroot", &self.fakechroot),
            ("fakeroot", &self.fakeroot),
        ]
        .into_iter()
        .filter(|(_, found)| found.is_none())
        .map(|(what, _)| format!("`{what}` is not on PATH"))
        .collect();
        (!missing.is_empty()).then(|| missing.join("; "))
    }

    /// Why `mode` cannot work here, or None when it can.
    pub fn missing(&self, mode: BuildMode) -> Option<String> {
        match mode {
            BuildMode::Root if self.uid == 0 => None,
            BuildMode::Root => Some(format!("cudastack runs as uid {}, not root", self.uid)),
            BuildMode::Unshare => self.unshare_missing(),
            BuildMode::Fakechroot => self.fakechroot_missing(),
        }
    }

    /// The modes that work here, in the order `auto` prefers them.
    pub fn available(&self) -> Vec<BuildMode> {
        BuildMode::ALL
            .into_iter()
            .filter(|mode| self.missing(*mode).is_none())
            .collect()
    }

    /// The mode to build with: `requested`, when it works here; else (auto) root as uid
    /// 0, unshare when user namespaces work, fakechroot when installed.
    pub fn choose(&self, requested: Option<BuildMode>) -> Result<BuildMode, RootlessError> {
        if let Some(mode) = requested {
            return match self.missing(mode) {
                None => Ok(mode),
                Some(why) => Err(RootlessError::Unavailable {
                    mode,
                    why,
                    hint: hint_for(mode),
                }),
            };
        }
        self.available()
            .first()
            .copied()
            .ok_or_else(|| RootlessError::NoMode {
                unshare: self.unshare_missing().unwrap_or_default(),
                fakechroot: self.fakechroot_missing().unwrap_or_default(),
                hint: format!(
                    "{}; or {}; or run as root",
                    hint_for(BuildMode::Fakechroot),
                    hint_for(BuildMode::Unshare)
                ),
            })
    }
}

/// What to do to make `mode` work.
pub fn hint_for(mode: BuildMode) -> String {
    match mode {
        BuildMode::Root => "run cudastack as root, or use --build-mode auto".into(),
        BuildMode::Unshare => "allow user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; in a container, a seccomp/AppArmor profile that permits unshare), install `uidmap` (newuidmap), and give the user 65536 subordinate ids: `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER`".into(),
        BuildMode::Fakechroot => "install fakechroot and fakeroot (`apt-get install fakechroot fakeroot`)".into(),
    }
}

/// The effective uid: the owner of `/proc/self` (no libc call needed).
pub fn effective_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// The login name of `uid` from /etc/passwd, else `$USER`.
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() > 2 && fields[2].parse() == Ok(uid)).then(|| fields[0].to_string())
        })
        .or_else(|| std::env::var("USER").ok())
}

/// The first range of `/etc/subuid`-format `text` for `user` (by name or uid).
pub fn subordinate_range(text: &str, user: Option<&str>, uid: u32) -> Option<IdRange> {
    text.lines().find_map(|line| {
        let mut fields = line.trim().split(':');
        let (who, start, count) = (fields.next()?, fields.next()?, fields.next()?);
        let ours = Some(who) == user || who.parse() == Ok(uid);
        ours.then_some(())?;
        Some(IdRange {
            start: start.parse().ok()?,
            count: count.parse().ok()?,
        })
    })
}

/// Whether an unprivileged user namespace can be made here: the way mmdebstrap's unshare
/// mode starts (blocked by seccomp in most container runtimes' default profile).
fn user_namespaces_work() -> Result<(), String> {
    let Some(unshare) = which("unshare") else {
        return Err("`unshare` (util-linux) is not on PATH".into());
    };
    let output = Command::new(unshare)
        .args(["--user", "--map-root-user", "true"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(format!(
        "`unshare --user --map-root-user true` failed: {}",
        stderr.trim()
    ))
}

pub use crate::platform::which;

/// Unpack the tar `archive` (mmdebstrap's output) into `dest` as this user, leaving out
/// device nodes and everything under `dev/` (the runtime provides /dev, as the root
/// build's tree leaves it empty), and return the owners and modes it recorded. The copy
/// on disk stays readable and writable by the user (so staging can remove it).
pub fn unpack_recording_owners(
    archive: impl Read,
    dest: &Path,
) -> Result<RecordedOwners, RootlessError> {
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RootlessError::Unpack { path, source }
    };
    let mut owners = RecordedOwners::default();
    let mut archive = tar::Archive::new(archive);
    for entry in archive.entries().map_err(fail(dest))? {
        let mut entry = entry.map_err(fail(dest))?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Ok(path) = LayerPath::parse(&raw) else {
            continue; // `./`, the root itself
        };
        let kind = entry.header().entry_type();
        let under_dev = path.as_str().starts_with("dev/");
        if under_dev || kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            continue;
        }
        let header = entry.header();
        let invalid = |e: std::io::Error| RootlessError::Unpack {
            path: dest.join(path.as_str()),
            source: e,
        };
        let recorded = Recorded {
            uid: header.uid().map_err(invalid)? as u32,
            gid: header.gid().map_err(invalid)? as u32,
            mode: header.mode().map_err(invalid)? & 0o7777,
        };
        owners.insert(&path, recorded);
        entry
            .unpack_in(dest)
            .map_err(fail(&dest.join(path.as_str())))?;
        keep_usable(&dest.join(path.as_str()), recorded.mode, kind.is_dir())
            .map_err(fail(&dest.join(path.as_str())))?;
    }
    Ok(owners)
}

/// The user's copy keeps the permission bits but is always readable and writable by the
/// user (a 0555 directory must take its children, a 0640 file be read by the audit).
fn keep_usable(path: &Path, mode: u32, is_dir: bool) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let usable = if is_dir { 0o700 } else { 0o600 };
    std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode((mode & 0o777) | usable),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(uid: u32) -> BuildHost {
        BuildHost {
            uid,
            user: Some("builder".into()),
            user_namespaces: Ok(()),
            subuid: Some(IdRange {
                start: 100_000,
                count: 65_536,
            }),
            subgid: Some(IdRange {
                start: 100_000,
                count: 65_536,
            }),
            newuidmap: Some("/usr/bin/newuidmap".into()),
            newgidmap: Some("/usr/bin/newgidmap".into()),
            fakechroot: Some("/usr/bin/fakechroot".into()),
            fakeroot: Some("/usr/bin/fakeroot".into()),
        }
    }

    #[test]
    fn auto_prefers_root_then_unshare_then_fakechroot() {
        assert_eq!(host(0).choose(None).unwrap(), BuildMode::Root);
        assert_eq!(host(1000).choose(None).unwrap(), BuildMode::Unshare);
        let mut blocked = host(1000);
        blocked.user_namespaces = Err("Operation not permitted".into());
        assert_eq!(blocked.choose(None).unwrap(), BuildMode::Fakechroot);
        blocked.fakechroot = None;
        let error = blocked.choose(None).unwrap_err().to_string();
        assert!(error.contains("user namespaces are not usable (Operation not permitted)"));
        assert!(error.contains("`fakechroot` is not on PATH"));
        assert!(
            error.contains("apt-get install fakechroot fakeroot"),
            "{error}"
        );
    }

    #[test]
    fn a_requested_mode_that_cannot_work_says_why_and_what_to_do() {
        let error = host(1000)
            .choose(Some(BuildMode::Root))
            .unwrap_err()
            .to_string();
        assert!(error.contains("uid 1000, not root"), "{error}");
        let mut no_ids = host(1000);
        no_ids.subuid = None;
        let error = no_ids
            .choose(Some(BuildMode::Unshare))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("/etc/subuid has no range for builder"),
            "{error}"
        );
        assert!(error.contains("usermod --add-subuids"), "{error}");
    }

    #[test]
    fn subordinate_ranges_by_name_or_uid() {
        let text = "other:1:5\nbuilder:100000:65536\n1001:200000:10\n";
        assert_eq!(
            subordinate_range(text, Some("builder"), 1000),
            Some(IdRange {
                start: 100_000,
                count: 65_536
            })
        );
        assert_eq!(subordinate_range(text, None, 1001).unwrap().count, 10);
        assert_eq!(subordinate_range("garbage\n::\n", Some("x"), 5), None);
    }

    /// A tar with root-owned entries, a setuid file, a 0555 directory and a device node
    /// unpacks as this user with the owners and modes recorded, /dev left empty.
    #[test]
    fn unpacking_records_owners_and_keeps_the_copy_usable() {
        let mut builder = tar::Builder::new(Vec::new());
        let mut add =
            |path: &str, kind: tar::EntryType, mode: u32, uid: u64, gid: u64, data: &[u8]| {
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(kind);
                header.set_mode(mode);
                header.set_uid(uid);
                header.set_gid(gid);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, data).unwrap();
            };
        add("./", tar::EntryType::Directory, 0o755, 0, 0, b"");
        add("./etc/", tar::EntryType::Directory, 0o755, 0, 0, b"");
        add(
            "./etc/shadow",
            tar::EntryType::Regular,
            0o640,
            0,
            42,
            b"root:*:",
        );
        add("./usr/", tar::EntryType::Directory, 0o555, 0, 0, b"");
        add("./usr/su", tar::EntryType::Regular, 0o4755, 0, 0, b"x");
        add("./dev/", tar::EntryType::Directory, 0o755, 0, 0, b"");
        add("./dev/null", tar::EntryType::Char, 0o666, 0, 0, b"");
        let bytes = builder.into_inner().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let owners = unpack_recording_owners(&bytes[..], dest.path()).unwrap();
        let get = |p: &str| *owners.get(&LayerPath::parse(p).unwrap()).unwrap();
        assert_eq!(
            get("etc/shadow"),
            Recorded {
                uid: 0,
                gid: 42,
                mode: 0o640
            }
        );
        assert_eq!(get("usr/su").mode, 0o4755);
        assert_eq!(get("usr").mode, 0o555);
        assert!(owners.get(&LayerPath::parse("dev/null").unwrap()).is_none());
        assert!(dest.path().join("dev").is_dir());
        assert!(!dest.path().join("dev/null").exists());
        let usr = std::fs::metadata(dest.path().join("usr")).unwrap();
        assert_eq!(usr.mode() & 0o777, 0o755, "the user's copy stays writable");
        assert_eq!(
            std::fs::read(dest.path().join("etc/shadow")).unwrap(),
            b"root:*:"
        );
    }
}
