//! A lock cannot run code on the build host (issue 32): a lock from a pull request that
//! swaps a .deb (same name and version; another URL, sha256 and size; no fallback) was
//! installed, its maintainer scripts run as root. Now every locked .deb must come from the
//! base's archive (or the build's `--apt-mirror`, or its snapshot) and be listed in the
//! archive's signed index with the locked sha256 and size, before anything is fetched.
//!
//! Against a fixture archive on 127.0.0.1 signed by its own key, carrying real bookworm
//! .debs; the attacker's .deb is a real one repacked (other bytes, same control fields).

use std::path::Path;
use std::process::{Command, Output};

use crate::apt_support::{minbase_archive, repack_with_version, Archive, DirServer};
use crate::e2e_support::stand_in::{cuda_12_4_wheels, Target};

/// A stand-in CUDA 12.4 recipe on bookworm in `work`, locked against `server`.
fn locked_recipe(work: &Path, archive: &Archive, server: &DirServer) -> std::path::PathBuf {
    cuda_12_4_wheels(Target::X86_64, &work.join("libs"), &work.join("mirror"));
    let recipe = work.join("trust.yaml");
    std::fs::write(&recipe, "name: trust\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    let output = cudastack(&recipe, &["lock"], archive, server);
    assert!(
        output.status.success(),
        "lock failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    recipe
}

/// `cudastack COMMAND` on `recipe` with the stand-in wheels and the fixture archive.
fn cudastack(recipe: &Path, command: &[&str], archive: &Archive, server: &DirServer) -> Output {
    let work = recipe.parent().unwrap();
    let mut args: Vec<String> = command.iter().map(|s| s.to_string()).collect();
    if command[0] == "build" {
        args.extend(["--no-verify", "--layout"].map(String::from));
        args.push(work.join("layout").display().to_string());
        args.push("--cache-dir".into());
        args.push(work.join("cache").display().to_string());
    }
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(&args)
        .arg("--apt-mirror")
        .arg(server.url())
        .arg("--apt-keyring")
        .arg(archive.keyring())
        .arg("--mirror")
        .arg(work.join("mirror"))
        .arg(recipe)
        .output()
        .unwrap()
}

/// Replace `name`'s .deb in the lock by the file at `url` (a pull request's edit): its
/// sha256 and size, no fallback.
fn swap_deb(lock: &Path, name: &str, url: &str, bytes: &[u8]) {
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lock).unwrap()).unwrap();
    let digest = format!("sha256:{}", crate::fetch_support::sha256_hex(bytes));
    let mut found = false;
    for artifact in json["artifacts"].as_array_mut().unwrap() {
        if artifact["kind"] == "deb" && artifact["name"] == name {
            artifact["url"] = url.into();
            artifact["sha256"] = digest.clone().into();
            artifact["size"] = bytes.len().into();
            artifact.as_object_mut().unwrap().remove("fallback_url");
            found = true;
        }
    }
    assert!(found, "no deb {name} in the lock");
    std::fs::write(lock, serde_json::to_string_pretty(&json).unwrap()).unwrap();
}

/// tzdata's locked version and a repacked copy of its .deb (same control, other bytes).
fn evil_tzdata(archive: &Archive, lock: &Path, dir: &Path) -> (String, Vec<u8>) {
    let lock = cudastack::lock::Lockfile::read(lock).unwrap();
    let version = lock.artifact("tzdata").unwrap().version.clone();
    let original = archive.find("bookworm", "tzdata", &version).unwrap();
    let repacked =
        repack_with_version(&archive.root().join(&original.filename), &version, dir).unwrap();
    let bytes = std::fs::read(&repacked).unwrap();
    assert_ne!(
        crate::fetch_support::sha256_hex(&bytes),
        original.sha256,
        "the repacked .deb must be other bytes"
    );
    (version, bytes)
}

