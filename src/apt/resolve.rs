//! apt, run against a throwaway root, decides a package set and says where each .deb is.
//!
//! The root holds only a `sources.list` whose suites are `signed-by` the archive keyring,
//! an empty dpkg status and apt's state directories; `Dir::Etc::Trusted` and `TrustedParts`
//! point nowhere, so no key of the host is trusted. `apt-get update` checks InRelease
//! against the keyring and each Packages file against Release (apt's own code, not ours);
//! `apt-get install --print-uris` runs apt's solver and prints the .debs it would fetch,
//! without Recommends (as mmdebstrap installs); `apt-cache show` and `madison` give each
//! one's sha256, size, suite and component. Nothing runs as root and nothing is installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use reqwest::Url;

use crate::apt::sources::{keyring_package, AptSources, ArchiveSuite};
use crate::digest::Digest;

#[derive(Debug, thiserror::Error)]
pub enum AptError {
    #[error("`apt-get` is not on PATH; `cudastack lock` resolves a Debian or Ubuntu base's packages with apt itself\n  hint: lock on a Debian or Ubuntu host (or in a `debian:bookworm` container), where apt is always installed")]
    AptMissing,
    #[error("the archive keyring `{}` does not exist; apt checks the archive's signature against it\n  hint: install `{package}` or pass the keyring that signs your mirror with `--apt-keyring FILE`", path.display())]
    KeyringMissing {
        path: PathBuf,
        package: &'static str,
    },
    #[error("apt could not read the archive index of {searched}: a signature or hash check failed, or the archive is unreachable\n  apt said:\n{output}")]
    Update { searched: String, output: String },
    #[error("{} not found in {searched}: {}\n  hint: check the spelling with `apt-cache search` on a {release} machine; a pinned version (`name=version`) must still be in the archive", if packages.len() == 1 { "package" } else { "packages" }, packages.join(", "))]
    NotFound {
        packages: Vec<String>,
        searched: String,
        release: String,
    },
    #[error("`{package}` is a virtual package: no package has that name, {} provide it\n  hint: name the one the image should have in `apt:` (apt would not choose either)", providers.join(", "))]
    Virtual {
        package: String,
        providers: Vec<String>,
    },
    #[error("apt found no set of packages that installs {roots}\n  apt said:\n{output}")]
    Unsatisfiable { roots: String, output: String },
    #[error("apt printed `{line}`, which cudastack could not read ({why})")]
    Unreadable { line: String, why: String },
    #[error("`--as-of` reads the archive's past state from a snapshot archive, and cudastack knows none for `{root}`\n  hint: name the mirror's snapshot service with `--apt-snapshot URL` (URL/YYYYMMDDTHHMMSSZ/ is the mirror at that moment), or lock without `--as-of`")]
    NoSnapshot { root: String },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One .deb apt chose: what the lock records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebPackage {
    pub name: String,
    pub version: String,
    /// `amd64`, `arm64` or `all`.
    pub architecture: String,
    /// The file name in the pool (`libc6_2.36-9+deb12u14_amd64.deb`).
    pub filename: String,
    pub url: Url,
    /// The archive root the URL is under (`http://deb.debian.org/debian`).
    pub archive_root: String,
    pub suite: String,
    pub component: String,
    pub sha256: Digest,
    pub size: u64,
    /// The same file in the snapshot archive, for when the mirror has dropped it.
    pub snapshot_url: Option<Url>,
}

impl DebPackage {
    /// The file's path under its archive root (`pool/main/g/glibc/...`).
    pub fn pool_path(&self) -> &str {
        self.url
            .as_str()
            .strip_prefix(&self.archive_root)
            .map(|p| p.trim_start_matches('/'))
            .unwrap_or(self.url.path())
    }
}

/// A throwaway apt root with the archive indexes read and checked.
pub struct Resolution {
    root: tempfile::TempDir,
    sources: AptSources,
    /// Suite -> the `Date` of its InRelease, for snapshot URLs.
    dates: BTreeMap<String, jiff::Timestamp>,
    release: String,
}

impl Resolution {
    /// The root's path.
    fn dir(&self) -> &Path {
        self.root.path()
    }

