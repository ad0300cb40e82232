//! A base for another architecture (linux/arm64 on an x86_64 builder), without emulation.
//!
//! mmdebstrap cannot run an arm64 package's maintainer scripts on x86_64 without qemu, so
//! it *unpacks* the packages (`--variant=extract`: the Essential set, then ours) and
//! cudastack does, in Rust, the configuration steps a container needs from those scripts:
//! - `base-passwd`, `passwd`: `/etc/passwd` and `/etc/group` from the master files, the
//!   shadow files;
//! - `base-files`: `/etc/profile`, root's dot files, `/opt`, `/srv`, `/usr/local/*`, ...;
//! - debianutils' `/etc/shells`, tzdata's UTC `/etc/localtime`, libc-bin's nsswitch.conf;
//! - `ca-certificates`: `/etc/ca-certificates.conf` and the bundle
//!   `/etc/ssl/certs/ca-certificates.crt` that OpenSSL (and so Python's `ssl`) reads;
//! - `update-alternatives --install` lines of the postinst scripts (`awk -> mawk`);
//! - `libc-bin`'s trigger: `/etc/ld.so.cache`, written by [`crate::base_root::ldcache`].
//!
//! The dpkg database records every package as `install ok unpacked` (with its control
//! files and file lists, see [`DPKG_STATUS_HOOK`]), which is the truth: on an arm64 host,
//! `dpkg --configure -a` (or the first `apt-get install` of a derived image) runs the
//! remaining maintainer scripts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::base_root::ldcache;
use crate::elf::Machine;
use crate::layer::{LayerPath, Recorded, RecordedOwners};

/// Bump when what an unpacked base holds changes (part of its layer cache key).
pub const ASSEMBLER: &str = "unpacked-3";

