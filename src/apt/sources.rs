//! Where a base's packages come from: the archives and suites apt reads at lock time, the
//! keyring that signs them, and the snapshot archive that keeps every version they served.

use std::path::PathBuf;

use reqwest::Url;

/// One `deb` line: an archive root, a suite and its components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSuite {
    /// The archive root (`http://deb.debian.org/debian`), without a trailing slash.
    pub root: String,
    /// `bookworm`, `bookworm-updates`, `bookworm-security`.
    pub suite: String,
    pub components: Vec<String>,
    /// Where the snapshot archive keeps this archive's past states
    /// (`https://snapshot.debian.org/archive/debian`); None for a mirror cudastack does not
    /// know.
    pub snapshot: Option<String>,
    /// Where apt reads this suite when it is not `root`: the snapshot archive's state at
    /// a moment (`lock --as-of`). The lock still records `root` URLs: the pool
    /// paths are the same, and a lock made as of a moment equals one made then.
    pub read_from: Option<String>,
}

impl ArchiveSuite {
    /// The root apt reads: the snapshot for `--as-of`, else the archive itself.
    pub fn read_root(&self) -> &str {
        self.read_from.as_deref().unwrap_or(&self.root)
    }
}

/// Everything apt reads at lock time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSources {
    pub suites: Vec<ArchiveSuite>,
    /// The keyring the archives are signed with (`signed-by=`); no other key is trusted.
    pub keyring: PathBuf,
    /// The Debian architecture resolved for (`amd64`, `arm64`).
    pub architecture: String,
    /// The moment the suites are read as of (their snapshots), or None for today's
    /// archive.
    pub as_of: Option<jiff::Timestamp>,
}

/// The public archives of a distribution release, with their security and update suites,
/// or an internal mirror that serves the same suites (`--apt-mirror`).
impl AptSources {
    pub fn for_release(
        distro: &str,
        release: &str,
        architecture: &str,
        mirror: Option<&Url>,
        keyring: Option<PathBuf>,
    ) -> Self {
        let suite =
            |root: &str, suite: String, components: &[&str], snapshot: Option<&str>| ArchiveSuite {
                root: root.trim_end_matches('/').to_string(),
                suite,
                components: components.iter().map(|c| c.to_string()).collect(),
                snapshot: snapshot.map(str::to_string),
                read_from: None,
            };
        // Debian's unstable and testing have no security or updates suites.
        let stable_line = !matches!(release, "sid" | "unstable" | "testing");
        let mut suites = Vec::new();
        match (distro, mirror) {
            ("ubuntu", None) => {
                let ports = !matches!(architecture, "amd64" | "i386");
                let (root, snapshot) = if ports {
                    (
                        "http://ports.ubuntu.com/ubuntu-ports",
                        "https://snapshot.ubuntu.com/ubuntu-ports",
                    )
                } else {
                    (
                        "http://archive.ubuntu.com/ubuntu",
                        "https://snapshot.ubuntu.com/ubuntu",
                    )
                };
                for name in ["", "-updates", "-security"] {
                    let components = ["main", "universe"];
                    suites.push(suite(
                        root,
                        format!("{release}{name}"),
                        &components,
                        Some(snapshot),
                    ));
                }
            }
            (_, None) => {
                let debian = "http://deb.debian.org/debian";
                let snapshot = "https://snapshot.debian.org/archive/debian";
                suites.push(suite(debian, release.into(), &["main"], Some(snapshot)));
                if stable_line {
                    suites.push(suite(
                        debian,
                        format!("{release}-updates"),
                        &["main"],
                        Some(snapshot),
                    ));
                    suites.push(suite(
                        "http://security.debian.org/debian-security",
                        format!("{release}-security"),
                        &["main"],
                        Some("https://snapshot.debian.org/archive/debian-security"),
                    ));
                }
            }
            // An internal mirror serves every suite of the release from one root.
            (distro, Some(mirror)) => {
                let components: &[&str] = if distro == "ubuntu" {
                    &["main", "universe"]
                } else {
                    &["main"]
                };
                let names: &[&str] = if stable_line {
                    &["", "-updates", "-security"]
                } else {
                    &[""]
                };
                for name in names {
                    suites.push(suite(
                        mirror.as_str(),
                        format!("{release}{name}"),
                        components,
                        None,
                    ));
                }
            }
        }
        AptSources {
            suites,
            keyring: keyring.unwrap_or_else(|| default_keyring(distro)),
            architecture: architecture.to_string(),
            as_of: None,
        }
    }