    /// The options that keep apt inside the throwaway root, as this user.
    fn options(&self) -> Vec<String> {
        settings(self.dir(), &self.sources)
            .into_iter()
            .flat_map(|(name, value)| ["-o".to_string(), format!("{name}={value}")])
            .collect()
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .args(self.options())
            .env("LC_ALL", "C")
            .env("APT_CONFIG", self.dir().join("etc/apt/apt.conf"));
        command
    }

    /// Make the root and run `apt-get update` in it (apt checks signatures and hashes).
    pub fn update(sources: &AptSources, release: &str) -> Result<Self, AptError> {
        if crate::platform::which("apt-get").is_none() {
            return Err(AptError::AptMissing);
        }
        if !sources.keyring.is_file() {
            return Err(AptError::KeyringMissing {
                path: sources.keyring.clone(),
                package: keyring_package(if sources.keyring.to_string_lossy().contains("ubuntu") {
                    "ubuntu"
                } else {
                    "debian"
                }),
            });
        }
        let root = tempfile::Builder::new()
            .prefix("cudastack-apt-")
            .tempdir()
            .map_err(io_error(&std::env::temp_dir()))?;
        make_root(root.path(), sources)?;
        let mut resolution = Resolution {
            root,
            sources: sources.clone(),
            dates: BTreeMap::new(),
            release: release.to_string(),
        };
        let output = run(resolution.command("apt-get").arg("-q").arg("update"))?;
        // apt exits 0 with "W: ... is not signed" or "Failed to fetch" warnings in some
        // versions; either is a failure here.
        if !output.status.success() || output.stderr.lines().any(is_update_failure) {
            return Err(AptError::Update {
                searched: sources.describe(),
                output: last_lines(&format!("{}{}", output.stdout, output.stderr), 12),
            });
        }
        resolution.dates = read_release_dates(&resolution.dir().join("var/lib/apt/lists"))?;
        Ok(resolution)
    }

    /// The packages apt installs for `roots` (names, `name=version`, or apt patterns such
    /// as `?essential`) into an empty root, in apt's order.
    pub fn resolve(&self, roots: &[String]) -> Result<Vec<DebPackage>, AptError> {
        let output = run(self
            .command("apt-get")
            .args(["install", "--print-uris", "-y", "-qq"])
            .args(roots))?;
        if !output.status.success() {
            return Err(self.install_error(roots, &output.stdout, &output.stderr));
        }
        let uris = output
            .stdout
            .lines()
            .filter(|l| l.starts_with('\''))
            .map(parse_uri_line)
            .collect::<Result<Vec<_>, _>>()?;
        let names: Vec<String> = uris
            .iter()
            .map(|u| format!("{}:{}={}", u.name, u.architecture, u.version))
            .collect();
        let stanzas = self.show(&names)?;
        let origins = self.madison(&uris)?;
        uris.into_iter()
            .map(|uri| self.package(uri, &stanzas, &origins))
            .collect()
    }

    /// Which of `wanted` (name, architecture, version) the signed index lists, as
    /// (name, version, sha256, size): one entry per stanza, so a version listed by two
    /// suites with other bytes is both (a build checks the lock against these).
    pub fn listed(
        &self,
        wanted: &[(String, String, String)],
    ) -> Result<BTreeSet<(String, String, Digest, u64)>, AptError> {
        let mut listed = BTreeSet::new();
        // One call per chunk: the command line stays short; a version apt does not know
        // makes the call fail after printing the rest, so its output is read either way.
        for chunk in wanted.chunks(200) {
            let names: Vec<String> = chunk
                .iter()
                .map(|(name, arch, version)| format!("{name}:{arch}={version}"))
                .collect();
            let output = run(self.command("apt-cache").arg("show").args(&names))?;
            for text in output.stdout.split("\n\n") {
                let stanza = Stanza::parse(text);
                let (Some(name), Some(version), Some(sha256), Some(size)) = (
                    stanza.get("Package"),
                    stanza.get("Version"),
                    stanza
                        .get("SHA256")
                        .and_then(|h| Digest::from_str(&format!("sha256:{h}")).ok()),
                    stanza.get("Size").and_then(|s| s.parse::<u64>().ok()),
                ) else {
                    continue;
                };
                listed.insert((name.to_string(), version.to_string(), sha256, size));
            }
        }
        Ok(listed)
    }

