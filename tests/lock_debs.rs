//! The base's Debian packages are locked like every other byte (issue 18): `cudastack lock`
//! records apt's decision with each .deb's sha256, keeps locked versions until told to
//! upgrade, and says which locked version left the archive. Against the real Debian
//! archive (deb.debian.org); unreachable, these tests skip, and fail under
//! CUDASTACK_REQUIRE=1 as in CI.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cudastack::apt::{AptSources, Resolution};
use cudastack::lock::lockfile::DebLayer;
use cudastack::lock::{ArtifactKind, Lockfile};

use crate::e2e_support::stand_in::{cuda_12_4_wheels, Target};
use crate::gate;

/// Whether the Debian archive cannot be used here; the skip is reported through the gate
/// (a failure under CUDASTACK_REQUIRE=1).
fn debian_unreachable() -> bool {
    if gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |_| true,
        "this test reads the Debian archive",
    ) {
        return true;
    }
    let reason = if cudastack::platform::which("apt-get").is_none() {
        Some("apt-get is not installed".to_string())
    } else {
        let sources = AptSources::for_release("debian", "bookworm", "amd64", None, None);
        Resolution::update(&sources, "bookworm")
            .err()
            .map(|e| format!("the Debian archive cannot be read: {e}"))
    };
    match reason {
        Some(reason) => {
            gate::skip("network", reason);
            true
        }
        None => false,
    }
}

/// A stand-in CUDA 12.4 recipe on bookworm with its wheel mirror, in `work`.
fn stand_in(work: &Path) -> PathBuf {
    cuda_12_4_wheels(Target::X86_64, &work.join("libs"), &work.join("mirror"));
    let recipe = work.join("debs.yaml");
    std::fs::write(&recipe, "name: debs\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    recipe
}

fn lock(recipe: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .arg("lock")
        .args(args)
        .arg("--mirror")
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg(recipe)
        .output()
        .unwrap()
}

fn ok(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "lock failed: {stderr}");
    stderr
}

/// Set the version of `name` in the lock file `path` (a hand edit, as a pull request might).
fn set_version(path: &Path, name: &str, version: &str) {
    let mut lock: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for artifact in lock["artifacts"].as_array_mut().unwrap() {
        if artifact["kind"] == "deb" && artifact["name"] == name {
            artifact["version"] = version.into();
        }
    }
    std::fs::write(path, serde_json::to_string_pretty(&lock).unwrap()).unwrap();
}

fn version_of(lock: &Lockfile, name: &str) -> String {
    lock.artifacts
        .iter()
        .find(|a| a.kind == ArtifactKind::Deb && a.name == name)
        .unwrap_or_else(|| panic!("no {name} in the lock"))
        .version
        .clone()
}

#[test]
fn lock_pins_every_base_package_and_keeps_it_until_an_upgrade() {
    if debian_unreachable() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = stand_in(work.path());
    let lock_file = recipe.with_extension("lock");
    ok(&lock(&recipe, &[]));
    let first_text = std::fs::read_to_string(&lock_file).unwrap();
    let first = Lockfile::read(&lock_file).unwrap();
    let debs: Vec<_> = first
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Deb)
        .collect();
    // mmdebstrap's minbase with python3 and ca-certificates: ~120 packages.
    assert!(debs.len() > 100, "only {} debs", debs.len());
    for deb in &debs {
        assert_eq!(deb.layer, Some(DebLayer::Base));
        assert!(deb.size > 0 && deb.url.to_string().ends_with(".deb"));
    }
    assert!(version_of(&first, "python3").starts_with("3.11."));

    // A package the archive has in an older version too: tzdata (bookworm and its
    // updates carry different releases).
    let sources = AptSources::for_release("debian", "bookworm", "amd64", None, None);
    let apt = Resolution::update(&sources, "bookworm").unwrap();
    let newest = version_of(&first, "tzdata");
    let older = apt
        .versions("tzdata")
        .unwrap()
        .into_iter()
        .find(|v| *v != newest)
        .expect("the archive lists a second tzdata");

    // Locked versions are kept: a lock that says the older tzdata keeps it.
    set_version(&lock_file, "tzdata", &older);
    ok(&lock(&recipe, &[]));
    let kept = Lockfile::read(&lock_file).unwrap();
    assert_eq!(version_of(&kept, "tzdata"), older);

    // `--upgrade-package tzdata` moves it, and says so.
    let said = ok(&lock(&recipe, &["--upgrade-package", "tzdata"]));
    assert!(
        said.contains(&format!("tzdata {older} -> {newest}")),
        "{said}"
    );
    // `--upgrade` of an up-to-date lock changes nothing: the same bytes as the lock before
    // it (which keeps its moment), and the first lock's, but for the moment each was made.
    let before = std::fs::read_to_string(&lock_file).unwrap();
    let said = ok(&lock(&recipe, &["--upgrade"]));
    assert!(!said.contains(" -> "), "{said}");
    assert_eq!(std::fs::read_to_string(&lock_file).unwrap(), before);
    let mut upgraded = Lockfile::read(&lock_file).unwrap();
    upgraded.as_of = first.as_of;
    assert_eq!(upgraded.to_json(), first_text);
}

