//! apt-get as the current user against a throwaway root, as the lock runs it (issue 18).
//!
//! Everything apt reads or writes lives under the root: its sources, lists, cache and an
//! empty dpkg status (so every package resolves as not installed). No trusted keyrings
//! besides the `signed-by=` of the sources line: a signature only a key of the host
//! accepts does not verify. `Debug::NoLocking` because the root is private to one test;
//! the sandbox user is the caller, so apt does not need root to drop privileges.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{command_error, output, run, FixtureError, Result};

/// A .deb as `apt-get --print-uris` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrintedUri {
    pub url: String,
    /// The file name apt would save it as (an epoch's colon written `%3a`).
    pub file_name: String,
    pub size: u64,
    /// As apt prints it, `KIND:HEX` (empty when the index has no such hash): `download` prints `SHA256:`, `install` still prints
    /// `MD5Sum:` (apt 2.6), so a lock must take the SHA256 from the index, not from here.
    pub hash: String,
}

impl PrintedUri {
    /// The lower-case hex SHA256 when apt printed one.
    pub fn sha256(&self) -> Option<String> {
        self.hash
            .strip_prefix("SHA256:")
            .map(str::to_ascii_lowercase)
    }
}

pub struct AptRoot {
    dir: PathBuf,
    architecture: String,
}

impl AptRoot {
    /// Create (or reuse) the root at `dir` for `architecture` with these sources lines.
    pub fn create(dir: &Path, architecture: &str, sources: &[String]) -> Result<Self> {
        for sub in [
            "etc/apt/sources.list.d",
            "etc/apt/preferences.d",
            "etc/apt/apt.conf.d",
            "etc/apt/trusted.gpg.d",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
            "var/lib/dpkg",
        ] {
            fs_err::create_dir_all(dir.join(sub))?;
        }
        let status = dir.join("var/lib/dpkg/status");
        if !status.exists() {
            fs_err::write(&status, "")?;
        }
        fs_err::write(dir.join("etc/apt/sources.list"), sources.join("\n") + "\n")?;
        Ok(Self {
            dir: dir.to_path_buf(),
            architecture: architecture.to_string(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `-o` options that confine apt to the root.
    pub fn options(&self) -> Vec<String> {
        let user = whoami();
        let dir = self.dir.display();
        vec![
            format!("Dir={dir}"),
            format!("Dir::State::status={dir}/var/lib/dpkg/status"),
            "Dir::Etc::TrustedParts=/nonexistent".to_string(),
            "Dir::Etc::Trusted=/nonexistent".to_string(),
            format!("APT::Architecture={}", self.architecture),
            format!("APT::Architectures::={}", self.architecture),
            "Debug::NoLocking=1".to_string(),
            format!("APT::Sandbox::User={user}"),
            // Only what a lock needs: no translations or AppStream metadata.
            "Acquire::Languages=none".to_string(),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_string(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_string(),
            "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".to_string(),
            "Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false".to_string(),
        ]
    }

    /// `program` (`apt-get`, `apt-cache`) with the root's options, ready for arguments.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for option in self.options() {
            command.arg("-o").arg(option);
        }
        command
    }

    /// `apt-get update`, whatever its result (for tests that expect it to fail).
    pub fn try_update(&self) -> Result<Output> {
        output(self.command("apt-get").arg("update"))
    }

    /// `apt-get update` that must succeed without an error or warning: apt reports a
    /// missing signature or a failed index as `W:` or `E:` and sometimes still exits 0.
    pub fn update(&self) -> Result<Output> {
        let mut command = self.command("apt-get");
        command.arg("update");
        let result = output(&mut command)?;
        let stderr = String::from_utf8_lossy(&result.stderr);
        let complained = stderr
            .lines()
            .any(|l| l.starts_with("E:") || l.starts_with("W:"));
        if !result.status.success() || complained {
            return Err(command_error(&command, &result));
        }
        Ok(result)
    }

    /// The candidate version of `package` (`apt-cache policy`), None when apt has none.
    pub fn candidate(&self, package: &str) -> Result<Option<String>> {
        let result = run(self.command("apt-cache").args(["policy", package]))?;
        let text = String::from_utf8_lossy(&result.stdout);
        let candidate = text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("Candidate:")
                .map(|v| v.trim().to_string())
        });
        Ok(candidate.filter(|v| v != "(none)"))
    }

    /// The .debs `apt-get install` would fetch for `packages` and their dependencies (the
    /// closure over an empty system), as apt resolves them.
    pub fn resolve(&self, packages: &[&str]) -> Result<Vec<PrintedUri>> {
        let result = run(self
            .command("apt-get")
            .args(["install", "--print-uris", "-qq", "-y"])
            .args(packages))?;
        parse_print_uris(&String::from_utf8_lossy(&result.stdout))
    }

    /// Download `packages` and their dependencies into `dest` (apt checks every hash and
    /// keeps files already there).
    pub fn download_closure(&self, packages: &[&str], dest: &Path) -> Result<()> {
        fs_err::create_dir_all(dest.join("partial"))?;
        run(self
            .command("apt-get")
            .arg("-o")
            .arg(format!("Dir::Cache::Archives={}", dest.display()))
            .args(["install", "--download-only", "-q", "-y"])
            .args(packages))?;
        Ok(())
    }

    /// Download exactly `packages` (`apt-get download`, no dependencies) into `dest`.
    pub fn download(&self, packages: &[&str], dest: &Path) -> Result<Vec<PrintedUri>> {
        fs_err::create_dir_all(dest)?;
        let printed = run(self
            .command("apt-get")
            .args(["download", "--print-uris", "-qq"])
            .args(packages))?;
        let uris = parse_print_uris(&String::from_utf8_lossy(&printed.stdout))?;
        run(self
            .command("apt-get")
            .current_dir(dest)
            .args(["download", "-q"])
            .args(packages))?;
        Ok(uris)
    }
}

/// Lines `'URL' FILE SIZE KIND:HEX`, the hash possibly missing.
pub fn parse_print_uris(text: &str) -> Result<Vec<PrintedUri>> {
    let mut uris = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('\'')) {
        let bad = || FixtureError::Invalid(format!("unexpected --print-uris line: {line}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        // The hash is absent when the index carries none of the kind apt prints.
        let [url, file_name, size, rest @ ..] = words.as_slice() else {
            return Err(bad());
        };
        let hash = rest.first().copied().unwrap_or_default();
        uris.push(PrintedUri {
            url: url.trim_matches('\'').to_string(),
            file_name: file_name.to_string(),
            size: size.parse().map_err(|_| bad())?,
            hash: hash.to_string(),
        });
    }
    Ok(uris)
}

fn whoami() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "root".to_string())
}