    /// Every version of `name` the archive lists, in apt's order (newest first).
    pub fn versions(&self, name: &str) -> Result<Vec<String>, AptError> {
        let output = run(self.command("apt-cache").arg("madison").arg(name))?;
        let mut versions: Vec<String> = Vec::new();
        for line in output.stdout.lines() {
            if let Some(version) = line.split(" | ").nth(1).map(str::trim) {
                if !versions.iter().any(|v| v == version) {
                    versions.push(version.to_string());
                }
            }
        }
        Ok(versions)
    }

    /// The error for a failed install: which root apt could not find, or its own words.
    fn install_error(&self, roots: &[String], stdout: &str, stderr: &str) -> AptError {
        let missing: Vec<String> = stderr.lines().filter_map(missing_package).collect();
        for package in &missing {
            if let Some(providers) = virtual_providers(stdout, package) {
                return AptError::Virtual {
                    package: package.clone(),
                    providers,
                };
            }
        }
        if !missing.is_empty() {
            return AptError::NotFound {
                packages: missing,
                searched: self.sources.describe(),
                release: self.release.clone(),
            };
        }
        AptError::Unsatisfiable {
            roots: roots.join(" "),
            output: last_lines(&format!("{stdout}{stderr}"), 20),
        }
    }

    /// `apt-cache show` of every `name:arch=version`: (name, version, arch) -> stanza.
    fn show(&self, names: &[String]) -> Result<BTreeMap<(String, String), Stanza>, AptError> {
        let mut stanzas = BTreeMap::new();
        if names.is_empty() {
            return Ok(stanzas);
        }
        let output = run(self.command("apt-cache").arg("show").args(names))?;
        if !output.status.success() {
            return Err(AptError::Unreadable {
                line: last_lines(&output.stderr, 3),
                why: "`apt-cache show` of the packages apt chose failed".into(),
            });
        }
        for text in output.stdout.split("\n\n") {
            let stanza = Stanza::parse(text);
            if let (Some(name), Some(version)) = (stanza.get("Package"), stanza.get("Version")) {
                stanzas
                    .entry((name.to_string(), version.to_string()))
                    .or_insert(stanza);
            }
        }
        Ok(stanzas)
    }

    /// `apt-cache madison`: (name, version) -> every (archive root, suite, component) that
    /// lists it, in the order of the sources.
    fn madison(
        &self,
        uris: &[UriLine],
    ) -> Result<BTreeMap<(String, String), Vec<Origin>>, AptError> {
        let mut origins: BTreeMap<(String, String), Vec<Origin>> = BTreeMap::new();
        if uris.is_empty() {
            return Ok(origins);
        }
        let mut names: Vec<&str> = uris.iter().map(|u| u.name.as_str()).collect();
        names.sort();
        names.dedup();
        let output = run(self.command("apt-cache").arg("madison").args(&names))?;
        for line in output.stdout.lines() {
            // ` libc6 | 2.36-9+deb12u14 | http://deb.debian.org/debian bookworm/main amd64 Packages`
            let fields: Vec<&str> = line.split(" | ").map(str::trim).collect();
            let [name, version, where_] = fields[..] else {
                continue;
            };
            let mut words = where_.split_whitespace();
            let (Some(root), Some(suite_component)) = (words.next(), words.next()) else {
                continue;
            };
            let Some((suite, component)) = suite_component.split_once('/') else {
                continue;
            };
            origins
                .entry((name.to_string(), version.to_string()))
                .or_default()
                .push(Origin {
                    root: root.trim_end_matches('/').to_string(),
                    suite: suite.to_string(),
                    component: component.to_string(),
                });
        }
        Ok(origins)
    }

