//! What moved between two locks, package by package: what `lock` prints after a relock,
//! what `lock --json` reports (`deb_changes`, `wheel_changes`), and what the relock
//! workflow puts in its pull request and `lock --check` fails on.

use std::collections::BTreeMap;

use crate::digest::Digest;
use crate::lock::lockfile::{ArtifactKind, Lockfile};

/// One package added, removed, moved to another version, or given another file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PackageChange {
    pub name: String,
    /// None: added.
    pub old: Option<String>,
    /// None: removed.
    pub new: Option<String>,
}

impl std::fmt::Display for PackageChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.old, &self.new) {
            (Some(old), Some(new)) if old == new => {
                write!(f, "{} {old} (another file)", self.name)
            }
            (Some(old), Some(new)) => write!(f, "{} {old} -> {new}", self.name),
            (None, Some(new)) => write!(f, "{} (new) {new}", self.name),
            (Some(old), None) => write!(f, "{} {old} (removed)", self.name),
            (None, None) => write!(f, "{}", self.name),
        }
    }
}

/// What changed in the artifacts whose kind is `of` from `old` to `new`, in name order. A package
/// whose version stayed but whose files did (a new build uploaded, a re-signed .deb) is a
/// change too: its old and new versions are the same. A git requirement's version carries
/// its commit (`0.3.0 @ 350396271ecb`).
pub fn changes(
    old: Option<&Lockfile>,
    new: &Lockfile,
    of: fn(ArtifactKind) -> bool,
) -> Vec<PackageChange> {
    type Files = BTreeMap<String, (String, Vec<Digest>)>;
    let files = |lock: &Lockfile| -> Files {
        let mut files: Files = BTreeMap::new();
        for artifact in lock.artifacts.iter().filter(|a| of(a.kind)) {
            // A git requirement moves by commit, often at the same version: say which.
            let version = match artifact.git_commit() {
                Ok((_, commit)) if artifact.is_git() => {
                    format!("{} @ {}", artifact.version, &commit.as_str()[..12])
                }
                _ => artifact.version.clone(),
            };
            let entry = files
                .entry(artifact.name.clone())
                .or_insert_with(|| (version, Vec::new()));
            entry.1.push(artifact.sha256);
        }
        for (_, digests) in files.values_mut() {
            digests.sort();
        }
        files
    };
    let before = old.map(files).unwrap_or_default();
    let after = files(new);
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .map(|name| PackageChange {
            name: name.clone(),
            old: before.get(name).map(|(version, _)| version.clone()),
            new: after.get(name).map(|(version, _)| version.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::lockfile::tests::sample;

    #[test]
    fn versions_files_additions_and_removals_are_changes() {
        let old = sample();
        let mut new = old.clone();
        assert!(changes(Some(&old), &new, ArtifactKind::is_python).is_empty());
        let wheel = new
            .artifacts
            .iter_mut()
            .find(|a| a.kind == ArtifactKind::Wheel)
            .unwrap();
        let name = wheel.name.clone();
        let version = wheel.version.clone();
        wheel.sha256 = Digest::of_bytes(b"another build");
        let moved = changes(Some(&old), &new, ArtifactKind::is_python);
        assert_eq!(moved.len(), 1);
        assert_eq!(
            moved[0].to_string(),
            format!("{name} {version} (another file)")
        );
        new.artifacts.retain(|a| a.name != name);
        let removed = changes(Some(&old), &new, ArtifactKind::is_python);
        assert_eq!(removed[0].new, None);
        let added = changes(None, &old, ArtifactKind::is_python);
        assert!(added.iter().all(|c| c.old.is_none() && c.new.is_some()));
        assert!(changes(Some(&old), &new, ArtifactKind::is_deb).is_empty());
    }
}
