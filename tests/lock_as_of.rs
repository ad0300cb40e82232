//! Locks as of a moment (issue 40): what upstream publishes after a lock was made cannot
//! change the answer of a relock as of the lock's own `as_of`, while `lock --upgrade`
//! (the relock workflow) and `lock --check --upgrade` find exactly that drift.
//!
//! Against fixtures on 127.0.0.1 that speak the real formats: a PEP 691 JSON index with
//! PEP 700 upload times (as PyPI serves), a PEP 503 HTML index without them, and a signed
//! Debian archive with its snapshot service (snapshot.debian.org's layout: ROOT/<stamp>/ is
//! the archive as it was then), which this machine cannot reach.

use std::path::Path;
use std::process::{Command, Output};
use std::str::FromStr;

use cudastack::fetch::http::HttpClient;
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::source::PackageSource;
use cudastack::lock::changes::changes;
use cudastack::lock::{resolve, ArtifactKind, LockRequest, Lockfile, Target};
use cudastack::platform::Platform;
use pep508_rs::Requirement;

use crate::e2e_support::stand_in::{cuda_12_4_wheels, Target as StandInTarget};
use crate::fetch_support::{self, sha256_hex, wheel_bytes, FixtureServer};

/// A PyPI-like JSON index: each project's files with their upload times (None: the index
/// gives none).
struct JsonIndex {
    server: FixtureServer,
    projects: std::collections::BTreeMap<String, Vec<serde_json::Value>>,
}

impl JsonIndex {
    fn new() -> Self {
        JsonIndex {
            server: FixtureServer::start(),
            projects: Default::default(),
        }
    }

    fn url(&self) -> String {
        self.server.url("/simple/")
    }

    /// Upload `name` `version` (a py3 wheel requiring `requires`) at `uploaded`.
    fn upload(&mut self, name: &str, version: &str, requires: &[&str], uploaded: Option<&str>) {
        let headers: Vec<String> = requires
            .iter()
            .map(|r| format!("Requires-Dist: {r}"))
            .collect();
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        let (bytes, _) = wheel_bytes(name, version, &headers);
        let filename = format!("{name}-{version}-py3-none-any.whl");
        let path = format!("/files/{filename}");
        let mut file = serde_json::json!({
            "filename": filename,
            "url": path,
            "hashes": { "sha256": sha256_hex(&bytes) },
            "size": bytes.len(),
            "yanked": false,
        });
        if let Some(at) = uploaded {
            file["upload-time"] = at.into();
        }
        self.server
            .add_bytes(&path, "application/octet-stream", bytes);
        let files = self.projects.entry(name.to_string()).or_default();
        files.push(file);
        let page = serde_json::json!({
            "meta": { "api-version": "1.1" },
            "name": name,
            "files": files,
        });
        self.server.add_bytes(
            &format!("/simple/{name}/"),
            "application/vnd.pypi.simple.v1+json",
            serde_json::to_vec(&page).unwrap(),
        );
    }
}

fn request(client: &HttpClient, index: &str, roots: &[&str]) -> LockRequest {
    LockRequest {
        target: Target::new(
            "3.11".parse().unwrap(),
            Platform::LinuxAmd64,
            "2.28".parse().unwrap(),
        )
        .unwrap(),
        requirements: roots
            .iter()
            .map(|r| Requirement::from_str(r).unwrap())
            .collect(),
        constraints: Default::default(),
        sources: vec![PackageSource::Index {
            index: SimpleIndex::new(client.clone(), index.parse().unwrap()),
            plain_linux: false,
        }],
        redist: Vec::new(),
        system: None,
        recipe_digest: cudastack::digest::Digest::of_bytes(b"as-of recipe"),
        byte_digest: None,
        as_of: None,
    }
}

fn lock(client: &HttpClient, request: &LockRequest) -> Lockfile {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(resolve(client, request))
        .unwrap()
}

fn version(lock: &Lockfile, name: &str) -> String {
    lock.artifact(name)
        .unwrap_or_else(|| panic!("no {name} in the lock"))
        .version
        .clone()
}