    /// One chosen .deb, with the hash and size of its stanza and the suite it came from.
    fn package(
        &self,
        uri: UriLine,
        stanzas: &BTreeMap<(String, String), Stanza>,
        origins: &BTreeMap<(String, String), Vec<Origin>>,
    ) -> Result<DebPackage, AptError> {
        let key = (uri.name.clone(), uri.version.clone());
        let unreadable = |why: &str| AptError::Unreadable {
            line: uri.url.to_string(),
            why: why.to_string(),
        };
        let stanza = stanzas
            .get(&key)
            .ok_or_else(|| unreadable("apt-cache show has no stanza for it"))?;
        let sha256 = stanza
            .get("SHA256")
            .and_then(|h| Digest::from_str(&format!("sha256:{h}")).ok())
            .ok_or_else(|| unreadable("its Packages stanza has no SHA256"))?;
        let size: u64 = stanza
            .get("Size")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unreadable("its Packages stanza has no Size"))?;
        if size != uri.size {
            return Err(unreadable(
                "apt printed another size than its Packages stanza",
            ));
        }
        let origin = origins
            .get(&key)
            .and_then(|list| {
                list.iter()
                    .find(|o| uri.url.as_str().starts_with(&format!("{}/", o.root)))
            })
            .ok_or_else(|| unreadable("apt-cache madison names no suite for it"))?;
        let suite = self
            .sources
            .suites
            .iter()
            .find(|s| s.read_root() == origin.root && s.suite == origin.suite);
        // Read from a snapshot (`--as-of`): recorded under the archive's own root, where
        // the same pool path serves the same file.
        let (url, archive_root) = match suite {
            Some(suite) if suite.read_from.is_some() => {
                let pool = uri.url.as_str()[origin.root.len()..].trim_start_matches('/');
                let url = Url::parse(&format!("{}/{pool}", suite.root))
                    .map_err(|e| unreadable(&format!("bad URL under the archive root: {e}")))?;
                (url, suite.root.clone())
            }
            _ => (uri.url, origin.root.clone()),
        };
        let mut package = DebPackage {
            name: uri.name,
            version: uri.version,
            architecture: uri.architecture,
            filename: uri.filename,
            url,
            archive_root,
            suite: origin.suite.clone(),
            component: origin.component.clone(),
            sha256,
            size,
            snapshot_url: None,
        };
        package.snapshot_url = suite.and_then(|s| self.snapshot_url(s, &package));
        Ok(package)
    }

    /// The snapshot archive's copy of `package`: the archive as it was a day after the
    /// InRelease apt read (the snapshot archive imports a few times a day, so a state a
    /// day later holds every file that InRelease listed, unless it was removed that day).
    /// Taken from the archive's own date, so two locks of the same archive state agree.
    fn snapshot_url(&self, suite: &ArchiveSuite, package: &DebPackage) -> Option<Url> {
        let base = suite.snapshot.as_ref()?;
        let date = self.dates.get(&suite.suite)?;
        let later = date
            .checked_add(jiff::SignedDuration::from_hours(24))
            .ok()?;
        let stamp = later.strftime("%Y%m%dT%H%M%SZ");
        Url::parse(&format!("{base}/{stamp}/{}", package.pool_path())).ok()
    }
}

