//! The git commit a recipe was built from, for the provenance: when the recipe's directory
//! is in a git checkout, its remote's URL, the branch and the commit of HEAD.
//!
//! Read from the files of `.git` alone, never by running `git`: a checkout is the team's
//! input (a pull request's), and git runs what its config names (`core.fsmonitor`, hooks)
//! for some commands. A remote URL's user and password (a token in
//! `https://user:token@host/...`) are left out: the provenance is published.

use std::path::{Path, PathBuf};

/// Where the recipe came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitSource {
    /// The `origin` remote's URL without credentials; None without an `origin`.
    pub repository: Option<String>,
    /// `refs/heads/main`; None for a detached HEAD.
    pub reference: Option<String>,
    /// The commit of HEAD (40 or 64 hex digits).
    pub commit: String,
    /// The recipe's path inside the checkout (`recipes/train.yaml`).
    pub path: String,
}

impl GitSource {
    /// The source of the recipe file `recipe`, if it lies in a git checkout whose HEAD
    /// names a commit. Anything unreadable or odd gives None: the provenance then says
    /// nothing of a source rather than something wrong.
    pub fn of(recipe: &Path) -> Option<GitSource> {
        let recipe = std::fs::canonicalize(recipe).ok()?;
        let (top, git_dir) = find_git_dir(recipe.parent()?)?;
        let common = common_dir(&git_dir);
        let head = read_small(&git_dir.join("HEAD"))?;
        let head = head.trim();
        let (reference, commit) = match head.strip_prefix("ref:") {
            Some(name) => {
                let name = name.trim().to_string();
                let commit = resolve_ref(&git_dir, &common, &name)?;
                (Some(name), commit)
            }
            None => (None, head.to_string()),
        };
        if !is_commit(&commit) {
            return None;
        }
        Some(GitSource {
            repository: origin_url(&common),
            reference,
            commit,
            path: recipe
                .strip_prefix(&top)
                .ok()?
                .to_string_lossy()
                .into_owned(),
        })
    }
}

/// The checkout's top directory and its git directory, from `dir` upwards: `.git` a
/// directory, or a file `gitdir: PATH` (a worktree, a submodule).
fn find_git_dir(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    for top in dir.ancestors() {
        let dot_git = top.join(".git");
        let Ok(meta) = std::fs::symlink_metadata(&dot_git) else {
            continue;
        };
        if meta.is_dir() {
            return Some((top.to_path_buf(), dot_git));
        }
        let text = read_small(&dot_git)?;
        let target = text.trim().strip_prefix("gitdir:")?.trim();
        return Some((top.to_path_buf(), top.join(target)));
    }
    None
}

/// A worktree's refs and config live in the main git directory (`commondir`).
fn common_dir(git_dir: &Path) -> PathBuf {
    match read_small(&git_dir.join("commondir")) {
        Some(text) => git_dir.join(text.trim()),
        None => git_dir.to_path_buf(),
    }
}

/// The commit `name` (`refs/heads/main`) points at: its loose file, else `packed-refs`.
fn resolve_ref(git_dir: &Path, common: &Path, name: &str) -> Option<String> {
    if !name.starts_with("refs/") || name.split('/').any(|part| part == ".." || part.is_empty()) {
        return None;
    }
    for dir in [git_dir, common] {
        if let Some(text) = read_small(&dir.join(name)) {
            return Some(text.trim().to_string());
        }
    }
    let packed = read_small(&common.join("packed-refs"))?;
    packed.lines().find_map(|line| {
        let (commit, reference) = line.split_once(' ')?;
        (reference.trim() == name).then(|| commit.to_string())
    })
}

/// `url` of `[remote "origin"]` in the config, without user and password.
fn origin_url(common: &Path) -> Option<String> {
    let config = read_small(&common.join("config"))?;
    let mut in_origin = false;
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_origin = line.replace(char::is_whitespace, "") == "[remote\"origin\"]";
            continue;
        }
        if !in_origin {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            if key.trim() == "url" {
                return Some(without_credentials(value.trim()));
            }
        }
    }
    None
}

/// `https://user:token@host/path` -> `https://host/path`; other forms (`git@host:path`, a
/// path) as they are.
fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if path.is_empty() && !rest.contains('/') {
        format!("{scheme}://{host}")
    } else {
        format!("{scheme}://{host}/{path}")
    }
}

fn is_commit(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A small file of `.git` (HEAD, a ref, the config): None when missing or over 1 MiB.
fn read_small(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 1 << 20 {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A checkout laid out by hand: a branch in packed-refs, a remote URL with a token.
    #[test]
    fn a_checkouts_remote_branch_and_commit_without_credentials() {
        let top = tempfile::tempdir().unwrap();
        let top = top.path().canonicalize().unwrap();
        write(&top.join("recipes/train.yaml"), "name: x\n");
        write(&top.join(".git/HEAD"), "ref: refs/heads/main\n");
        write(
            &top.join(".git/packed-refs"),
            &format!("# pack-refs with: peeled\n{COMMIT} refs/heads/main\n"),
        );
        write(
            &top.join(".git/config"),
            "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://ci:ghp_secret@github.com/acme/train.git\n",
        );
        let source = GitSource::of(&top.join("recipes/train.yaml")).unwrap();
        assert_eq!(
            source,
            GitSource {
                repository: Some("https://github.com/acme/train.git".into()),
                reference: Some("refs/heads/main".into()),
                commit: COMMIT.into(),
                path: "recipes/train.yaml".into(),
            }
        );
        // A detached HEAD names the commit alone; a HEAD that is not a commit, nothing.
        write(&top.join(".git/HEAD"), &format!("{COMMIT}\n"));
        let detached = GitSource::of(&top.join("recipes/train.yaml")).unwrap();
        assert_eq!((detached.reference, detached.commit), (None, COMMIT.into()));
        write(
            &top.join(".git/HEAD"),
            "ref: refs/heads/../../../etc/passwd\n",
        );
        assert_eq!(GitSource::of(&top.join("recipes/train.yaml")), None);
    }

    /// What `git` itself writes: a real repository with one commit.
    #[test]
    fn a_real_git_checkout() {
        let top = tempfile::tempdir().unwrap();
        let top = top.path().canonicalize().unwrap();
        write(&top.join("train.yaml"), "name: x\n");
        let git = |args: &[&str]| {
            let status = std::process::Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .current_dir(&top)
                .status()
                .expect("git is installed");
            assert!(status.success(), "git {args:?}");
        };
        git(&["init", "-q"]);
        git(&[
            "remote",
            "add",
            "origin",
            "https://example.com/team/train.git",
        ]);
        git(&["add", "train.yaml"]);
        git(&["commit", "-q", "-m", "recipe"]);
        let head = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&top)
            .output()
            .unwrap();
        let head = String::from_utf8(head.stdout).unwrap().trim().to_string();
        let source = GitSource::of(&top.join("train.yaml")).unwrap();
        assert_eq!(source.commit, head);
        assert_eq!(source.reference.as_deref(), Some("refs/heads/main"));
        assert_eq!(
            source.repository.as_deref(),
            Some("https://example.com/team/train.git")
        );
        assert_eq!(source.path, "train.yaml");
        // Outside any checkout: nothing.
        let elsewhere = tempfile::tempdir().unwrap();
        write(&elsewhere.path().join("r.yaml"), "name: x\n");
        assert_eq!(GitSource::of(&elsewhere.path().join("r.yaml")), None);
    }
}