#[test]
fn a_package_published_after_the_locks_moment_changes_nothing() {
    let client = fetch_support::client(2);
    let mut index = JsonIndex::new();
    index.upload(
        "demo",
        "1.0",
        &["dep>=2"],
        Some("2026-01-10T08:00:00.123456Z"),
    );
    index.upload("dep", "2.0", &[], Some("2026-01-05T00:00:00Z"));
    let moment: jiff::Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let mut first = request(&client, &index.url(), &["demo"]);
    first.as_of(moment, None).unwrap();
    let locked = lock(&client, &first);
    assert_eq!(locked.as_of, Some(moment));
    assert_eq!(
        (version(&locked, "demo"), version(&locked, "dep")),
        ("1.0".into(), "2.0".into())
    );

    // Upstream moves on: new releases, one of them from an index page without a time.
    index.upload("demo", "1.1", &["dep>=2"], Some("2026-11-20T10:00:00Z"));
    index.upload("dep", "2.1", &[], Some("2026-11-21T10:00:00Z"));
    index.upload("demo", "1.2", &["dep>=2"], None);

    // Relocked as of the lock's own moment: the same bytes.
    let mut again = request(&client, &index.url(), &["demo"]);
    again.as_of(locked.as_of.unwrap(), None).unwrap();
    assert_eq!(lock(&client, &again).to_json(), locked.to_json());

    // Today's resolution (what `lock --upgrade` and the relock workflow do) finds the drift.
    let today = lock(&client, &request(&client, &index.url(), &["demo"]));
    let moved: Vec<String> = changes(Some(&locked), &today, ArtifactKind::is_python)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(moved, ["demo 1.0 -> 1.2", "dep 2.0 -> 2.1"]);
}

#[test]
fn an_index_that_gives_no_upload_times_cannot_answer_as_of() {
    let client = fetch_support::client(2);
    let server = FixtureServer::start();
    let (bytes, _) = wheel_bytes("demo", "1.0", &[]);
    server.add_bytes(
        "/files/demo-1.0-py3-none-any.whl",
        "application/octet-stream",
        bytes.clone(),
    );
    server.add_bytes(
        "/simple/demo/",
        "text/html",
        format!(
            "<a href=\"/files/demo-1.0-py3-none-any.whl#sha256={}\">demo-1.0-py3-none-any.whl</a>",
            sha256_hex(&bytes)
        )
        .into_bytes(),
    );
    let mut request = request(&client, &server.url("/simple/"), &["demo"]);
    request
        .as_of("2026-06-01T00:00:00Z".parse().unwrap(), None)
        .unwrap();
    let error = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(resolve(&client, &request))
        .unwrap_err();
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(next) = cause {
        text.push_str(&format!("\n{next}"));
        cause = next.source();
    }
    assert!(
        text.contains("gives no upload time for any of its 1 files")
            && text.contains("--as-of")
            && text.contains("/simple/demo/"),
        "{text}"
    );
}

fn cudastack(args: &[&str], recipe: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(args)
        .arg("--mirror")
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg(recipe)
        .output()
        .unwrap()
}

fn succeeded(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "lock failed: {stderr}");
    stderr
}

fn deb_version(lock: &Lockfile, name: &str) -> String {
    lock.artifacts
        .iter()
        .find(|a| a.kind == ArtifactKind::Deb && a.name == name)
        .unwrap_or_else(|| panic!("no {name} in the lock"))
        .version
        .clone()
}