/// apt's settings for the throwaway root `root`: its own directories and configuration (the
/// host's /etc/apt is never read: these also go into the file `APT_CONFIG` names, which apt
/// reads before anything else), this architecture only, no Recommends (as mmdebstrap
/// installs), no locking, downloads as this user.
fn settings(root: &Path, sources: &AptSources) -> Vec<(&'static str, String)> {
    let architecture = &sources.architecture;
    let root = root.display().to_string();
    let mut settings = vec![
        ("Dir", format!("{root}/")),
        ("Dir::Etc", format!("{root}/etc/apt/")),
        ("Dir::Etc::Parts", format!("{root}/etc/apt/apt.conf.d/")),
        (
            "Dir::Etc::Preferences",
            format!("{root}/etc/apt/preferences"),
        ),
        (
            "Dir::Etc::PreferencesParts",
            format!("{root}/etc/apt/preferences.d/"),
        ),
        ("Dir::State::status", format!("{root}/var/lib/dpkg/status")),
        (
            "Dir::Etc::TrustedParts",
            format!("{root}/etc/apt/trusted.gpg.d/"),
        ),
        ("Dir::Etc::Trusted", "/nonexistent".to_string()),
        ("APT::Architecture", architecture.to_string()),
        ("APT::Architectures", architecture.to_string()),
        ("APT::Install-Recommends", "false".to_string()),
        ("APT::Install-Suggests", "false".to_string()),
        ("APT::Default-Release", String::new()),
        ("Acquire::Languages", "none".to_string()),
        ("Debug::NoLocking", "1".to_string()),
        ("APT::Sandbox::User", current_user_name()),
    ];
    // A past state's InRelease is past its Valid-Until by design (`--as-of`);
    // its signature and every hash are still checked.
    if sources.as_of.is_some() {
        settings.push(("Acquire::Check-Valid-Until", "false".to_string()));
    }
    settings
}

/// The same settings as an apt.conf file.
fn apt_conf(root: &Path, sources: &AptSources) -> String {
    settings(root, sources)
        .into_iter()
        .map(|(name, value)| format!("{name} \"{value}\";\n"))
        .collect()
}

/// A `deb822` stanza (Packages, InRelease): field -> value of its first line.
struct Stanza(BTreeMap<String, String>);

impl Stanza {
    fn parse(text: &str) -> Self {
        let mut fields = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with([' ', '\t']) {
                continue;
            }
            if let Some((field, value)) = line.split_once(':') {
                fields.insert(field.to_string(), value.trim().to_string());
            }
        }
        Stanza(fields)
    }
    fn get(&self, field: &str) -> Option<&str> {
        self.0.get(field).map(String::as_str)
    }
}

/// Where apt lists a package version.
struct Origin {
    root: String,
    suite: String,
    component: String,
}

/// One line of `--print-uris`: `'URL' FILE SIZE [HASH]`.
#[derive(Debug)]
struct UriLine {
    url: Url,
    filename: String,
    name: String,
    version: String,
    architecture: String,
    size: u64,
}

fn parse_uri_line(line: &str) -> Result<UriLine, AptError> {
    let unreadable = |why: &str| AptError::Unreadable {
        line: line.to_string(),
        why: why.to_string(),
    };
    let rest = line
        .strip_prefix('\'')
        .ok_or_else(|| unreadable("no URL"))?;
    let (url, rest) = rest.split_once('\'').ok_or_else(|| unreadable("no URL"))?;
    let url = Url::parse(url).map_err(|e| unreadable(&format!("bad URL: {e}")))?;
    let mut words = rest.split_whitespace();
    let local = words.next().ok_or_else(|| unreadable("no file name"))?;
    let size = words
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| unreadable("no size"))?;
    // apt's local name is NAME_VERSION_ARCH.deb with the epoch's colon as `%3a`.
    let stem = local
        .strip_suffix(".deb")
        .ok_or_else(|| unreadable("not a .deb"))?;
    let mut parts = stem.splitn(3, '_');
    let (Some(name), Some(version), Some(architecture)) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Err(unreadable("the file name is not NAME_VERSION_ARCH.deb"));
    };
    let filename = url
        .path_segments()
        .and_then(|mut s| s.next_back())
        .map(percent_decode)
        .ok_or_else(|| unreadable("the URL has no file name"))?;
    Ok(UriLine {
        name: name.to_string(),
        version: percent_decode(version),
        architecture: architecture.to_string(),
        filename,
        url,
        size,
    })
}

