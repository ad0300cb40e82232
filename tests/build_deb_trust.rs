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

use crate::apt_support::{self, debs, repack_with_version, Archive, DirServer, Suite};
use crate::e2e_support::stand_in::{cuda_12_4_wheels, Target};

/// The fixture archive (minbase, published), served; None when the test must skip.
fn archive() -> Option<(Archive, DirServer)> {
    if let Some(skip) = apt_support::skip_reason() {
        skip.report();
        return None;
    }
    let minbase = debs::minbase_or_skip("amd64")?;
    let suites = ["bookworm", "bookworm-updates", "bookworm-security"]
        .map(|dist| Suite::debian(dist, &["amd64"]))
        .to_vec();
    let mut archive = Archive::new(suites).unwrap();
    archive.add_all("bookworm", "main", &minbase).unwrap();
    archive.publish().unwrap();
    let server = DirServer::serve(archive.root()).unwrap();
    Some((archive, server))
}

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
    let Some((archive, server)) = archive() else {
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
    let Some((archive, server)) = archive() else {
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
