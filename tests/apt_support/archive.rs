//! A signed APT archive in a directory, in the layout and formats of deb.debian.org.
//!
//! ```text
//! ROOT/dists/DIST/{InRelease,Release,Release.gpg}
//! ROOT/dists/DIST/COMPONENT/binary-ARCH/Packages{,.gz,.xz}
//! ROOT/pool/COMPONENT/PREFIX/SOURCE/PACKAGE_VERSION_ARCH.deb
//! ```
//!
//! Release lists every index with its size, MD5Sum and SHA256 and is signed twice,
//! inline (`InRelease`) and detached (`Release.gpg`), by a throwaway ed25519 key whose
//! public half is exported as a binary keyring for `signed-by=`. Packages stanzas are the
//! .deb's own control fields plus `Filename`, `Size`, `MD5sum` and `SHA256`, so apt sees
//! exactly what the real archive says about the file. MD5 is there because Debian's index
//! has it and apt 2.6's `install --print-uris` prints only that hash (empty without it).
//!
//! Changes (`add`, `unlist`, `remove`) touch the pool at once but the indexes only at
//! [`Archive::publish`], which writes them with a later `Date` and signs again: a test can
//! move the index on while the locked file stays downloadable, or lose the file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::{run, temp_dir, FixtureError, Result};

/// One distribution of the archive (`dists/DIST`) and what its Release says about itself.
#[derive(Debug, Clone)]
pub struct Suite {
    /// The directory under `dists/`, which a sources line names (`bookworm`, `noble`).
    pub dist: String,
    /// Release's `Suite` field (`stable` on Debian, the codename on Ubuntu).
    pub suite: String,
    pub codename: String,
    pub origin: String,
    pub label: String,
    pub architectures: Vec<String>,
    pub components: Vec<String>,
}

impl Suite {
    /// Like deb.debian.org's `bookworm`: Suite `stable`, component `main`.
    pub fn debian(codename: &str, architectures: &[&str]) -> Self {
        Self {
            dist: codename.to_string(),
            suite: "stable".to_string(),
            codename: codename.to_string(),
            origin: "Debian".to_string(),
            label: "Debian".to_string(),
            architectures: architectures.iter().map(|a| a.to_string()).collect(),
            components: vec!["main".to_string()],
        }
    }

    /// Like ports.ubuntu.com's `noble` (Suite = codename, components main and universe).
    /// ports.ubuntu.com is not reachable from the machines these tests run on and Ubuntu's
    /// .debs cannot be downloaded here, so such an archive carries Debian's arm64 .debs
    /// under Ubuntu's layout and names: it shows the lock handles the archive, not that
    /// Ubuntu's packages install.
    pub fn ubuntu_ports(codename: &str, architectures: &[&str]) -> Self {
        Self {
            dist: codename.to_string(),
            suite: codename.to_string(),
            codename: codename.to_string(),
            origin: "Ubuntu".to_string(),
            label: "Ubuntu".to_string(),
            architectures: architectures.iter().map(|a| a.to_string()).collect(),
            components: vec!["main".to_string(), "universe".to_string()],
        }
    }
}

/// A .deb's control fields, read with `dpkg-deb --field`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebInfo {
    pub package: String,
    pub version: String,
    pub architecture: String,
    /// The source package (the pool directory), `package` when the control has none.
    pub source: String,
    /// The control paragraph as dpkg-deb prints it, without a trailing newline.
    pub control: String,
}

impl DebInfo {
    pub fn read(deb: &Path) -> Result<Self> {
        let output = run(Command::new("dpkg-deb").arg("--field").arg(deb))?;
        let control = String::from_utf8(output.stdout)
            .map_err(|_| invalid(deb, "its control fields are not UTF-8"))?
            .trim_end()
            .to_string();
        let field = |name: &str| {
            control.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (!line.starts_with([' ', '\t']) && key.eq_ignore_ascii_case(name))
                    .then(|| value.trim().to_string())
            })
        };
        let required = |name: &str| field(name).ok_or_else(|| invalid(deb, &format!("no {name}")));
        let package = required("Package")?;
        // `Source: name (version)` when the binary's version differs from the source's.
        let source = field("Source")
            .and_then(|s| s.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| package.clone());
        Ok(Self {
            version: required("Version")?,
            architecture: required("Architecture")?,
            package,
            source,
            control,
        })
    }

    /// `PACKAGE_VERSION_ARCH.deb`, the version without its epoch, as Debian names files.
    pub fn file_name(&self) -> String {
        let version = self
            .version
            .split_once(':')
            .map_or(self.version.as_str(), |(_, v)| v);
        format!("{}_{}_{}.deb", self.package, version, self.architecture)
    }
}