/// `%3a` -> `:`, `%2b` -> `+`: apt and the archive escape these in .deb names.
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// The package an `E:` line of apt says it cannot find.
fn missing_package(line: &str) -> Option<String> {
    let line = line.strip_prefix("E: ")?;
    if let Some(name) = line.strip_prefix("Unable to locate package ") {
        return Some(name.trim().to_string());
    }
    if let Some(rest) = line.strip_prefix("Package '") {
        if rest.contains("has no installation candidate") {
            return rest.split('\'').next().map(str::to_string);
        }
    }
    // E: Version '1.2' for 'git' was not found
    if let Some(rest) = line.strip_prefix("Version '") {
        let mut quoted = rest.split('\'');
        let version = quoted.next()?;
        let name = quoted.nth(1)?;
        return Some(format!("{name}={version}"));
    }
    None
}

/// The packages apt lists under `Package NAME is a virtual package provided by:` (one
/// indented `name version` line each), or None when apt did not say NAME is virtual.
fn virtual_providers(output: &str, name: &str) -> Option<Vec<String>> {
    let header = format!("Package {name} is a virtual package provided by:");
    let mut lines = output.lines().skip_while(|line| line.trim() != header);
    lines.next()?;
    let providers: Vec<String> = lines
        .take_while(|line| line.starts_with(' '))
        .filter_map(|line| line.split_whitespace().next().map(str::to_string))
        .collect();
    (!providers.is_empty()).then_some(providers)
}

/// A line of `apt-get update` that means the index was not read and checked.
fn is_update_failure(line: &str) -> bool {
    line.starts_with("E: ")
        || (line.starts_with("W: ")
            && (line.contains("is not signed")
                || line.contains("Failed to fetch")
                || line.contains("NO_PUBKEY")
                || line.contains("Hash Sum mismatch")))
}

/// The InRelease files apt kept: dist (the suite a sources line names) -> Date. The dist
/// comes from the list file's name (`..._dists_bookworm-updates_InRelease`), not from the
/// file's Suite or Codename fields: Ubuntu's `noble-updates` says `Codename: noble`.
fn read_release_dates(lists: &Path) -> Result<BTreeMap<String, jiff::Timestamp>, AptError> {
    let mut dates = BTreeMap::new();
    for entry in fs_err::read_dir(lists).map_err(io_error(lists))? {
        let path = entry.map_err(io_error(lists))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(dist) = name
            .strip_suffix("_InRelease")
            .and_then(|stem| stem.rsplit_once("_dists_"))
            .map(|(_, dist)| dist.to_string())
        else {
            continue;
        };
        let text = fs_err::read_to_string(&path).map_err(io_error(&path))?;
        let body = text
            .split_once("\n\n")
            .map(|(_, body)| body)
            .unwrap_or(&text);
        if let Some(date) = Stanza::parse(body).get("Date").and_then(parse_release_date) {
            dates.insert(dist, date);
        }
    }
    Ok(dates)
}

/// A Release `Date:`: `Sat, 08 Nov 2025 09:38:35 UTC` (Debian), `Sun, 29 Nov 2026  3:21:46
/// UTC` (Ubuntu pads a one-digit hour with a space). Read field by field; the zone is UTC
/// (`UTC`, `GMT`, `+0000`) in every archive.
fn parse_release_date(text: &str) -> Option<jiff::Timestamp> {
    let mut words: Vec<&str> = text.split_whitespace().collect();
    if words.first().is_some_and(|w| w.ends_with(',')) {
        words.remove(0);
    }
    let [day, month, year, time, zone] = words[..] else {
        return None;
    };
    if !matches!(zone, "UTC" | "GMT" | "+0000" | "Z") {
        return None;
    }
    let time = if time.find(':') == Some(1) {
        format!("0{time}")
    } else {
        time.to_string()
    };
    let normalised = format!("{day:0>2} {month} {year} {time} +0000");
    jiff::fmt::strtime::parse("%d %b %Y %H:%M:%S %z", &normalised)
        .ok()?
        .to_timestamp()
        .ok()
}

