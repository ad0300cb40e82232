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
}

/// Everything apt reads at lock time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSources {
    pub suites: Vec<ArchiveSuite>,
    /// The keyring the archives are signed with (`signed-by=`); no other key is trusted.
    pub keyring: PathBuf,
    /// The Debian architecture resolved for (`amd64`, `arm64`).
    pub architecture: String,
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
        }
    }

    /// The `sources.list` apt reads: each suite `signed-by` the keyring, nothing else trusted.
    pub fn sources_list(&self) -> String {
        let mut text = String::new();
        for suite in &self.suites {
            text.push_str(&format!(
                "deb [signed-by={} arch={}] {} {} {}\n",
                self.keyring.display(),
                self.architecture,
                suite.root,
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
            .map(|s| format!("{} {} ({})", s.root, s.suite, s.components.join(" ")))
            .collect::<Vec<_>>()
            .join(", ")
    }
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
