//! Git requirements: `name @ git+https://host/repo.git@v1.2#subdirectory=pkg` in a
//! requirements file.
//!
//! The reference (a branch, a tag, a commit, or none for the remote's HEAD) is resolved to a
//! commit when the recipe is locked ([`resolve`]); the lock records the commit and the
//! sha256 of the commit's tree as a canonical source archive ([`SourceTree::archive`]),
//! which `build` makes again from the commit and checks before it compiles it as it does an
//! sdist.
//!
//! git itself moves the bytes, as uv and cargo let it: the user's credential helpers and
//! SSH keys work. Nothing of the repository runs: the commit is fetched into a fresh bare
//! repository in a temporary directory and read with `git archive`, so no work tree is
//! checked out (no filters, hooks or LFS), and git may use the URL's own protocol only
//! (`GIT_ALLOW_PROTOCOL`), so a redirect or submodule to `ext::` or `file://` goes nowhere.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Component, Path};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use url::Url;

use super::source_tree::SourceTree;

/// The protocols a git requirement may use. `file://` is not one: a lock from a pull
/// request must not put a repository of the build host into the image.
pub const SCHEMES: &[&str] = &["https", "http", "ssh", "git"];

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("`{url}` is not a git requirement URL: {why}\n  hint: write `name @ git+https://host/owner/repo.git@TAG` (a branch, tag or commit after `@`; `#subdirectory=DIR` for a project below the top)")]
    Url { url: String, why: String },
    #[error("`git {what}` for `{url}` failed ({status}): {stderr}\n  hint: check that the repository and the reference exist and that git can reach them from here (credentials come from git's own helpers and SSH keys)")]
    Git {
        what: &'static str,
        url: String,
        status: String,
        stderr: String,
    },
    #[error("`git {what}` for `{url}` took longer than {seconds} s and was stopped\n  hint: check that the server answers; a slow one may have longer: CUDASTACK_GIT_TIMEOUT=SECONDS")]
    TimedOut {
        what: &'static str,
        url: String,
        seconds: u64,
    },
    #[error("could not run git for `{url}`: {source}\n  hint: install git (Debian: `apt-get install git`)")]
    Spawn {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the lock's commit {locked} of `{url}` is not what `{reference}` names now ({now}): {what}\n  hint: review the change upstream, then `cudastack lock --upgrade-package NAME` takes {now}")]
    NotOnReference {
        url: String,
        reference: String,
        locked: String,
        now: String,
        what: String,
    },
    #[error("`{url}` has no reference `{reference}` (no branch, tag or commit of that name)\n  hint: `git ls-remote {url}` lists what it has")]
    NoSuchReference { url: String, reference: String },
    #[error("the tree of `{url}` at {commit}{} is not a source tree cudastack builds: {why}", subdirectory.as_deref().map(|d| format!(" (subdirectory `{d}`)")).unwrap_or_default())]
    Tree {
        url: String,
        commit: String,
        subdirectory: Option<String>,
        why: String,
    },
}

/// Where a git requirement's source is: the repository, the reference, and the directory of
/// the project in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitSource {
    /// The repository's URL, without `git+`, the reference and the fragment.
    pub repository: Url,
    pub reference: Option<String>,
    /// `#subdirectory=DIR`: plain `/`-separated names.
    pub subdirectory: Option<String>,
}

