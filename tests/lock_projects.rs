//! Projects built from source that are not on an index, locked against real sources: git
//! requirements (`name @ git+git://127.0.0.1:PORT/repo.git@main`) against a real `git
//! daemon` serving repositories made here, and local projects (`./libs/teamlib`, `-e .`)
//! from directories beside the recipe; their dependencies and build requirements from a
//! fixture PEP 503 index. What is pinned (the commit a branch names, the sha256 of the
//! tree's canonical archive), a branch that moves and a lock that keeps its commit until it
//! is upgraded, and projects the lock cannot read without running their build.

use crate::fetch_support::{sha256_hex, wheel_bytes, FixtureServer};
use crate::gate;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::str::FromStr;
use std::time::{Duration, Instant};

use cudastack::fetch::git::{Commit, GitSource};
use cudastack::fetch::http::HttpClient;
use cudastack::fetch::source_tree::SourceTree;
use cudastack::lock::python_inputs::{LocalProject, Origin};
use cudastack::lock::sdist::BuildRequest;
use cudastack::lock::{resolve_with_builds, ArtifactKind, LockError, Lockfile, Target};
use cudastack::platform::Platform;
use pep508_rs::Requirement;

/// A `git daemon` serving the repositories under its base directory, stopped when dropped.
pub(crate) struct GitDaemon {
    base: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl GitDaemon {
    pub(crate) fn start() -> Option<GitDaemon> {
        if Command::new("git").arg("--version").output().is_err() {
            gate::skip("git", "git is not installed (Debian: apt-get install git)");
            return None;
        }
        let base = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // git-daemon itself, not `git daemon`: the wrapper forks it, and killing the
        // wrapper would leave the daemon serving.
        let exec_path = git(Path::new("."), &["--exec-path"]);
        let child = Command::new(Path::new(&exec_path).join("git-daemon"))
            .args(["--export-all", "--reuseaddr", "--listen=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.path().display()))
            .arg(base.path())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let daemon = GitDaemon { base, port, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "git daemon did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(daemon)
    }

    /// A new repository `name` with `files` committed on `main`.
    pub(crate) fn repository(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.base.path().join(name);
        git(self.base.path(), &["init", "-q", "-b", "main", name]);
        commit(&dir, files, "first");
        dir
    }

    pub(crate) fn url(&self, name: &str, reference: &str) -> String {
        format!("git+git://127.0.0.1:{}/{name}@{reference}", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Write `files` and commit them: the new commit id.
pub(crate) fn commit(dir: &Path, files: &[(&str, &str)], message: &str) -> String {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", message]);
    git(dir, &["rev-parse", "HEAD"])
}

pub(crate) const PYPROJECT: &str = r#"[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "teamlib"
version = "0.3.0"
requires-python = ">=3.9"
dependencies = ["dep>=1.0"]

[project.optional-dependencies]
extra = ["extradep; python_version >= '3.8'"]
"#;

/// A fixture index with the project's dependencies and the builder's wheels.
fn index() -> (FixtureServer, HttpClient) {
    let server = FixtureServer::start();
    for (name, version) in [
        ("dep", "1.2"),
        ("extradep", "2.0"),
        ("setuptools", "75.1.0"),
        ("wheel", "0.44.0"),
    ] {
        let (bytes, _) = wheel_bytes(name, version, &[]);
        let file = format!("{}-{version}-py3-none-any.whl", name.replace('-', "_"));
        let href = format!("/files/{file}");
        server.add_bytes(&href, "application/octet-stream", bytes.clone());
        let html = format!(
            "<!DOCTYPE html><html><body><a href=\"{href}#sha256={}\">{file}</a></body></html>",
            sha256_hex(&bytes)
        );
        server.add_bytes(&format!("/simple/{name}/"), "text/html", html.into_bytes());
    }
    (server, HttpClient::with_defaults().unwrap())
}

fn builds(keep: BTreeMap<String, Commit>) -> BuildRequest {
    BuildRequest {
        builds: vec![],
        toolchain: vec![Requirement::from_str("wheel").unwrap()],
        git_commits: keep,
        ..Default::default()
    }
}

/// Lock `requirement` (one line) keeping the commits in `keep`.
async fn lock(
    client: &HttpClient,
    server: &FixtureServer,
    requirement: &str,
    keep: BTreeMap<String, Commit>,
) -> Result<Lockfile, LockError> {
    let request = crate::source_build::request(client, server, &[requirement]);
    resolve_with_builds(client, &request, &builds(keep)).await
}

fn kinds(lock: &Lockfile) -> BTreeMap<String, (ArtifactKind, String)> {
    lock.artifacts
        .iter()
        .map(|a| (a.name.clone(), (a.kind, a.version.clone())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_requirement_locks_by_commit_and_keeps_it_until_upgraded() {
    let Some(daemon) = GitDaemon::start() else {
        return;
    };
    let repo = daemon.repository(
        "teamlib.git",
        &[
            ("pyproject.toml", PYPROJECT),
            ("src/teamlib/__init__.py", "VALUE = 1\n"),
        ],
    );
    let first = git(&repo, &["rev-parse", "HEAD"]);
    let (server, client) = index();
    let written = daemon.url("teamlib.git", "main");
    let requirement = format!("teamlib[extra] @ {written}");
    let locked = lock(&client, &server, &requirement, BTreeMap::new())
        .await
        .unwrap();
    let teamlib = locked.artifact("teamlib").unwrap();
    assert_eq!(teamlib.kind, ArtifactKind::Sdist);
    assert_eq!(teamlib.version, "0.3.0");
    assert_eq!(&*teamlib.filename, "teamlib-0.3.0.tar");
    assert_eq!(teamlib.source, written);
    assert_eq!(
        teamlib.url.to_string(),
        daemon.url("teamlib.git", &first),
        "the lock names the commit, not the branch"
    );
    // The sha256 is that of the commit's tree as cudastack archives it, made again here.
    let (pinned, commit_locked) = teamlib.git_commit().unwrap();
    assert_eq!(commit_locked.as_str(), first);
    let tree = cudastack::fetch::git::fetch_tree(&pinned, &commit_locked).unwrap();
    assert_eq!(teamlib.sha256, tree.archive_digest("teamlib-0.3.0"));
    // Its dependencies (the extra's too) are locked from the index; what its build needs
    // (pyproject's `[build-system] requires` and the toolchain) as build wheels.
    let kinds = kinds(&locked);
    assert_eq!(kinds["dep"], (ArtifactKind::Wheel, "1.2".into()));
    assert_eq!(kinds["extradep"], (ArtifactKind::Wheel, "2.0".into()));
    assert_eq!(
        kinds["setuptools"],
        (ArtifactKind::BuildWheel, "75.1.0".into())
    );
    assert_eq!(kinds["wheel"], (ArtifactKind::BuildWheel, "0.44.0".into()));
    // What `lock` writes, a lock read from disk accepts.
    let read = Lockfile::from_json(&locked.to_json(), Path::new("lock.json")).unwrap();
    assert_eq!(read.artifact("teamlib").unwrap().sha256, teamlib.sha256);

    // The branch moves upstream: a lock that keeps the previous commit does not move...
    let second = commit(
        &repo,
        &[("src/teamlib/__init__.py", "VALUE = 2\n")],
        "second",
    );
    let keep = BTreeMap::from([(written.clone(), commit_locked.clone())]);
    let kept = lock(&client, &server, &requirement, keep).await.unwrap();
    assert_eq!(kept.artifact("teamlib").unwrap().url, teamlib.url);
    assert_eq!(kept.artifact("teamlib").unwrap().sha256, teamlib.sha256);
    // ...and an upgrade takes the branch's new commit, with its new tree.
    let moved = lock(&client, &server, &requirement, BTreeMap::new())
        .await
        .unwrap();
    let moved = moved.artifact("teamlib").unwrap();
    assert_eq!(moved.url.to_string(), daemon.url("teamlib.git", &second));
    assert_ne!(moved.sha256, teamlib.sha256);

    // A tag names its commit, a tag that was moved by force too (at lock time).
    // An annotated tag: its commit is the peeled entry the server lists.
    git(&repo, &["tag", "-a", "-m", "release", "v0.3.0", &first]);
    let tagged = GitSource::parse(&daemon.url("teamlib.git", "v0.3.0")).unwrap();
    assert_eq!(
        cudastack::fetch::git::resolve(&tagged).unwrap().as_str(),
        first
    );
    git(
        &repo,
        &["tag", "-f", "-a", "-m", "moved", "v0.3.0", &second],
    );
    assert_eq!(
        cudastack::fetch::git::resolve(&tagged).unwrap().as_str(),
        second
    );
    // A lock that kept the tag's first commit stops there, saying the tag moved.
    let at_tag = format!("teamlib @ {}", daemon.url("teamlib.git", "v0.3.0"));
    let keep = BTreeMap::from([(daemon.url("teamlib.git", "v0.3.0"), commit_locked.clone())]);
    let error = lock(&client, &server, &at_tag, keep)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("the tag was moved") && error.contains(&second),
        "{error}"
    );
    // A commit the branch never had (a lock edited in a pull request, or a force-push).
    git(&repo, &["checkout", "-q", "--orphan", "elsewhere"]);
    let stranger = commit(
        &repo,
        &[("src/teamlib/__init__.py", "VALUE = 666\n")],
        "stranger",
    );
    git(&repo, &["checkout", "-q", "main"]);
    let keep = BTreeMap::from([(written.clone(), Commit::parse(&stranger).unwrap())]);
    let error = lock(&client, &server, &requirement, keep)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("no longer has it"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_projects_the_lock_cannot_read_statically_are_refused_plainly() {
    let Some(daemon) = GitDaemon::start() else {
        return;
    };
    let (server, client) = index();
    let dynamic = PYPROJECT.replace("version = \"0.3.0\"", "dynamic = [\"version\"]");
    for (repo, files, requirement, expected) in [
        (
            "dynamic.git",
            vec![("pyproject.toml", dynamic.as_str())],
            "teamlib",
            "lists `version` in `[project] dynamic`",
        ),
        (
            "renamed.git",
            vec![("pyproject.toml", PYPROJECT)],
            "otherlib",
            "names the project `teamlib`",
        ),
        (
            "setup-py.git",
            vec![("setup.py", "from setuptools import setup\nsetup()\n")],
            "teamlib",
            "has no `pyproject.toml` at its top",
        ),
    ] {
        daemon.repository(repo, &files);
        let text = format!("{requirement} @ {}", daemon.url(repo, "main"));
        let error = lock(&client, &server, &text, BTreeMap::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{repo}: {error}");
        assert!(error.contains("hint:"), "{repo}: {error}");
    }
    // A reference the repository does not have.
    daemon.repository("teamlib.git", &[("pyproject.toml", PYPROJECT)]);
    let text = format!("teamlib @ {}", daemon.url("teamlib.git", "no-such-branch"));
    let error = lock(&client, &server, &text, BTreeMap::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("has no reference `no-such-branch`"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_project_locks_by_the_sha256_of_its_tree() {
    let recipe_dir = tempfile::tempdir().unwrap();
    let project = recipe_dir.path().join("libs/teamlib");
    for (path, text) in [
        ("pyproject.toml", PYPROJECT),
        ("src/teamlib/__init__.py", "VALUE = 1\n"),
        ("src/teamlib/__pycache__/x.pyc", "a cache, not source"),
    ] {
        std::fs::create_dir_all(project.join(path).parent().unwrap()).unwrap();
        std::fs::write(project.join(path), text).unwrap();
    }
    let (server, client) = index();
    let projects = vec![LocalProject {
        name: "teamlib".parse().unwrap(),
        path: "libs/teamlib".into(),
        origin: Origin::line("requirements.txt", 1),
    }];
    let request_of = || BuildRequest {
        toolchain: vec![Requirement::from_str("wheel").unwrap()],
        projects: projects.clone(),
        recipe_dir: recipe_dir.path().to_path_buf(),
        ..Default::default()
    };
    let locked = resolve_with_builds(
        &client,
        &crate::source_build::request(&client, &server, &["teamlib"]),
        &request_of(),
    )
    .await
    .unwrap();
    let teamlib = locked.artifact("teamlib").unwrap();
    assert_eq!(teamlib.kind, ArtifactKind::Sdist);
    assert_eq!(teamlib.url.to_string(), "file:libs/teamlib");
    assert_eq!(&*teamlib.filename, "teamlib-0.3.0.tar");
    let tree = SourceTree::read_dir(&project).unwrap();
    assert_eq!(teamlib.sha256, tree.archive_digest("teamlib-0.3.0"));
    assert_eq!(kinds(&locked)["dep"], (ArtifactKind::Wheel, "1.2".into()));
    // The lock reads back (a recipe-relative project is allowed; a wheel's name is not).
    let read = Lockfile::from_json(&locked.to_json(), Path::new("lock.json")).unwrap();
    assert!(read.artifact("teamlib").unwrap().is_project());
    // A cache written by running the code changes nothing; the code does.
    std::fs::write(project.join("src/teamlib/__pycache__/y.pyc"), "more cache").unwrap();
    let again = SourceTree::read_dir(&project).unwrap();
    assert_eq!(again.archive_digest("teamlib-0.3.0"), teamlib.sha256);
    std::fs::write(project.join("src/teamlib/__init__.py"), "VALUE = 2\n").unwrap();
    let changed = SourceTree::read_dir(&project).unwrap();
    assert_ne!(changed.archive_digest("teamlib-0.3.0"), teamlib.sha256);
    // A project directory that is a link out of the recipe's directory is refused.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("pyproject.toml"), PYPROJECT).unwrap();
    std::os::unix::fs::symlink(outside.path(), recipe_dir.path().join("libs/out")).unwrap();
    let mut linked_out = request_of();
    linked_out.projects[0].path = "libs/out".into();
    let error = resolve_with_builds(
        &client,
        &crate::source_build::request(&client, &server, &["teamlib"]),
        &linked_out,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("leads out of the recipe's directory"),
        "{error}"
    );
}

/// `.`, `./dir` and `-e ./dir` in a requirements file name local projects by their
/// pyproject.toml's name; a directory out of the recipe's, or without a name, is refused.
#[test]
fn requirements_files_name_local_projects_by_directory() {
    let dir = tempfile::tempdir().unwrap();
    let recipe_path = dir.path().join("recipe.yaml");
    std::fs::write(
        &recipe_path,
        "name: job\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\nrequirements: [reqs/requirements.txt]\n",
    )
    .unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("pyproject.toml", &PYPROJECT.replace("teamlib", "trainer"));
    write("libs/teamlib/pyproject.toml", PYPROJECT);
    let load = |requirements: &str| {
        write("reqs/requirements.txt", requirements);
        let recipe = cudastack::recipe::Recipe::load(&recipe_path).unwrap();
        let target = Target::new(
            "3.11".parse().unwrap(),
            Platform::LinuxAmd64,
            "2.28".parse().unwrap(),
        )
        .unwrap();
        cudastack::lock::python_inputs::PythonInputs::load(&recipe, &recipe_path, &target)
            .map_err(|e| e.to_string())
    };
    // Paths are relative to the requirements file, as pip reads them.
    write("libs/copy/pyproject.toml", PYPROJECT);
    let inputs = load("-e ..\n../libs/teamlib\nsix\n-e ../libs/teamlib\n").unwrap();
    let projects: Vec<(String, String)> = inputs
        .projects
        .iter()
        .map(|p| (p.name.to_string(), p.path.clone()))
        .collect();
    assert_eq!(
        projects,
        [
            ("trainer".to_string(), ".".to_string()),
            ("teamlib".to_string(), "libs/teamlib".to_string())
        ]
    );
    let roots: Vec<String> = inputs
        .roots
        .iter()
        .map(|r| r.requirement.to_string())
        .collect();
    assert_eq!(roots, ["trainer", "teamlib", "six"]);
    for (line, expected) in [
        ("../..\n", "climbs out"),
        ("./missing\n", "missing/pyproject.toml"),
        (
            "../libs/teamlib\n-e ../libs/copy\n",
            "named by two directories",
        ),
    ] {
        let error = load(line).unwrap_err();
        assert!(error.contains(expected), "{line}: {error}");
    }
}