#[test]
fn a_locked_version_gone_from_the_archive_is_named_with_the_way_forward() {
    if debian_unreachable() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = stand_in(work.path());
    let lock_file = recipe.with_extension("lock");
    ok(&lock(&recipe, &[]));
    set_version(&lock_file, "tzdata", "2000a-0+deb12u1");
    let output = lock(&recipe, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("left the archive") && stderr.contains("tzdata=2000a-0+deb12u1"),
        "{stderr}"
    );
    assert!(stderr.contains("cudastack lock --upgrade"), "{stderr}");
    // The lock on disk is the one before, untouched by the failed run.
    let before = Lockfile::read(&lock_file).unwrap();
    assert_eq!(version_of(&before, "tzdata"), "2000a-0+deb12u1");
    ok(&lock(&recipe, &["--upgrade"]));
}

#[test]
fn an_unknown_apt_package_is_named_with_the_suites_searched() {
    if debian_unreachable() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = stand_in(work.path());
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        &recipe,
        format!("{text}apt: [git, cudastack-no-such-package]\n"),
    )
    .unwrap();
    let output = lock(&recipe, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("package not found")
            && stderr.contains("cudastack-no-such-package")
            && stderr.contains("bookworm-security"),
        "{stderr}"
    );
    assert!(
        !recipe.with_extension("lock").exists(),
        "no lock was written"
    );
}

/// Ubuntu's arm64 archive (ports.ubuntu.com) is unreachable here; a fixture archive with its
/// layout (suite `noble`, components main and universe, arm64), carrying Debian's arm64
/// .debs and served on 127.0.0.1, shows the lock reads such an archive: apt resolves
/// against it for arm64, and every package is recorded with suite, component and
/// architecture. (It does not show that Ubuntu's own packages install.)
#[test]
fn an_ubuntu_ports_like_arm64_archive_is_resolved_for_arm64() {
    use crate::apt_support::{self, debs, Archive, DirServer, Suite};
    if let Some(skip) = apt_support::skip_reason() {
        skip.report();
        return;
    }
    let Some(hello) = debs::fetch_or_skip("arm64", &["hello"], debs::Resolve::WithDependencies)
    else {
        return;
    };
    let suites = ["noble", "noble-updates", "noble-security"]
        .map(|dist| Suite::ubuntu_ports(dist, &["arm64"]))
        .to_vec();
    let mut archive = Archive::new(suites).unwrap();
    archive.add_all("noble", "universe", &hello).unwrap();
    archive.publish().unwrap();
    let server = DirServer::serve(archive.root()).unwrap();
    let mirror: reqwest::Url = server.url().parse().unwrap();
    let sources = AptSources::for_release(
        "ubuntu",
        "noble",
        "arm64",
        Some(&mirror),
        Some(archive.keyring().to_path_buf()),
    );
    let apt = Resolution::update(&sources, "noble").unwrap();
    let packages = apt.resolve(&["hello".to_string()]).unwrap();
    let hello = packages.iter().find(|p| p.name == "hello").unwrap();
    assert_eq!(hello.architecture, "arm64");
    assert_eq!(
        (hello.suite.as_str(), hello.component.as_str()),
        ("noble", "universe")
    );
    assert!(hello.url.to_string().starts_with(&server.url()));
    assert_eq!(
        hello.snapshot_url, None,
        "no snapshot archive is known for a mirror"
    );
    // The same archive under another key is refused by apt's signature check.
    let other = crate::apt_support::SigningKey::generate("other <other@example.invalid>").unwrap();
    let wrong = AptSources::for_release(
        "ubuntu",
        "noble",
        "arm64",
        Some(&mirror),
        Some(other.keyring().to_path_buf()),
    );
    let error = Resolution::update(&wrong, "noble")
        .err()
        .expect("another key is refused");
    assert!(
        error.to_string().contains("signature or hash check failed"),
        "{error}"
    );
}