impl GitSource {
    /// Parse `git+SCHEME://HOST/PATH[@REF][#subdirectory=DIR]`.
    pub fn parse(text: &str) -> Result<GitSource, GitError> {
        let error = |why: &str| GitError::Url {
            url: shown(text),
            why: why.to_string(),
        };
        let rest = text
            .strip_prefix("git+")
            .ok_or_else(|| error("it does not start with `git+`"))?;
        let (rest, fragment) = match rest.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (rest, None),
        };
        let mut repository =
            Url::parse(rest).map_err(|e| error(&format!("it is not a URL ({e})")))?;
        if !SCHEMES.contains(&repository.scheme()) {
            return Err(error(&format!(
                "git+{} is not a protocol cudastack fetches from (it fetches git+https, git+http, git+ssh and git+git)",
                repository.scheme()
            )));
        }
        if repository.password().is_some()
            || (!repository.username().is_empty() && repository.scheme() != "ssh")
        {
            return Err(error("it holds credentials, which would be written into the lock; give them to git's credential helper instead"));
        }
        if repository.query().is_some() {
            return Err(error("it has a query (`?...`)"));
        }
        let path = repository.path().to_string();
        let reference = match path.rsplit_once('@') {
            // What follows the last `@` (`release/2.x` may have slashes, as a branch may).
            Some((path, reference)) if !reference.is_empty() => {
                repository.set_path(path);
                Some(reference.to_string())
            }
            Some(_) => return Err(error("its `@` names no reference")),
            None => None,
        };
        if let Some(reference) = &reference {
            check_reference(reference).map_err(|why| error(&why))?;
        }
        let mut subdirectory = None;
        for pair in fragment.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("subdirectory", dir)) => {
                    check_subdirectory(dir).map_err(|why| error(&why))?;
                    subdirectory = Some(dir.trim_end_matches('/').to_string());
                }
                // pip's `#egg=name` says what the requirement's name already says.
                Some(("egg", _)) => {}
                _ => {
                    return Err(error(&format!(
                        "its fragment `{pair}` is not `subdirectory=DIR`"
                    )))
                }
            }
        }
        Ok(GitSource {
            repository,
            reference,
            subdirectory,
        })
    }

    /// This source at `commit`, as the lock records it.
    pub fn at(&self, commit: &Commit) -> GitSource {
        GitSource {
            reference: Some(commit.0.clone()),
            ..self.clone()
        }
    }

    /// The URL as a lock or a message writes it.
    pub fn to_url(&self) -> Url {
        Url::parse(&self.to_string()).expect("a git source is a URL")
    }

    /// The commit the reference names itself, when it is a full commit id.
    pub fn pinned_commit(&self) -> Option<Commit> {
        self.reference.as_deref().and_then(Commit::parse)
    }
}

impl fmt::Display for GitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "git+{}", self.repository)?;
        if let Some(reference) = &self.reference {
            write!(f, "@{reference}")?;
        }
        if let Some(dir) = &self.subdirectory {
            write!(f, "#subdirectory={dir}")?;
        }
        Ok(())
    }
}

/// `text` for a message: without the userinfo of its URL, and not at all when it is not
/// one (it may be a line of secrets).
fn shown(text: &str) -> String {
    let url = text.strip_prefix("git+").unwrap_or(text);
    match Url::parse(url) {
        Ok(mut url) => {
            let _ = url.set_password(None);
            let _ = url.set_username("");
            let prefix = if text.starts_with("git+") { "git+" } else { "" };
            format!("{prefix}{url}")
        }
        Err(_) => "the requirement's URL".to_string(),
    }
}

/// A reference goes on git's command line and into a URL: a name git accepts, never an
/// option.
fn check_reference(reference: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-+/".contains(c);
    let plain_parts = reference
        .split('/')
        .all(|part| !part.is_empty() && !part.starts_with(['-', '.']));
    if !plain_parts || reference.contains("..") || !reference.chars().all(allowed) {
        return Err(format!("its reference `{reference}` is not a plain branch, tag or commit name (letters, digits, `.`, `_`, `-`, `+`, and `/` between names)"));
    }
    Ok(())
}

fn check_subdirectory(dir: &str) -> Result<(), String> {
    let path = Path::new(dir);
    // Characters a URL's fragment keeps as they are, so the lock's URL names the same one.
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/".contains(c);
    let plain = !dir.is_empty()
        && dir.chars().all(allowed)
        && path.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(format!(
            "its subdirectory `{dir}` is not a relative path of plain names (letters, digits, `.`, `_`, `-`)"
        ));
    }
    Ok(())
}

/// A commit id: 40 (SHA-1) or 64 (SHA-256 repositories) lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Commit(String);