#[test]
fn a_lock_cannot_point_a_deb_outside_the_archive() {
    let Some((archive, server)) = minbase_archive() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let recipe = locked_recipe(work.path(), &archive, &server);
    let lock = recipe.with_extension("lock");
    let attacker = tempfile::tempdir().unwrap();
    let (version, bytes) = evil_tzdata(&archive, &lock, attacker.path());
    let file = format!("tzdata_{version}_all.deb");
    std::fs::write(attacker.path().join(&file), &bytes).unwrap();
    let evil = DirServer::serve(attacker.path()).unwrap();
    swap_deb(&lock, "tzdata", &format!("{}/{file}", evil.url()), &bytes);

    let output = cudastack(&recipe, &["build"], &archive, &server);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "the swapped .deb was built: {stderr}"
    );
    assert!(
        stderr.contains(&format!("`tzdata {version}` points at `{}", evil.url()))
            && stderr.contains("outside the archives this build trusts"),
        "{stderr}"
    );
    assert!(
        evil.requests_for(".deb").is_empty(),
        "the .deb was fetched before the lock was checked"
    );
    assert!(!work.path().join("layout/index.json").exists());
}

#[test]
fn a_lock_cannot_name_bytes_the_archive_did_not_sign() {
    let Some((archive, server)) = minbase_archive() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let recipe = locked_recipe(work.path(), &archive, &server);
    let lock = recipe.with_extension("lock");
    // Under the archive's own root (a compromised mirror, or a file the index never
    // listed): the URL passes, the signed index does not list these bytes.
    let (version, bytes) = evil_tzdata(&archive, &lock, work.path());
    let path = format!("pool/unlisted/tzdata_{version}_all.deb");
    std::fs::create_dir_all(archive.root().join("pool/unlisted")).unwrap();
    std::fs::write(archive.root().join(&path), &bytes).unwrap();
    swap_deb(&lock, "tzdata", &format!("{}/{path}", server.url()), &bytes);

    let output = cudastack(&recipe, &["build"], &archive, &server);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "the unsigned .deb was built: {stderr}"
    );
    assert!(
        stderr.contains("1 locked .deb is not in the archive's signed index")
            && stderr.contains(&format!(
                "tzdata {version} all (sha256:{}, {} bytes)",
                crate::fetch_support::sha256_hex(&bytes),
                bytes.len()
            )),
        "{stderr}"
    );
    assert!(
        server.requests_for(&path).is_empty(),
        "fetched before the check"
    );
    assert!(!work.path().join("layout/index.json").exists());
}

/// A lock whose .deb the archive has since dropped (Debian keeps the current point release
/// only): the live signed index no longer lists it, the snapshot archive as of the lock's
/// moment does, so the check passes there; the live index alone refuses it.
#[test]
fn a_deb_the_archive_dropped_is_checked_in_its_snapshot_as_of_the_lock() {
    use cudastack::apt::trust::{verify_signed, LockedDeb, TrustError};
    use cudastack::apt::AptSources;
    let Some((mut archive, server)) = minbase_archive() else {
        return;
    };
    // The snapshot service keeps today's state under its stamp.
    let snapshots = tempfile::tempdir().unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(archive.root())
        .arg(snapshots.path().join("20260601T000000Z"))
        .status()
        .unwrap();
    assert!(copied.success());
    let snapshot = DirServer::serve(snapshots.path()).unwrap();
    let pool = archive.root().join("pool/main/t/tzdata");
    let file = std::fs::read_dir(&pool)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .unwrap();
    let info = crate::apt_support::DebInfo::read(&file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let relative = file
        .strip_prefix(archive.root())
        .unwrap()
        .display()
        .to_string();
    let locked = LockedDeb {
        name: info.package.clone(),
        version: info.version.clone(),
        architecture: info.architecture.clone(),
        sha256: format!("sha256:{}", crate::fetch_support::sha256_hex(&bytes))
            .parse()
            .unwrap(),
        size: bytes.len() as u64,
        url: format!("{}/{relative}", server.url()).parse().unwrap(),
        fallback_url: None,
    };
    archive.remove("bookworm", "tzdata", &info.version).unwrap();
    archive.publish().unwrap();

    let mirror: reqwest::Url = server.url().parse().unwrap();
    let sources = AptSources::for_release(
        "debian",
        "bookworm",
        "amd64",
        Some(&mirror),
        Some(archive.keyring().to_path_buf()),
    );
    let live_only = verify_signed(
        std::slice::from_ref(&locked),
        &sources,
        "bookworm",
        None,
        None,
    );
    assert!(
        matches!(live_only, Err(TrustError::NotSigned { .. })),
        "{live_only:?}"
    );
    let service: reqwest::Url = snapshot.url().parse().unwrap();
    verify_signed(
        &[locked],
        &sources,
        "bookworm",
        Some("2026-06-01T00:00:00Z".parse().unwrap()),
        Some(&service),
    )
    .unwrap();
}