fn invalid(deb: &Path, why: &str) -> FixtureError {
    FixtureError::Invalid(format!("`{}` is not a usable .deb: {why}", deb.display()))
}

/// A .deb in the archive: where it lies (relative to the root, as `Filename:` says) and
/// what the index says about it.
#[derive(Debug, Clone)]
pub struct PublishedDeb {
    pub info: DebInfo,
    pub component: String,
    /// `pool/main/h/hello/hello_2.10-3_amd64.deb`, relative to the archive root.
    pub filename: String,
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
    /// Lower-case hex; only for the index (apt prints it), never trusted.
    pub md5: String,
}

/// A throwaway gpg key: its home lives in a temporary directory (short, under /tmp, so
/// the agent's socket path fits) and its agent is stopped on drop.
pub struct SigningKey {
    home: tempfile::TempDir,
    fingerprint: String,
    keyring: PathBuf,
}

impl SigningKey {
    pub fn generate(user_id: &str) -> Result<Self> {
        let home = tempfile::Builder::new()
            .prefix("apt-fixture-gnupg-")
            .tempdir()?;
        let gpg = |args: &[&str]| run(gpg_command(home.path()).args(args));
        gpg(&["--quick-gen-key", user_id, "ed25519", "sign", "never"])?;
        let listing = gpg(&["--with-colons", "--list-secret-keys"])?;
        let fingerprint = String::from_utf8_lossy(&listing.stdout)
            .lines()
            .find_map(|line| Some(line.strip_prefix("fpr:")?.trim_matches(':').to_string()))
            .ok_or_else(|| FixtureError::Invalid("gpg listed no fingerprint".into()))?;
        let keyring = home.path().join("archive-keyring.gpg");
        let output = keyring.to_string_lossy().into_owned();
        gpg(&["--output", &output, "--export", &fingerprint])?;
        Ok(Self {
            home,
            fingerprint,
            keyring,
        })
    }

    /// The public key as a binary keyring, for `signed-by=`.
    pub fn keyring(&self) -> &Path {
        &self.keyring
    }

    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn sign(&self, mode: &[&str], input: &Path, output: &Path) -> Result<()> {
        run(gpg_command(self.home.path())
            .args(["--digest-algo", "SHA512", "--local-user", &self.fingerprint])
            .args(mode)
            .arg("--output")
            .arg(output)
            .arg(input))?;
        Ok(())
    }
}

impl Drop for SigningKey {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "all"])
            .output();
    }
}

fn gpg_command(home: &Path) -> Command {
    let mut command = Command::new("gpg");
    command
        .args(["--batch", "--yes", "--quiet", "--no-tty", "--homedir"])
        .arg(home)
        .args(["--pinentry-mode", "loopback", "--passphrase", ""]);
    command
}

struct SuiteState {
    spec: Suite,
    debs: Vec<PublishedDeb>,
}

/// A signed archive under a temporary directory (removed on drop).
pub struct Archive {
    dir: tempfile::TempDir,
    key: SigningKey,
    suites: Vec<SuiteState>,
    last_date: i64,
}

impl Archive {
    /// An empty archive with these suites and a new key; nothing is written until
    /// [`Archive::publish`].
    pub fn new(suites: Vec<Suite>) -> Result<Self> {
        Self::with_key(
            suites,
            SigningKey::generate("cudastack fixture archive <apt-fixture@cudastack.invalid>")?,
        )
    }