impl Commit {
    pub fn parse(text: &str) -> Option<Commit> {
        let hex = text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (hex && (text.len() == 40 || text.len() == 64)).then(|| Commit(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Commit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every attribute that changes what `git archive` writes, unset for every path.
const NO_ATTRIBUTES: &str =
    "* -text -eol -ident -filter -export-subst -export-ignore -working-tree-encoding\n";

/// git with only `source`'s protocol allowed, no prompt, and bounded stalls.
fn git(source: &GitSource) -> Command {
    let mut command = isolated_git();
    command
        .env("GIT_ALLOW_PROTOCOL", source.repository.scheme())
        .env("GIT_TERMINAL_PROMPT", "0")
        .args(["-c", "protocol.version=2", "-c", "core.autocrlf=false"])
        .args([
            "-c",
            "http.lowSpeedLimit=1000",
            "-c",
            "http.lowSpeedTime=120",
        ])
        .stdin(Stdio::null());
    command
}

/// git without the variables that would point it at another repository (run from a hook
/// or `rebase --exec`, git sets them) or add configuration, and without fsmonitor (a
/// program a repository's configuration may name).
pub(crate) fn isolated_git() -> Command {
    let mut command = Command::new("git");
    for variable in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
    ] {
        command.env_remove(variable);
    }
    command.args(["-c", "core.fsmonitor=false"]);
    command
}

fn run(source: &GitSource, what: &'static str, mut command: Command) -> Result<Vec<u8>, GitError> {
    let url = source.repository.to_string();
    let limit = time_limit();
    let (status, stdout, stderr) =
        run_bounded(&mut command, limit).map_err(|source| GitError::Spawn {
            url: url.clone(),
            source,
        })?;
    let Some(status) = status else {
        return Err(GitError::TimedOut {
            what,
            url,
            seconds: limit.as_secs(),
        });
    };
    if !status.success() {
        let stderr = String::from_utf8_lossy(&stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
        return Err(GitError::Git {
            what,
            url,
            status: status.to_string(),
            // A server's `remote:` lines are its words: no escape sequence reaches the
            // terminal.
            stderr: crate::printable::escape_keeping_lines(
                &tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            )
            .into_owned(),
        });
    }
    Ok(stdout)
}

/// How long one git command may take: `CUDASTACK_GIT_TIMEOUT` seconds, 600 by default (a
/// server that stops answering must not hold `lock` for ever; ssh and git:// have no
/// low-speed limit of their own).
fn time_limit() -> Duration {
    let seconds = std::env::var("CUDASTACK_GIT_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(600);
    Duration::from_secs(seconds)
}

/// Run `command` with a deadline, its output read on threads (at most [`MAX_OUTPUT`] each)
/// so a full pipe never blocks it: its status (None when it was killed at the deadline),
/// stdout and stderr.
fn run_bounded(
    command: &mut Command,
    limit: Duration,
) -> std::io::Result<(Option<std::process::ExitStatus>, Vec<u8>, Vec<u8>)> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let reader = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(stream) = stream {
                let _ = stream.take(MAX_OUTPUT).read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let stderr = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok((status, stdout, stderr))
}

/// The most of a git command's output kept: `ls-remote` of the few references asked for,
/// a fetch's messages.
const MAX_OUTPUT: u64 = 16 << 20;

/// The commit `source`'s reference names now (the remote's HEAD without one): a tag
/// before a branch of the same name, as git's own lookup; a full commit id as it is.
pub fn resolve(source: &GitSource) -> Result<Commit, GitError> {
    if let Some(commit) = source.pinned_commit() {
        return Ok(commit);
    }
    let reference = source.reference.as_deref().unwrap_or("HEAD");
    let mut command = git(source);
    // Only the references that can match (a pattern matches a name's tail); an annotated
    // tag's commit is its peeled entry, which a pattern names only with `^{}`.
    command
        .args(["ls-remote", "--"])
        .arg(source.repository.as_str())
        .arg(reference)
        .arg(format!("{reference}^{{}}"));
    let listing = run(source, "ls-remote", command)?;
    let listing = String::from_utf8_lossy(&listing);
    let refs: BTreeMap<&str, &str> = listing
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(id, name)| (name, id))
        .collect();
    let wanted = [
        format!("refs/tags/{reference}^{{}}"),
        format!("refs/tags/{reference}"),
        format!("refs/heads/{reference}"),
        reference.to_string(),
    ];
    wanted
        .iter()
        .find_map(|name| refs.get(name.as_str()).and_then(|id| Commit::parse(id)))
        .ok_or_else(|| GitError::NoSuchReference {
            url: source.repository.to_string(),
            reference: reference.to_string(),
        })
}

/// Check that `locked` (the commit a previous lock chose for `source`) is still what its
/// reference names: a tag that names another commit now was moved (by force: tags do not
/// move), and a branch must have `locked` in its history (else it was force-pushed, or the
/// lock was edited to a commit the branch never had). A full commit id, or a reference that
/// still names `locked`, passes without a fetch.
pub fn check_kept(source: &GitSource, locked: &Commit) -> Result<(), GitError> {
    if source.pinned_commit().is_some() {
        return Ok(());
    }
    let now = resolve(source)?;
    if now == *locked {
        return Ok(());
    }
    let reference = source.reference.clone().unwrap_or_else(|| "HEAD".into());
    let moved = |what: &str| GitError::NotOnReference {
        url: source.repository.to_string(),
        reference: reference.clone(),
        locked: locked.to_string(),
        now: now.to_string(),
        what: what.to_string(),
    };
    if is_tag(source, &reference)? {
        return Err(moved("the tag was moved"));
    }
    if !is_ancestor(source, locked, &now)? {
        return Err(moved(
            "the branch no longer has it (force-pushed), or the lock names a commit it never had",
        ));
    }
    Ok(())
}

/// Whether `reference` is one of the remote's tags.
fn is_tag(source: &GitSource, reference: &str) -> Result<bool, GitError> {
    let mut command = git(source);
    command
        .args(["ls-remote", "--tags", "--"])
        .arg(source.repository.as_str())
        .arg(format!("refs/tags/{reference}"));
    Ok(!run(source, "ls-remote", command)?.is_empty())
}

/// Whether `commit` is in the history of `tip` (fetched whole into a scratch repository).
fn is_ancestor(source: &GitSource, commit: &Commit, tip: &Commit) -> Result<bool, GitError> {
    let url = source.repository.to_string();
    let scratch = tempfile::tempdir().map_err(|e| GitError::Spawn {
        url: url.clone(),
        source: e,
    })?;
    let git_dir = format!("--git-dir={}", scratch.path().display());
    let mut init = git(source);
    init.args(["init", "--bare", "-q"]).arg(scratch.path());
    run(source, "init", init)?;
    let mut fetch = git(source);
    fetch
        .arg(&git_dir)
        .args(["fetch", "-q", "--no-tags", "--"])
        .arg(&url)
        .arg(tip.as_str());
    run(source, "fetch", fetch)?;
    let mut check = git(source);
    check
        .arg(&git_dir)
        .args(["merge-base", "--is-ancestor", "--"])
        .args([commit.as_str(), tip.as_str()]);
    // 0: an ancestor; 1: not; anything else (the commit is not in the history at all): not.
    Ok(check
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success()))
}

/// Fetch `commit` of `source` and read its tree (the subdirectory's when the URL names one).
pub fn fetch_tree(source: &GitSource, commit: &Commit) -> Result<SourceTree, GitError> {
    let url = source.repository.to_string();
    let scratch = tempfile::tempdir().map_err(|e| GitError::Spawn {
        url: url.clone(),
        source: e,
    })?;
    let repo = scratch.path();
    let mut init = git(source);
    init.args(["init", "--bare", "-q"]);
    if commit.as_str().len() == 64 {
        init.arg("--object-format=sha256");
    }
    init.arg(repo);
    run(source, "init", init)?;
    // `git archive` applies the tree's own attributes and the user's filters (export-subst
    // text differs between shallow and full fetches; an LFS or crypt filter would run a
    // program): this repository's attributes, which come first, turn every one off, so the
    // archive is the committed bytes.
    std::fs::write(repo.join("info/attributes"), NO_ATTRIBUTES).map_err(|e| GitError::Spawn {
        url: url.clone(),
        source: e,
    })?;
    let fetch = |args: &[&str]| {
        let mut command = git(source);
        command
            .arg(format!("--git-dir={}", repo.display()))
            .args(["fetch", "-q", "--no-tags"])
            .args(args)
            .arg("--")
            .arg(&url);
        command
    };
    // A commit by its id (protocol v2 serves any reachable one); else every branch and
    // tag, for a server that serves only what it advertises.
    let mut by_id = fetch(&["--depth", "1"]);
    by_id.arg(commit.as_str());
    if run(source, "fetch", by_id).is_err() {
        let mut all = fetch(&[]);
        all.args(["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]);
        run(source, "fetch", all)?;
    }
    let mut verify = git(source);
    verify
        .arg(format!("--git-dir={}", repo.display()))
        .args(["cat-file", "-t", "--"])
        .arg(commit.as_str());
    let kind = run(source, "cat-file", verify).map_err(|_| GitError::NoSuchReference {
        url: url.clone(),
        reference: commit.to_string(),
    })?;
    if String::from_utf8_lossy(&kind).trim() != "commit" {
        return Err(GitError::NoSuchReference {
            url,
            reference: commit.to_string(),
        });
    }
    let tree_ish = match &source.subdirectory {
        Some(dir) => format!("{commit}:{dir}"),
        None => commit.to_string(),
    };
    let mut archive = git(source);
    archive
        .arg(format!("--git-dir={}", repo.display()))
        .args(["archive", "--format=tar", "--"])
        .arg(&tree_ish)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = archive.spawn().map_err(|e| GitError::Spawn {
        url: url.clone(),
        source: e,
    })?;
    let stdout = child.stdout.take().expect("piped");
    let read = SourceTree::read_tar(stdout);
    // The tree may have been refused part way: git is stopped rather than waited on.
    if read.is_err() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().map_err(|e| GitError::Spawn {
        url: url.clone(),
        source: e,
    })?;
    let tree_error = |why: String| GitError::Tree {
        url: url.clone(),
        commit: commit.to_string(),
        subdirectory: source.subdirectory.clone(),
        why,
    };
    let tree = read.map_err(tree_error)?;
    if !output.status.success() {
        return Err(tree_error(format!(
            "`git archive` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_repository_reference_and_subdirectory() {
        let source =
            GitSource::parse("git+https://example.org/team/lib.git@v1.2#subdirectory=py/lib")
                .unwrap();
        assert_eq!(
            source.repository.as_str(),
            "https://example.org/team/lib.git"
        );
        assert_eq!(source.reference.as_deref(), Some("v1.2"));
        assert_eq!(source.subdirectory.as_deref(), Some("py/lib"));
        assert_eq!(
            source.to_string(),
            "git+https://example.org/team/lib.git@v1.2#subdirectory=py/lib"
        );
        let commit = Commit::parse(&"a".repeat(40)).unwrap();
        assert_eq!(source.at(&commit).pinned_commit(), Some(commit));
        let branch = GitSource::parse("git+https://example.org/lib@release/2.x").unwrap();
        assert_eq!(branch.reference.as_deref(), Some("release/2.x"));
        let plain = GitSource::parse("git+ssh://git@example.org/lib#egg=lib").unwrap();
        assert_eq!(plain.reference, None);
        assert_eq!(plain.to_string(), "git+ssh://git@example.org/lib");
    }

    /// A git that stops answering is killed at the deadline (a server that never answers
    /// is the same for it); one that finishes gives its output.
    #[test]
    fn a_command_past_its_deadline_is_stopped() {
        let started = Instant::now();
        let mut sleeper = Command::new("sleep");
        sleeper.arg("30");
        let (status, _, _) = run_bounded(&mut sleeper, Duration::from_millis(200)).unwrap();
        assert!(status.is_none());
        assert!(started.elapsed() < Duration::from_secs(10));
        let mut echo = Command::new("echo");
        echo.arg("done");
        let (status, stdout, _) = run_bounded(&mut echo, Duration::from_secs(30)).unwrap();
        assert!(status.unwrap().success());
        assert_eq!(stdout, b"done\n");
    }

    #[test]
    fn hostile_urls_are_refused_without_their_secrets() {
        for (url, why) in [
            ("https://example.org/lib", "does not start with `git+`"),
            ("git+file:///etc/lib", "not a protocol"),
            ("git+ext::sh -c touch% /tmp/x", "not a protocol"),
            ("git+https://u:SECRET@example.org/lib", "credentials"),
            ("git+https://TOKEN@example.org/lib", "credentials"),
            (
                "git+https://example.org/lib@--upload-pack=x",
                "not a plain branch",
            ),
            ("git+https://example.org/lib@", "names no reference"),
            ("git+https://example.org/lib@a//b", "not a plain branch"),
            (
                "git+https://example.org/lib#subdirectory=a b",
                "plain names",
            ),
            (
                "git+https://example.org/lib#subdirectory=../x",
                "not a relative path",
            ),
            (
                "git+https://example.org/lib#subdirectory=/etc",
                "not a relative path",
            ),
            (
                "git+https://example.org/lib#foo=bar",
                "is not `subdirectory=DIR`",
            ),
        ] {
            let error = GitSource::parse(url).unwrap_err().to_string();
            assert!(error.contains(why), "{url}: {error}");
            assert!(
                !error.contains("SECRET") && !error.contains("TOKEN"),
                "{error}"
            );
        }
    }
}