    /// The same suites as they were at `at`, read from the snapshot archive:
    /// snapshot.debian.org and snapshot.ubuntu.com keep every state the archives served,
    /// under `SERVICE/<archive>/YYYYMMDDTHHMMSSZ/`. `service` replaces the public
    /// services' origin (a fixture, or a site's copy of them), and is the snapshot root
    /// of an `--apt-mirror`, which has no public one. apt still checks every signature;
    /// only the expiry of an old InRelease (`Valid-Until`) is waived, as it must be for
    /// any past state.
    pub fn at_snapshot(
        mut self,
        at: jiff::Timestamp,
        service: Option<&Url>,
    ) -> Result<Self, crate::apt::AptError> {
        let stamp = at.strftime("%Y%m%dT%H%M%SZ").to_string();
        for suite in &mut self.suites {
            let base = match (service, &suite.snapshot) {
                (Some(service), Some(public)) => with_origin(public, service),
                (Some(service), None) => {
                    let root = service.as_str().trim_end_matches('/').to_string();
                    suite.snapshot = Some(root.clone());
                    root
                }
                (None, Some(public)) => public.clone(),
                (None, None) => {
                    return Err(crate::apt::AptError::NoSnapshot {
                        root: suite.root.clone(),
                    })
                }
            };
            suite.read_from = Some(format!("{base}/{stamp}"));
        }
        self.as_of = Some(at);
        Ok(self)
    }

    /// The `sources.list` apt reads: each suite `signed-by` the keyring, nothing else trusted.
    pub fn sources_list(&self) -> String {
        let mut text = String::new();
        for suite in &self.suites {
            text.push_str(&format!(
                "deb [signed-by={} arch={}] {} {} {}\n",
                self.keyring.display(),
                self.architecture,
                suite.read_root(),
                suite.suite,
                suite.components.join(" ")
            ));
        }
        text
    }

    /// The `sources.list` an image gets: the same suites, checked by the keyring the
    /// base's own archive-keyring package installs (apt's default trust).
    pub fn image_sources_list(&self) -> String {
        self.suites
            .iter()
            .map(|s| format!("deb {} {} {}\n", s.root, s.suite, s.components.join(" ")))
            .collect()
    }