    pub fn with_key(suites: Vec<Suite>, key: SigningKey) -> Result<Self> {
        Ok(Self {
            dir: temp_dir("apt-archive-")?,
            key,
            suites: suites
                .into_iter()
                .map(|spec| SuiteState {
                    spec,
                    debs: Vec::new(),
                })
                .collect(),
            last_date: 0,
        })
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The keyring that verifies this archive, for `signed-by=`.
    pub fn keyring(&self) -> &Path {
        self.key.keyring()
    }

    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// `deb [signed-by=KEYRING] URL DIST COMPONENT...` for this archive served at `url`.
    pub fn sources_line(&self, url: &str, dist: &str) -> Result<String> {
        let suite = &self.suite(dist)?.spec;
        Ok(format!(
            "deb [signed-by={}] {url} {dist} {}",
            self.keyring().display(),
            suite.components.join(" ")
        ))
    }

    /// Copy `deb` into the pool and list it in `dist`/`component` at the next publish
    /// (replacing an entry with the same package, version and architecture).
    pub fn add(&mut self, dist: &str, component: &str, deb: &Path) -> Result<PublishedDeb> {
        let info = DebInfo::read(deb)?;
        let spec = &self.suite(dist)?.spec;
        if !spec.components.iter().any(|c| c == component) {
            return Err(FixtureError::Invalid(format!(
                "suite `{dist}` has no component `{component}` (it has {:?})",
                spec.components
            )));
        }
        if info.architecture != "all" && !spec.architectures.contains(&info.architecture) {
            return Err(FixtureError::Invalid(format!(
                "`{}` is for {}, which suite `{dist}` does not carry ({:?})",
                deb.display(),
                info.architecture,
                spec.architectures
            )));
        }
        let filename = format!(
            "pool/{component}/{}/{}/{}",
            pool_prefix(&info.source),
            info.source,
            info.file_name()
        );
        let target = self.root().join(&filename);
        fs_err::create_dir_all(target.parent().expect("a pool path has a parent"))?;
        fs_err::copy(deb, &target)?;
        let (size, sha256) = hash_file(&target)?;
        let published = PublishedDeb {
            info,
            component: component.to_string(),
            filename,
            size,
            sha256,
            md5: md5_file(&target)?,
        };
        let debs = &mut self.suite_mut(dist)?.debs;
        debs.retain(|d| !same_file(&d.info, &published.info));
        debs.push(published.clone());
        Ok(published)
    }

    /// Add every file of `debs` to `dist`/`component`.
    pub fn add_all(&mut self, dist: &str, component: &str, debs: &[PathBuf]) -> Result<()> {
        for deb in debs {
            self.add(dist, component, deb)?;
        }
        Ok(())
    }

    /// Drop `name` `version` (every architecture) from `dist`'s index at the next publish,
    /// keeping its file in the pool: the archive has moved on, the URL still answers.
    pub fn unlist(&mut self, dist: &str, name: &str, version: &str) -> Result<Vec<PublishedDeb>> {
        let debs = &mut self.suite_mut(dist)?.debs;
        let (gone, kept) = std::mem::take(debs)
            .into_iter()
            .partition(|d| d.info.package == name && d.info.version == version);
        *debs = kept;
        if gone.is_empty() {
            return Err(FixtureError::Invalid(format!(
                "suite `{dist}` lists no `{name}` version `{version}`"
            )));
        }
        Ok(gone)
    }

    /// Unlist `name` `version` and delete its file from the pool (unless another suite
    /// lists it): a locked URL now answers 404.
    pub fn remove(&mut self, dist: &str, name: &str, version: &str) -> Result<Vec<PublishedDeb>> {
        let gone = self.unlist(dist, name, version)?;
        for deb in &gone {
            let listed = self
                .suites
                .iter()
                .flat_map(|s| &s.debs)
                .any(|d| d.filename == deb.filename);
            if !listed {
                fs_err::remove_file(self.root().join(&deb.filename))?;
            }
        }
        Ok(gone)
    }

    /// What `dist` lists (as of the last change, published or not).
    pub fn debs(&self, dist: &str) -> Result<&[PublishedDeb]> {
        Ok(&self.suite(dist)?.debs)
    }

    pub fn find(&self, dist: &str, name: &str, version: &str) -> Option<&PublishedDeb> {
        let suite = self.suite(dist).ok()?;
        suite
            .debs
            .iter()
            .find(|d| d.info.package == name && d.info.version == version)
    }

    /// Copy the pool files of `debs` to `dest`/`prefix`/`FILENAME` (`prefix` may be empty):
    /// a second server over `dest` is the snapshot archive a lock's fallback URL names,
    /// e.g. with prefix `archive/debian/20250101T000000Z` as snapshot.debian.org lays
    /// it out. Returns each file's path relative to `dest`, for the URL.
    pub fn copy_pool_files(
        &self,
        debs: &[PublishedDeb],
        dest: &Path,
        prefix: &str,
    ) -> Result<Vec<String>> {
        let mut copied = Vec::new();
        for deb in debs {
            let relative = Path::new(prefix).join(&deb.filename);
            let target = dest.join(&relative);
            fs_err::create_dir_all(target.parent().expect("a pool path has a parent"))?;
            fs_err::copy(self.root().join(&deb.filename), &target)?;
            copied.push(relative.to_string_lossy().into_owned());
        }
        Ok(copied)
    }

    /// Write every suite's indexes and Release with a `Date` later than the last publish,
    /// and sign them again.
    pub fn publish(&mut self) -> Result<()> {
        let date = self.next_date()?;
        for suite in &self.suites {
            let mut indexes = Vec::new();
            for component in &suite.spec.components {
                for arch in &suite.spec.architectures {
                    let text = packages_text(&suite.debs, component, arch);
                    let dir = Path::new(component).join(format!("binary-{arch}"));
                    let dist_dir = self.root().join("dists").join(&suite.spec.dist);
                    indexes.extend(write_index(&dist_dir, &dir, text.as_bytes())?);
                }
            }
            self.write_release(&suite.spec, &date, &indexes)?;
        }
        Ok(())
    }

    /// The plain `Packages` index of `dist`/`component`/`arch`.
    pub fn index_path(&self, dist: &str, component: &str, arch: &str) -> PathBuf {
        self.root()
            .join("dists")
            .join(dist)
            .join(component)
            .join(format!("binary-{arch}"))
            .join("Packages")
    }

    /// Replace an index (all its compressions) with `text` without touching Release: what a
    /// mirror that serves a tampered or torn index looks like.
    pub fn overwrite_index(
        &self,
        dist: &str,
        component: &str,
        arch: &str,
        text: &[u8],
    ) -> Result<()> {
        let dir = Path::new(component).join(format!("binary-{arch}"));
        write_index(&self.root().join("dists").join(dist), &dir, text)?;
        Ok(())
    }

    fn write_release(&self, spec: &Suite, date: &str, indexes: &[IndexFile]) -> Result<()> {
        let mut release = format!(
            "Origin: {}\nLabel: {}\nSuite: {}\nCodename: {}\nDate: {date}\n\
             Architectures: {}\nComponents: {}\nDescription: cudastack test fixture archive\n",
            spec.origin,
            spec.label,
            spec.suite,
            spec.codename,
            spec.architectures.join(" "),
            spec.components.join(" "),
        );
        for field in ["MD5Sum", "SHA256"] {
            release.push_str(&format!("{field}:\n"));
            for index in indexes {
                let hash = if field == "MD5Sum" {
                    &index.md5
                } else {
                    &index.sha256
                };
                release.push_str(&format!(" {hash} {:>16} {}\n", index.size, index.path));
            }
        }
        let dist_dir = self.root().join("dists").join(&spec.dist);
        let plain = dist_dir.join("Release");
        write_atomic(&plain, release.as_bytes())?;
        // Debian's Release.gpg is an armored detached signature, InRelease a clearsigned copy.
        let signatures: [(&[&str], &str); 2] = [
            (&["--clearsign"], "InRelease"),
            (&["--armor", "--detach-sign"], "Release.gpg"),
        ];
        for (mode, name) in signatures {
            let staged = dist_dir.join(format!(".{name}.new"));
            self.key.sign(mode, &plain, &staged)?;
            fs_err::rename(&staged, dist_dir.join(name))?;
        }
        Ok(())
    }

    /// An RFC 2822 date in UTC, strictly later than the last one: apt keeps the newer of
    /// two Release files, so a republish must not look as old as the one it replaces.
    fn next_date(&mut self) -> Result<String> {
        let mut now = jiff::Timestamp::now().as_second();
        while now <= self.last_date {
            std::thread::sleep(std::time::Duration::from_millis(100));
            now = jiff::Timestamp::now().as_second();
        }
        self.last_date = now;
        let stamp =
            jiff::Timestamp::from_second(now).map_err(|e| FixtureError::Invalid(e.to_string()))?;
        Ok(stamp.strftime("%a, %d %b %Y %H:%M:%S UTC").to_string())
    }

    fn suite(&self, dist: &str) -> Result<&SuiteState> {
        self.suites
            .iter()
            .find(|s| s.spec.dist == dist)
            .ok_or_else(|| no_suite(dist))
    }

    fn suite_mut(&mut self, dist: &str) -> Result<&mut SuiteState> {
        self.suites
            .iter_mut()
            .find(|s| s.spec.dist == dist)
            .ok_or_else(|| no_suite(dist))
    }
}

fn no_suite(dist: &str) -> FixtureError {
    FixtureError::Invalid(format!("the archive has no suite `{dist}`"))
}

fn same_file(a: &DebInfo, b: &DebInfo) -> bool {
    a.package == b.package && a.version == b.version && a.architecture == b.architecture
}

/// Debian's pool directory: `lib*` sources go under their first four letters (`libx/`),
/// the rest under their first letter (dak's rule). Source names are ASCII (Policy 5.6.1).
pub fn pool_prefix(source: &str) -> &str {
    let length = if source.starts_with("lib") { 4 } else { 1 };
    source.get(..length).unwrap_or(source)
}

/// The Packages text of one component and architecture: its .debs and the `all` ones,
/// sorted so the same set gives the same bytes.
fn packages_text(debs: &[PublishedDeb], component: &str, arch: &str) -> String {
    let mut chosen: Vec<&PublishedDeb> = debs
        .iter()
        .filter(|d| {
            d.component == component
                && (d.info.architecture == arch || d.info.architecture == "all")
        })
        .collect();
    chosen.sort_by(|a, b| {
        (&a.info.package, &a.info.version, &a.info.architecture).cmp(&(
            &b.info.package,
            &b.info.version,
            &b.info.architecture,
        ))
    });
    let mut text = String::new();
    for deb in chosen {
        text.push_str(&format!(
            "{}\nFilename: {}\nSize: {}\nMD5sum: {}\nSHA256: {}\n\n",
            deb.info.control, deb.filename, deb.size, deb.md5, deb.sha256
        ));
    }
    text
}

struct IndexFile {
    /// Relative to `dists/DIST`, as Release names it.
    path: String,
    size: u64,
    sha256: String,
    md5: String,
}

/// Write `text` as `Packages`, `Packages.gz` and `Packages.xz` in `dist_dir`/`dir`, as
/// Debian publishes them (apt fetches the .xz; the others are what older clients read).
fn write_index(dist_dir: &Path, dir: &Path, text: &[u8]) -> Result<Vec<IndexFile>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(text)?;
    let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 6);
    xz.write_all(text)?;
    let forms = [
        ("Packages", text.to_vec()),
        ("Packages.gz", gz.finish()?),
        ("Packages.xz", xz.finish()?),
    ];
    let mut files = Vec::new();
    for (name, bytes) in forms {
        let relative = dir.join(name);
        let path = dist_dir.join(&relative);
        write_atomic(&path, &bytes)?;
        files.push(IndexFile {
            path: relative.to_string_lossy().into_owned(),
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
            md5: md5_file(&path)?,
        });
    }
    Ok(files)
}