/// The directories apt needs in its root, the sources and an empty dpkg status.
fn make_root(root: &Path, sources: &AptSources) -> Result<(), AptError> {
    for dir in [
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "etc/apt/apt.conf.d",
        "etc/apt/trusted.gpg.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg",
    ] {
        let path = root.join(dir);
        fs_err::create_dir_all(&path).map_err(io_error(&path))?;
    }
    for (file, text) in [
        ("var/lib/dpkg/status", String::new()),
        ("etc/apt/apt.conf", apt_conf(root, sources)),
        ("etc/apt/sources.list", sources.sources_list()),
    ] {
        let path = root.join(file);
        fs_err::write(&path, text).map_err(io_error(&path))?;
    }
    Ok(())
}

struct Output {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

fn run(command: &mut Command) -> Result<Output, AptError> {
    let program = PathBuf::from(command.get_program());
    let output = command.output().map_err(io_error(&program))?;
    Ok(Output {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// This process's user name: apt drops to `APT::Sandbox::User` for downloads, and the
/// throwaway root is this user's.
fn current_user_name() -> String {
    // SAFETY: getpwuid returns a pointer into static storage or null; read at once.
    unsafe {
        let entry = libc::getpwuid(libc::geteuid());
        if entry.is_null() || (*entry).pw_name.is_null() {
            return "root".to_string();
        }
        std::ffi::CStr::from_ptr((*entry).pw_name)
            .to_string_lossy()
            .into_owned()
    }
}

fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(count)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> AptError {
    let path = path.to_path_buf();
    move |source| AptError::Io { path, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_print_uris_line_with_an_epoch() {
        let line = "'http://deb.debian.org/debian/pool/main/z/zlib/zlib1g_1.2.13.dfsg-1%2bdeb12u1_amd64.deb' zlib1g_1%3a1.2.13.dfsg-1+deb12u1_amd64.deb 86880 ";
        let uri = parse_uri_line(line).unwrap();
        assert_eq!(uri.name, "zlib1g");
        assert_eq!(uri.version, "1:1.2.13.dfsg-1+deb12u1");
        assert_eq!(uri.architecture, "amd64");
        assert_eq!(uri.filename, "zlib1g_1.2.13.dfsg-1+deb12u1_amd64.deb");
        assert_eq!(uri.size, 86880);
        assert!(parse_uri_line("'http://x/y.deb' y.txt 1").is_err());
        assert!(parse_uri_line("garbage").is_err());
    }

    /// apt's own words for a virtual package (bookworm's apt 2.6, `apt-get install
    /// mail-transport-agent`): the error names the providers instead of "not found".
    #[test]
    fn a_virtual_package_names_its_providers() {
        let stdout = "Reading package lists...\nBuilding dependency tree...\nPackage mail-transport-agent is a virtual package provided by:\n  postfix 3.7.11-0+deb12u1\n  exim4-daemon-light 4.96-15+deb12u7\nYou should explicitly select one to install.\n\n";
        assert_eq!(
            virtual_providers(stdout, "mail-transport-agent"),
            Some(vec![
                "postfix".to_string(),
                "exim4-daemon-light".to_string()
            ])
        );
        assert_eq!(virtual_providers(stdout, "git"), None);
        let error = AptError::Virtual {
            package: "mail-transport-agent".into(),
            providers: virtual_providers(stdout, "mail-transport-agent").unwrap(),
        }
        .to_string();
        assert!(
            error.contains("virtual package") && error.contains("postfix, exim4-daemon-light"),
            "{error}"
        );
    }

    #[test]
    fn names_the_packages_apt_cannot_find() {
        assert_eq!(
            missing_package("E: Unable to locate package gti").as_deref(),
            Some("gti")
        );
        assert_eq!(
            missing_package("E: Version '9.9' for 'git' was not found").as_deref(),
            Some("git=9.9")
        );
        assert_eq!(
            missing_package("E: Package 'libcudnn8' has no installation candidate").as_deref(),
            Some("libcudnn8")
        );
        assert_eq!(missing_package("E: Broken packages"), None);
    }

    #[test]
    fn reads_release_dates_in_utc() {
        let date = parse_release_date("Sat, 08 Nov 2025 09:38:35 UTC").unwrap();
        assert_eq!(
            date.strftime("%Y%m%dT%H%M%SZ").to_string(),
            "20251108T093835Z"
        );
    }
}