/// The Debian side: a signed fixture archive (minbase) that moves on after the lock, and
/// its snapshot service holding the state the lock was made from.
#[test]
fn lock_as_of_reads_the_archive_snapshot_and_check_finds_the_drift() {
    use crate::apt_support::{minbase_archive, repack_with_version, DirServer};
    let Some((mut archive, live)) = minbase_archive() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    // The snapshot service keeps this state under its stamp.
    let moment = "2026-06-01T00:00:00Z";
    let snapshots = work.path().join("snapshots");
    std::fs::create_dir_all(&snapshots).unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(archive.root())
        .arg(snapshots.join("20260601T000000Z"))
        .status()
        .unwrap();
    assert!(copied.success());
    let snapshot = DirServer::serve(&snapshots).unwrap();

    let recipe = work.path().join("asof.yaml");
    cuda_12_4_wheels(
        StandInTarget::X86_64,
        &work.path().join("libs"),
        &work.path().join("mirror"),
    );
    std::fs::write(&recipe, "name: asof\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    let keyring = archive.keyring().display().to_string();
    let live_url = live.url();
    let mirror_args = [
        "--apt-mirror",
        live_url.as_str(),
        "--apt-keyring",
        keyring.as_str(),
    ];
    let lock_file = recipe.with_extension("lock");
    succeeded(&cudastack(&[&["lock"][..], &mirror_args].concat(), &recipe));
    let first_text = std::fs::read_to_string(&lock_file).unwrap();
    let first = Lockfile::read(&lock_file).unwrap();
    assert!(first.as_of.is_some(), "a lock records its moment");
    let tzdata = deb_version(&first, "tzdata");

    // The archive moves on: a newer tzdata in the updates suite.
    let original = archive.find("bookworm", "tzdata", &tzdata).unwrap().clone();
    let newer = repack_with_version(
        &archive.root().join(&original.filename),
        "9999a-0+deb12u1",
        work.path(),
    )
    .unwrap();
    archive.add("bookworm-updates", "main", &newer).unwrap();
    archive.publish().unwrap();

    // A plain relock keeps the locked versions and the lock's moment: the same bytes.
    succeeded(&cudastack(&[&["lock"][..], &mirror_args].concat(), &recipe));
    assert_eq!(std::fs::read_to_string(&lock_file).unwrap(), first_text);

    // The drift check: exit 1, names the change, writes nothing.
    let check = cudastack(
        &[
            &["lock", "--check", "--upgrade", "--json"][..],
            &mirror_args,
        ]
        .concat(),
        &recipe,
    );
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("tzdata {tzdata} -> 9999a-0+deb12u1")),
        "{stderr}"
    );
    let reported: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(reported[0]["deb_changes"][0]["name"], "tzdata");
    assert_eq!(std::fs::read_to_string(&lock_file).unwrap(), first_text);

    // As of the moment the snapshot holds, even `--upgrade` sees the archive as it was.
    let snapshot_url = snapshot.url();
    succeeded(&cudastack(
        &[
            &[
                "lock",
                "--upgrade",
                "--as-of",
                moment,
                "--apt-snapshot",
                snapshot_url.as_str(),
            ][..],
            &mirror_args,
        ]
        .concat(),
        &recipe,
    ));
    let as_of = Lockfile::read(&lock_file).unwrap();
    assert_eq!(as_of.as_of, Some(moment.parse().unwrap()));
    assert_eq!(deb_version(&as_of, "tzdata"), tzdata);
    let base_files = as_of
        .artifacts
        .iter()
        .find(|a| a.kind == ArtifactKind::Deb && a.name == "base-files")
        .unwrap();
    // Recorded under the archive's own root, with the snapshot as the fallback.
    assert!(
        base_files.url.to_string().starts_with(&live_url),
        "{}",
        base_files.url
    );
    assert!(
        base_files
            .fallback_url
            .as_ref()
            .is_some_and(|u| u.as_str().starts_with(&snapshot_url)),
        "{:?}",
        base_files.fallback_url
    );
    assert!(
        changes(Some(&first), &as_of, ArtifactKind::is_deb).is_empty(),
        "the snapshot gave other packages"
    );
    // Today's archive, upgraded: the newer tzdata.
    succeeded(&cudastack(
        &[&["lock", "--upgrade"][..], &mirror_args].concat(),
        &recipe,
    ));
    let upgraded = Lockfile::read(&lock_file).unwrap();
    assert_eq!(deb_version(&upgraded, "tzdata"), "9999a-0+deb12u1");
}