/// An mmdebstrap extract hook (run on the build host, `$1` = the root): write the dpkg
/// status, control files and file lists of the unpacked packages from the downloaded
/// `.deb`s, with the host's `dpkg-deb`, which reads any architecture.
pub const DPKG_STATUS_HOOK: &str = r#"set -eu
export LC_ALL=C
root="$1"
info="$root/var/lib/dpkg/info"
status="$root/var/lib/dpkg/status"
mkdir -p "$info"
for deb in "$root"/var/cache/apt/archives/*.deb; do
  [ -e "$deb" ] || continue
  pkg=$(dpkg-deb --field "$deb" Package)
  name="$pkg"
  if [ "$(dpkg-deb --field "$deb" Multi-Arch)" = same ]; then
    name="$pkg:$(dpkg-deb --field "$deb" Architecture)"
  fi
  control=$(mktemp -d)
  dpkg-deb --control "$deb" "$control"
  for file in "$control"/*; do
    [ "$(basename "$file")" = control ] || cp -p "$file" "$info/$name.$(basename "$file")"
  done
  dpkg-deb --fsys-tarfile "$deb" | tar -t | sed -e 's,^\./,/,' -e 's,/$,,' -e 's,^$,/.,' > "$info/$name.list"
  {
    dpkg-deb --field "$deb" | grep -v '^Status:'
    echo "Status: install ok unpacked"
    if [ -s "$control/conffiles" ]; then
      echo "Conffiles:"
      grep '^/' "$control/conffiles" | while read -r conffile _; do
        if [ -f "$root$conffile" ]; then
          echo " $conffile $(md5sum < "$root$conffile" | cut -d' ' -f1)"
        fi
      done
    fi
    echo
  } >> "$status"
  rm -rf "$control"
done
"#;

/// What can go wrong finishing an unpacked root; wrapped by `base_root::BaseError`
/// with the same message (this module sits below `base`, which calls it).
#[derive(Debug, thiserror::Error)]
pub enum ForeignBaseError {
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ForeignBaseError + '_ {
    move |source| ForeignBaseError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Do what the maintainer scripts of an unpacked `machine` root would have done that a
/// container needs (see the module documentation). `epoch` is SOURCE_DATE_EPOCH (the
/// shadow files' last-change day, as pwconv writes it under mmdebstrap).
///
/// `owners` is the record of a rootless base (docs/rootless.md): the group ownerships the
/// scripts would set go there instead of to `chown`, which only root may call.
pub fn finish_unpacked_root(
    root: &Path,
    machine: Machine,
    epoch: u64,
    mut owners: Option<&mut RecordedOwners>,
) -> Result<(), ForeignBaseError> {
    users_and_groups(root)?;
    shadow_files(root, epoch, owners.as_deref_mut())?;
    base_files(root, owners)?;
    small_defaults(root)?;
    ca_bundle(root)?;
    alternatives(root)?;
    let cache = ldcache::ld_so_cache(&crate::audit::DirFs::new(root), machine).map_err(|e| {
        ForeignBaseError::Io {
            path: root.join("etc/ld.so.cache"),
            source: std::io::Error::other(e.to_string()),
        }
    })?;
    let path = root.join("etc/ld.so.cache");
    fs_err::write(&path, cache).map_err(io_error(&path))
}

/// base-passwd's postinst: the master files become `/etc/passwd` and `/etc/group`.
fn users_and_groups(root: &Path) -> Result<(), ForeignBaseError> {
    for (master, target) in [
        ("passwd.master", "etc/passwd"),
        ("group.master", "etc/group"),
    ] {
        let from = root.join("usr/share/base-passwd").join(master);
        let to = root.join(target);
        if from.is_file() && !to.exists() {
            fs_err::copy(&from, &to).map_err(io_error(&to))?;
        }
    }
    Ok(())
}

/// passwd's postinst (shadowconfig/pwconv, grpconv): `/etc/shadow` and `/etc/gshadow`
/// with locked passwords, mode 0640, group shadow.
fn shadow_files(
    root: &Path,
    epoch: u64,
    mut owners: Option<&mut RecordedOwners>,
) -> Result<(), ForeignBaseError> {
    let read = |name: &str| fs_err::read_to_string(root.join("etc").join(name)).unwrap_or_default();
    let (passwd, group) = (read("passwd"), read("group"));
    if passwd.is_empty() {
        return Ok(());
    }
    let day = epoch / 86_400;
    let shadow: String = passwd
        .lines()
        .filter_map(|line| line.split(':').next())
        .map(|user| format!("{user}:*:{day}:0:99999:7:::\n"))
        .collect();
    let gshadow: String = group
        .lines()
        .filter_map(|line| line.split(':').next())
        .map(|name| format!("{name}:*::\n"))
        .collect();
    let shadow_gid = group_id(&group, "shadow");
    for (name, text) in [("shadow", shadow), ("gshadow", gshadow)] {
        let path = root.join("etc").join(name);
        if path.exists() {
            continue;
        }
        fs_err::write(&path, text).map_err(io_error(&path))?;
        set_mode(&path, 0o640)?;
        chown_or_record(root, &path, shadow_gid, 0o640, owners.as_deref_mut())?;
    }
    Ok(())
}

/// base-files' postinst: the default profile and root's dot files, the top-level and
/// /usr/local directories with their modes, /var/spool/mail, the dpkg origin.
fn base_files(
    root: &Path,
    mut owners: Option<&mut RecordedOwners>,
) -> Result<(), ForeignBaseError> {
    let defaults = root.join("usr/share/base-files");
    for (from, to) in [
        ("dot.profile", "root/.profile"),
        ("dot.bashrc", "root/.bashrc"),
        ("profile", "etc/profile"),
        ("motd", "etc/motd"),
    ] {
        let (from, to) = (defaults.join(from), root.join(to));
        if from.is_file() && !to.exists() {
            if let Some(parent) = to.parent() {
                fs_err::create_dir_all(parent).map_err(io_error(parent))?;
            }
            fs_err::copy(&from, &to).map_err(io_error(&to))?;
        }
    }
    let group = fs_err::read_to_string(root.join("etc/group")).unwrap_or_default();
    let mail_gid = group_id(&group, "mail");
    for (dir, mode, gid) in [
        ("mnt", 0o755, Some(0)),
        ("srv", 0o755, Some(0)),
        ("opt", 0o755, Some(0)),
        ("etc/opt", 0o755, Some(0)),
        ("var/opt", 0o755, Some(0)),
        ("media", 0o755, Some(0)),
        ("var/mail", 0o2775, mail_gid),
        ("run/lock", 0o1777, Some(0)),
        ("usr/local", 0o755, Some(0)),
        ("usr/local/share", 0o755, Some(0)),
        ("usr/local/share/man", 0o755, Some(0)),
        ("usr/local/bin", 0o755, Some(0)),
        ("usr/local/games", 0o755, Some(0)),
        ("usr/local/lib", 0o755, Some(0)),
        ("usr/local/include", 0o755, Some(0)),
        ("usr/local/sbin", 0o755, Some(0)),
        ("usr/local/src", 0o755, Some(0)),
        ("usr/local/etc", 0o755, Some(0)),
    ] {
        let path = root.join(dir);
        if path.symlink_metadata().is_ok() {
            continue;
        }
        fs_err::create_dir_all(&path).map_err(io_error(&path))?;
        chown_or_record(root, &path, gid, mode, owners.as_deref_mut())?;
        set_mode(&path, mode)?;
    }
    for (link, target) in [
        ("var/spool/mail", "../mail"),
        ("usr/local/man", "share/man"),
        ("etc/dpkg/origins/default", "debian"),
    ] {
        let path = root.join(link);
        let target_exists = path.parent().is_some_and(|p| p.join(target).exists());
        if path.symlink_metadata().is_err() && target_exists {
            std::os::unix::fs::symlink(target, &path).map_err(io_error(&path))?;
        }
    }
    Ok(())
}

/// The files other postinsts create: debianutils' /etc/shells, tzdata's UTC default,
/// libc-bin's nsswitch.conf, libpam-modules' /etc/environment, passwd's subuid/subgid.
fn small_defaults(root: &Path) -> Result<(), ForeignBaseError> {
    let shells = root.join("etc/shells");
    if !shells.exists() {
        let mut text = String::from("# /etc/shells: valid login shells\n");
        let present: Vec<&str> = ["sh", "bash", "rbash", "dash"]
            .into_iter()
            .filter(|shell| root.join("usr/bin").join(shell).symlink_metadata().is_ok())
            .collect();
        for dir in ["/bin", "/usr/bin"] {
            for shell in &present {
                text.push_str(&format!("{dir}/{shell}\n"));
            }
        }
        fs_err::write(&shells, text).map_err(io_error(&shells))?;
    }
    let localtime = root.join("etc/localtime");
    if root.join("usr/share/zoneinfo/Etc/UTC").exists() && localtime.symlink_metadata().is_err() {
        std::os::unix::fs::symlink("/usr/share/zoneinfo/Etc/UTC", &localtime)
            .map_err(io_error(&localtime))?;
        let timezone = root.join("etc/timezone");
        fs_err::write(&timezone, "Etc/UTC\n").map_err(io_error(&timezone))?;
    }
    let nsswitch = root.join("etc/nsswitch.conf");
    let template = root.join("usr/share/libc-bin/nsswitch.conf");
    if template.is_file() && !nsswitch.exists() {
        fs_err::copy(&template, &nsswitch).map_err(io_error(&nsswitch))?;
    }
    for empty in ["etc/environment", "etc/subuid", "etc/subgid"] {
        let path = root.join(empty);
        if !path.exists() {
            fs_err::write(&path, "").map_err(io_error(&path))?;
        }
    }
    Ok(())
}

/// The id of group `name` in the text of an `/etc/group` file.
fn group_id(group_file: &str, name: &str) -> Option<u32> {
    group_file.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next() == Some(name))
            .then(|| fields.nth(1)?.parse().ok())
            .flatten()
    })
}

/// Root and group `gid` own `path`: by `chown` as root, in `owners` for a rootless base.
fn chown_or_record(
    root: &Path,
    path: &Path,
    gid: Option<u32>,
    mode: u32,
    owners: Option<&mut RecordedOwners>,
) -> Result<(), ForeignBaseError> {
    let Some(owners) = owners else {
        return std::os::unix::fs::chown(path, Some(0), gid).map_err(io_error(path));
    };
    let relative = path.strip_prefix(root).unwrap_or(path).to_string_lossy();
    let layer_path = LayerPath::parse(&relative).map_err(|e| ForeignBaseError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    owners.insert(
        &layer_path,
        Recorded {
            uid: 0,
            gid: gid.unwrap_or(0),
            mode,
        },
    );
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ForeignBaseError> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_error(path))
}

/// ca-certificates' postinst: trust every certificate the package ships (the default
/// answer of its debconf question), listed in `/etc/ca-certificates.conf`, concatenated
/// into the bundle.
fn ca_bundle(root: &Path) -> Result<(), ForeignBaseError> {
    let shipped = root.join("usr/share/ca-certificates");
    if !shipped.is_dir() {
        return Ok(());
    }
    let mut certificates: Vec<PathBuf> = Vec::new();
    let mut pending = vec![shipped.clone()];
    while let Some(dir) = pending.pop() {
        for entry in fs_err::read_dir(&dir).map_err(io_error(&dir))? {
            let path = entry.map_err(io_error(&dir))?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "crt") {
                certificates.push(path);
            }
        }
    }
    certificates.sort();
    let mut conf = String::from(
        "# Written by cudastack for an unpacked base: every certificate ca-certificates ships.\n",
    );
    let mut bundle = Vec::new();
    for certificate in &certificates {
        let relative = certificate.strip_prefix(&shipped).expect("found under it");
        conf.push_str(&format!("{}\n", relative.display()));
        let mut pem = fs_err::read(certificate).map_err(io_error(certificate))?;
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        bundle.extend_from_slice(&pem);
    }
    let conf_path = root.join("etc/ca-certificates.conf");
    fs_err::write(&conf_path, conf).map_err(io_error(&conf_path))?;
    let certs_dir = root.join("etc/ssl/certs");
    fs_err::create_dir_all(&certs_dir).map_err(io_error(&certs_dir))?;
    let bundle_path = certs_dir.join("ca-certificates.crt");
    fs_err::write(&bundle_path, bundle).map_err(io_error(&bundle_path))
}

/// One `update-alternatives --install` group: the master link and its slaves.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Alternative {
    priority: i64,
    /// (link, name, path): the master first.
    links: Vec<(String, String, String)>,
}

/// The `update-alternatives --install LINK NAME PATH PRIORITY [--slave LINK NAME PATH]...`
/// commands of a maintainer script whose arguments are literal paths.
fn parse_alternatives(script: &str) -> Vec<Alternative> {
    let joined = script.replace("\\\n", " ");
    let mut found = Vec::new();
    for line in joined.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(start) = words.iter().position(|w| *w == "--install") else {
            continue;
        };
        if !words[..start]
            .iter()
            .any(|w| w.ends_with("update-alternatives"))
        {
            continue;
        }
        let args = &words[start + 1..];
        let literal = |w: &&str| w.starts_with('/') || !w.contains(['$', '`', '"', '\'']);
        if args.len() < 4 || !args[..4].iter().all(literal) {
            continue;
        }
        let Ok(priority) = args[3].parse() else {
            continue;
        };
        let mut links = vec![(
            args[0].to_string(),
            args[1].to_string(),
            args[2].to_string(),
        )];
        let mut rest = &args[4..];
        while let [flag, link, name, path, tail @ ..] = rest {
            if *flag != "--slave" || ![link, name, path].iter().all(|w| literal(w)) {
                break;
            }
            links.push((link.to_string(), name.to_string(), path.to_string()));
            rest = tail;
        }
        found.push(Alternative { priority, links });
    }
    found
}

/// Create the `/etc/alternatives` links of the highest-priority alternative per name
/// whose target is in the image, as `update-alternatives` in auto mode would.
fn alternatives(root: &Path) -> Result<(), ForeignBaseError> {
    let info = root.join("var/lib/dpkg/info");
    let Ok(entries) = fs_err::read_dir(&info) else {
        return Ok(());
    };
    let mut scripts: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "postinst"))
        .collect();
    scripts.sort();
    let mut best: BTreeMap<String, Alternative> = BTreeMap::new();
    for script in scripts {
        let text = fs_err::read_to_string(&script).map_err(io_error(&script))?;
        for alternative in parse_alternatives(&text) {
            let master = alternative.links[0].1.clone();
            let target = root.join(alternative.links[0].2.trim_start_matches('/'));
            if !target.exists() {
                continue;
            }
            if best
                .get(&master)
                .is_none_or(|b| alternative.priority > b.priority)
            {
                best.insert(master, alternative);
            }
        }
    }
    let dir = root.join("etc/alternatives");
    fs_err::create_dir_all(&dir).map_err(io_error(&dir))?;
    for alternative in best.values() {
        for (link, name, path) in &alternative.links {
            if !root.join(path.trim_start_matches('/')).exists() {
                continue;
            }
            let entry = dir.join(name);
            let link_path = root.join(link.trim_start_matches('/'));
            if entry.symlink_metadata().is_ok() || link_path.symlink_metadata().is_ok() {
                continue;
            }
            std::os::unix::fs::symlink(path, &entry).map_err(io_error(&entry))?;
            std::os::unix::fs::symlink(format!("/etc/alternatives/{name}"), &link_path)
                .map_err(io_error(&link_path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAWK_POSTINST: &str = "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n  update-alternatives --install /usr/bin/awk awk /usr/bin/mawk 5 \\\n    --slave /usr/share/man/man1/awk.1.gz awk.1.gz /usr/share/man/man1/mawk.1.gz \\\n    --slave /usr/bin/nawk nawk /usr/bin/mawk\nfi\n";

    #[test]
    fn group_ids_by_name() {
        let group = "root:x:0:\nshadow:*:42:\nmail:x:8:\n";
        assert_eq!(group_id(group, "shadow"), Some(42));
        assert_eq!(group_id(group, "mail"), Some(8));
        assert_eq!(group_id(group, "staff"), None);
    }

    #[test]
    fn reads_literal_alternatives() {
        let found = parse_alternatives(MAWK_POSTINST);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].priority, 5);
        assert_eq!(
            found[0].links,
            [
                ("/usr/bin/awk".into(), "awk".into(), "/usr/bin/mawk".into()),
                (
                    "/usr/share/man/man1/awk.1.gz".into(),
                    "awk.1.gz".into(),
                    "/usr/share/man/man1/mawk.1.gz".into()
                ),
                (
                    "/usr/bin/nawk".into(),
                    "nawk".into(),
                    "/usr/bin/mawk".into()
                ),
            ]
        );
        assert!(parse_alternatives("update-alternatives --install \"$LINK\" x $P 10\n").is_empty());
    }

    #[test]
    fn finishes_an_unpacked_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for dir in [
            "usr/share/base-passwd",
            "usr/share/ca-certificates/mozilla",
            "usr/bin",
            "etc",
            "var/lib/dpkg/info",
        ] {
            fs_err::create_dir_all(r.join(dir)).unwrap();
        }
        fs_err::write(
            r.join("usr/share/base-passwd/passwd.master"),
            "root:*:0:0:root:/root:/bin/bash\n",
        )
        .unwrap();
        fs_err::write(r.join("usr/share/base-passwd/group.master"), "root:*:0:\n").unwrap();
        fs_err::write(
            r.join("usr/share/ca-certificates/mozilla/B.crt"),
            "-----B-----",
        )
        .unwrap();
        fs_err::write(
            r.join("usr/share/ca-certificates/mozilla/A.crt"),
            "-----A-----\n",
        )
        .unwrap();
        fs_err::write(r.join("usr/bin/mawk"), "").unwrap();
        fs_err::write(r.join("var/lib/dpkg/info/mawk.postinst"), MAWK_POSTINST).unwrap();
        finish_unpacked_root(r, Machine::Aarch64, 1_700_000_000, None).unwrap();
        assert_eq!(
            fs_err::read_to_string(r.join("etc/passwd")).unwrap(),
            "root:*:0:0:root:/root:/bin/bash\n"
        );
        assert_eq!(
            fs_err::read_to_string(r.join("etc/ssl/certs/ca-certificates.crt")).unwrap(),
            "-----A-----\n-----B-----\n"
        );
        assert!(fs_err::read_to_string(r.join("etc/ca-certificates.conf"))
            .unwrap()
            .contains("mozilla/A.crt\nmozilla/B.crt\n"));
        assert_eq!(
            fs_err::read_link(r.join("usr/bin/awk")).unwrap(),
            Path::new("/etc/alternatives/awk")
        );
        assert_eq!(
            fs_err::read_link(r.join("etc/alternatives/awk")).unwrap(),
            Path::new("/usr/bin/mawk")
        );
        // The man page is not in this root: no dangling slave link.
        assert!(r
            .join("etc/alternatives/awk.1.gz")
            .symlink_metadata()
            .is_err());
        let cache = fs_err::read(r.join("etc/ld.so.cache")).unwrap();
        assert!(cache.starts_with(b"glibc-ld.so.cache1.1"));
    }
}