/// Write through a temporary name and rename, so a server never serves half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().expect("an index path has a parent");
    fs_err::create_dir_all(dir)?;
    let staged = dir.join(format!(
        ".{}.new",
        path.file_name().expect("a file name").to_string_lossy()
    ));
    fs_err::write(&staged, bytes)?;
    fs_err::rename(&staged, path)?;
    Ok(())
}

/// Size and lower-case hex SHA256 of a file, streamed.
pub fn hash_file(path: &Path) -> Result<(u64, String)> {
    use std::io::Read;
    let mut file = fs_err::File::open(path)?;
    let mut hasher = Sha256::new();
    let (mut size, mut buffer) = (0u64, vec![0u8; 1 << 16]);
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok((size, hex::encode(hasher.finalize())));
        }
        hasher.update(&buffer[..read]);
        size += read as u64;
    }
}

/// Lower-case hex MD5 of a file, by coreutils' md5sum (the crate has no MD5 dependency and
/// the index needs it only for apt's `--print-uris`).
fn md5_file(path: &Path) -> Result<String> {
    let output = run(Command::new("md5sum").arg("--binary").arg(path))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let hex = text.split_whitespace().next().unwrap_or_default();
    if hex.len() != 32 {
        return Err(FixtureError::Invalid(format!("md5sum printed `{text}`")));
    }
    Ok(hex.to_ascii_lowercase())
}

/// A copy of `deb` whose control says `version` (the files unchanged), written to
/// `dest_dir`: a "newer version" of a real package for a test whose archive moves on.
pub fn repack_with_version(deb: &Path, version: &str, dest_dir: &Path) -> Result<PathBuf> {
    let work = temp_dir("apt-repack-")?;
    let tree = work.path().join("tree");
    run(Command::new("dpkg-deb")
        .arg("--raw-extract")
        .arg(deb)
        .arg(&tree))?;
    let control_path = tree.join("DEBIAN/control");
    let control = fs_err::read_to_string(&control_path)?;
    let mut replaced = false;
    let lines: Vec<String> = control
        .lines()
        .map(|line| match line.strip_prefix("Version:") {
            Some(_) => {
                replaced = true;
                format!("Version: {version}")
            }
            None => line.to_string(),
        })
        .collect();
    if !replaced {
        return Err(invalid(deb, "no Version in its control file"));
    }
    fs_err::write(&control_path, lines.join("\n") + "\n")?;
    let mut info = DebInfo::read(deb)?;
    info.version = version.to_string();
    fs_err::create_dir_all(dest_dir)?;
    let out = dest_dir.join(info.file_name());
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&tree)
        .arg(&out))?;
    Ok(out)
}