    /// The suites searched, for errors (`bookworm, bookworm-updates (deb.debian.org/debian)`).
    pub fn describe(&self) -> String {
        self.suites
            .iter()
            .map(|s| format!("{} {} ({})", s.read_root(), s.suite, s.components.join(" ")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `public` (`https://snapshot.debian.org/archive/debian`) with the scheme, host and port
/// of `service`, under its path: `http://127.0.0.1:8080/snap` gives
/// `http://127.0.0.1:8080/snap/archive/debian`.
fn with_origin(public: &str, service: &Url) -> String {
    let path = Url::parse(public)
        .map(|url| url.path().to_string())
        .unwrap_or_default();
    format!(
        "{}/{}",
        service.as_str().trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

/// The distribution's archive keyring as Debian installs it (`debian-archive-keyring`,
/// `ubuntu-keyring`).
pub fn default_keyring(distro: &str) -> PathBuf {
    match distro {
        "ubuntu" => PathBuf::from("/usr/share/keyrings/ubuntu-archive-keyring.gpg"),
        _ => PathBuf::from("/usr/share/keyrings/debian-archive-keyring.gpg"),
    }
}

/// The package that installs `default_keyring(distro)`, for hints.
pub fn keyring_package(distro: &str) -> &'static str {
    match distro {
        "ubuntu" => "ubuntu-keyring",
        _ => "debian-archive-keyring",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_stable_reads_its_security_and_updates_suites() {
        let sources = AptSources::for_release("debian", "bookworm", "amd64", None, None);
        let list = sources.sources_list();
        assert!(list.contains("http://deb.debian.org/debian bookworm main"));
        assert!(list.contains("http://deb.debian.org/debian bookworm-updates main"));
        assert!(list.contains("http://security.debian.org/debian-security bookworm-security main"));
        assert!(list.contains("signed-by=/usr/share/keyrings/debian-archive-keyring.gpg"));
        let sid = AptSources::for_release("debian", "sid", "amd64", None, None);
        assert_eq!(sid.suites.len(), 1);
    }

    #[test]
    fn as_of_reads_the_snapshot_of_each_archive_and_records_the_archive() {
        let at: jiff::Timestamp = "2026-11-30T03:21:46Z".parse().unwrap();
        let debian = AptSources::for_release("debian", "bookworm", "amd64", None, None)
            .at_snapshot(at, None)
            .unwrap();
        let list = debian.sources_list();
        assert!(list.contains(
            "https://snapshot.debian.org/archive/debian/20261130T032146Z bookworm-updates main"
        ));
        assert!(list.contains(
            "https://snapshot.debian.org/archive/debian-security/20261130T032146Z bookworm-security main"
        ));
        assert_eq!(debian.suites[0].root, "http://deb.debian.org/debian");
        assert_eq!(debian.as_of, Some(at));
        let ubuntu = AptSources::for_release("ubuntu", "noble", "amd64", None, None)
            .at_snapshot(at, None)
            .unwrap();
        assert!(ubuntu.sources_list().contains(
            "https://snapshot.ubuntu.com/ubuntu/20261130T032146Z noble-security main universe"
        ));
        // A stand-in service keeps the public layout under its own origin.
        let service = Url::parse("http://127.0.0.1:8080/snap/").unwrap();
        let fixture = AptSources::for_release("ubuntu", "noble", "arm64", None, None)
            .at_snapshot(at, Some(&service))
            .unwrap();
        assert_eq!(
            fixture.suites[0].read_root(),
            "http://127.0.0.1:8080/snap/ubuntu-ports/20261130T032146Z"
        );
        assert_eq!(
            fixture.suites[0].snapshot.as_deref(),
            Some("https://snapshot.ubuntu.com/ubuntu-ports")
        );
        // A mirror has no public snapshot: it needs one named.
        let mirror = Url::parse("http://127.0.0.1:9/debian/").unwrap();
        let error = AptSources::for_release("debian", "bookworm", "amd64", Some(&mirror), None)
            .at_snapshot(at, None)
            .unwrap_err();
        assert!(error.to_string().contains("--apt-snapshot"), "{error}");
        let mirrored = AptSources::for_release("debian", "bookworm", "amd64", Some(&mirror), None)
            .at_snapshot(at, Some(&service))
            .unwrap();
        assert_eq!(
            mirrored.suites[2].read_root(),
            "http://127.0.0.1:8080/snap/20261130T032146Z"
        );
    }

    #[test]
    fn ubuntu_arm64_comes_from_ports_and_a_mirror_replaces_every_root() {
        let ports = AptSources::for_release("ubuntu", "noble", "arm64", None, None);
        assert!(ports
            .suites
            .iter()
            .all(|s| s.root.contains("ports.ubuntu.com")));
        let mirror = Url::parse("http://127.0.0.1:8080/debian/").unwrap();
        let keyring = PathBuf::from("/tmp/k.gpg");
        let internal = AptSources::for_release(
            "debian",
            "bookworm",
            "amd64",
            Some(&mirror),
            Some(keyring.clone()),
        );
        assert!(internal
            .suites
            .iter()
            .all(|s| s.root == "http://127.0.0.1:8080/debian" && s.snapshot.is_none()));
        assert_eq!(internal.keyring, keyring);
    }
}
