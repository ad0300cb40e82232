//! The base comes from locked .debs only (issue 18): a build reads the archive's index only
//! to check the lock's .debs against its signature, once per cache (issue 32), never to
//! choose a package, so it runs with the network cut off once its .debs are in the cache,
//! and says what is missing when they are not. Real builds (root, mmdebstrap), against a stand-in CUDA stack whose
//! lock pins the real Debian packages (deb.debian.org).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::e2e_support::{self, stand_in::cuda_12_4_wheels, stand_in::Target};

/// A stand-in CUDA 12.4 recipe on bookworm, locked, in `work`.
fn locked_stand_in(work: &Path, name: &str, extra: &str) -> PathBuf {
    cuda_12_4_wheels(Target::X86_64, &work.join("libs"), &work.join("mirror"));
    let recipe = work.join(format!("{name}.yaml"));
    std::fs::write(&recipe, format!("name: {name}\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: 1700000000\n{extra}")).unwrap();
    e2e_support::stand_in::lock(&recipe, &work.join("mirror"));
    recipe
}

/// `cudastack build --no-verify` of `recipe` into `layout` with `cache`, run through
/// `wrap` (e.g. `unshare --net`), or directly.
fn build(recipe: &Path, layout: &Path, cache: &Path, wrap: &[&str]) -> Output {
    let binary = env!("CARGO_BIN_EXE_cudastack");
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    build_args(&mut command, recipe, layout, cache)
        .output()
        .unwrap()
}

/// `build --no-verify` of `recipe` (its stand-in wheels beside it) into `layout` with `cache`.
fn build_args<'a>(
    command: &'a mut Command,
    recipe: &Path,
    layout: &Path,
    cache: &Path,
) -> &'a mut Command {
    command
        .args(["build", "--no-verify", "--mirror"])
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg("--layout")
        .arg(layout)
        .arg("--cache-dir")
        .arg(cache)
        .arg(recipe)
}

/// The manifest digest a successful build printed.
fn digest(output: &Output) -> String {
    assert!(
        output.status.success(),
        "build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_build_with_the_network_cut_off_works_from_a_warm_cache_and_says_what_a_cold_one_lacks() {
    if let Some(skip) = e2e_support::skip_reason(&[("unshare", &["--net", "true"])]) {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = locked_stand_in(work.path(), "offline", "");
    let cache = work.path().join("cache");
    let online = digest(&build(&recipe, &work.path().join("a"), &cache, &[]));

    // Warm blobs, nothing staged: mmdebstrap installs from the local repository alone.
    for dir in ["staging", "layers"] {
        std::fs::remove_dir_all(cache.join(dir)).unwrap();
    }
    let offline = build(
        &recipe,
        &work.path().join("b"),
        &cache,
        &["unshare", "--net"],
    );
    assert_eq!(
        digest(&offline),
        online,
        "the offline build is the same image"
    );

    // A cold cache can neither check the lock against the archive's signature nor fetch a
    // .deb: the error says so and the way forward.
    let cold = build(
        &recipe,
        &work.path().join("c"),
        &work.path().join("cold"),
        &["unshare", "--net"],
    );
    let stderr = String::from_utf8_lossy(&cold.stderr);
    assert!(!cold.status.success());
    assert!(
        stderr.contains("the archive's signed index could not be read")
            && stderr.contains("build online once"),
        "{stderr}"
    );
    assert!(stderr.contains("--apt-mirror"), "{stderr}");
    assert!(!work.path().join("c").join("index.json").exists());
}

const APT_TAG: &str = "localhost/cudastack-test-apt:1";

struct RemoveAptImage;
impl Drop for RemoveAptImage {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", APT_TAG]).output();
    }
}

/// The layer digests of the image in `layout` (its one manifest), bottom first.
fn layer_digests(layout: &Path) -> Vec<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .replace(':', "/");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("blobs").join(manifest)).unwrap())
            .unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// "audit: N ELF files" from a build's summary.
fn audited_elf_files(output: &Output) -> usize {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let after = stderr.split("audit: ").nth(1).unwrap_or_default();
    after
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no audit summary in:\n{stderr}"))
}

#[test]
fn apt_packages_are_a_layer_of_their_own_that_runs_in_docker() {
    if let Some(skip) = e2e_support::skip_reason(&[("docker", &["info"])]) {
        skip.report();
        return;
    }
    let _cleanup = RemoveAptImage;
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let plain = locked_stand_in(work.path(), "plain", "");
    let tools = locked_stand_in(
        work.path(),
        "tools",
        &format!("apt: [git, openssh-client, libgl1]\ntags: [\"{APT_TAG}\"]\n"),
    );
    let plain_build = build(&plain, &work.path().join("plain"), &cache, &[]);
    digest(&plain_build);
    let tools_build = build(&tools, &work.path().join("tools"), &cache, &[]);
    digest(&tools_build);

    // One layer more, and the base layer is the same blob: recipes share it.
    let plain_layers = layer_digests(&work.path().join("plain"));
    let tools_layers = layer_digests(&work.path().join("tools"));
    assert_eq!(tools_layers.len(), plain_layers.len() + 1);
    assert_eq!(tools_layers[0], plain_layers[0], "the base layer is shared");
    // The static audit read the new libraries too (git, ssh, libGL and theirs).
    assert!(audited_elf_files(&tools_build) > audited_elf_files(&plain_build) + 20);

    let loaded = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .arg("load")
        .arg(work.path().join("tools"))
        .output()
        .unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    let run = |script: &str| {
        let output = Command::new("docker")
            .args(["run", "--rm", APT_TAG, "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "`{script}`: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    assert!(run("git --version").starts_with("git version 2."));
    assert!(run("ssh -V").contains("OpenSSH_"));
    // What `import cv2` needs of libgl1: the loader finds and loads libGL.so.1.
    assert!(
        run("python3 -c \"import ctypes; ctypes.CDLL('libGL.so.1'); print('libGL ok')\"")
            .contains("libGL ok")
    );
    // apt in the image reads the real archive again (not the build's local repository).
    assert!(run("cat /etc/apt/sources.list").contains("http://deb.debian.org/debian bookworm main"));
}

/// `cudastack lock` of `recipe` against the fixture archive at `url`, signed by `keyring`.
fn lock_against(recipe: &Path, url: &str, keyring: &Path) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["lock", "--apt-mirror", url, "--apt-keyring"])
        .arg(keyring)
        .arg("--mirror")
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg(recipe)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "lock failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `build` as another machine would run it: in `cwd`, with `umask`, `TMPDIR` and, when
/// `one_cpu`, a single CPU (`taskset -c 0`: one compression thread).
/// `archive`: the environment naming the fixture archive (`CUDASTACK_APT_MIRROR`, ...).
fn build_elsewhere(
    recipe: &Path,
    layout: &Path,
    cache: &Path,
    cwd: &Path,
    umask: &str,
    one_cpu: bool,
    archive: &[(&str, String)],
) -> Output {
    let tmp = cwd.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("umask {umask} && exec \"$@\""))
        .arg("sh");
    if one_cpu {
        command.args(["taskset", "-c", "0"]);
    }
    command.arg(env!("CARGO_BIN_EXE_cudastack"));
    build_args(&mut command, recipe, layout, cache)
        .current_dir(cwd)
        .env("TMPDIR", &tmp)
        .envs(archive.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap()
}

/// Set one deb's field in the lock file `path` (a hand edit, as a pull request might).
fn set_deb_field(path: &Path, name: &str, field: &str, value: &str) {
    let mut lock: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for artifact in lock["artifacts"].as_array_mut().unwrap() {
        if artifact["kind"] == "deb" && artifact["name"] == name {
            artifact[field] = value.into();
        }
    }
    std::fs::write(path, serde_json::to_string_pretty(&lock).unwrap()).unwrap();
}

/// Reproducible on another day, against a fixture archive (served on 127.0.0.1, signed by
/// its own key, carrying real bookworm .debs) that the test moves on: a newer tzdata is
/// published after the lock. A build from the lock with empty caches, in another working
/// directory, umask, TMPDIR and CPU count, is the same image; with the locked tzdata gone
/// and no fallback, the error names it; from the lock's fallback URL (a snapshot-like
/// second server), the build works again.
#[test]
fn a_build_from_the_lock_is_the_same_image_after_the_archive_moved_on() {
    use crate::apt_support::{minbase_archive, repack_with_version, AptRoot, DirServer};
    if let Some(skip) = e2e_support::skip_reason(&[]) {
        skip.report();
        return;
    }
    let Some((mut archive, server)) = minbase_archive() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let recipe = work.path().join("day.yaml");
    cuda_12_4_wheels(
        Target::X86_64,
        &work.path().join("libs"),
        &work.path().join("mirror"),
    );
    std::fs::write(&recipe, "name: day\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    lock_against(&recipe, &server.url(), archive.keyring());
    // Builds check the lock against the same archive, signed by its key (issue 32).
    let fixture = vec![
        ("CUDASTACK_APT_MIRROR", server.url()),
        (
            "CUDASTACK_APT_KEYRING",
            archive.keyring().display().to_string(),
        ),
    ];
    let lock_file = recipe.with_extension("lock");
    let lock = cudastack::lock::Lockfile::read(&lock_file).unwrap();
    let tzdata = lock
        .artifacts
        .iter()
        .find(|a| a.name == "tzdata")
        .unwrap()
        .clone();

    let (a, b) = (work.path().join("machine-a"), work.path().join("machine-b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let first = digest(&build_elsewhere(
        &recipe,
        &a.join("layout"),
        &a.join("cache"),
        &a,
        "022",
        false,
        &fixture,
    ));

    // The archive moves on: a newer tzdata in the updates suite, which apt now prefers.
    let original = archive
        .find("bookworm", "tzdata", &tzdata.version)
        .unwrap()
        .clone();
    let newer = repack_with_version(
        &archive.root().join(&original.filename),
        "9999a-0+deb12u1",
        work.path(),
    )
    .unwrap();
    archive.add("bookworm-updates", "main", &newer).unwrap();
    archive.publish().unwrap();
    let apt = AptRoot::create(
        &work.path().join("apt"),
        "amd64",
        &[
            archive.sources_line(&server.url(), "bookworm").unwrap(),
            archive
                .sources_line(&server.url(), "bookworm-updates")
                .unwrap(),
        ],
    )
    .unwrap();
    apt.update().unwrap();
    assert_eq!(
        apt.candidate("tzdata").unwrap().as_deref(),
        Some("9999a-0+deb12u1")
    );

    // Another machine, another day: empty cache, other cwd, umask, TMPDIR, one CPU. It
    // reads the archive's index (the moved-on one) only to check the lock's .debs.
    let second = build_elsewhere(
        &recipe,
        &b.join("layout"),
        &b.join("cache"),
        &b,
        "077",
        true,
        &fixture,
    );
    assert_eq!(
        digest(&second),
        first,
        "the same lock gave another image after the archive moved on"
    );

    // The snapshot archive keeps what the archive drops.
    let snapshot = work.path().join("snapshot");
    let copied = archive
        .copy_pool_files(&[original], &snapshot, "archive/debian/20260101T000000Z")
        .unwrap();

    // The locked tzdata leaves the archive, and this machine's cache lacks it; with no
    // fallback URL, the error names it.
    archive
        .remove("bookworm", "tzdata", &tzdata.version)
        .unwrap();
    archive.publish().unwrap();
    let blob = b.join("cache/blobs/sha256").join(tzdata.sha256.hex());
    std::fs::remove_file(&blob).unwrap();
    let c = work.path().join("machine-c");
    let gone = build_elsewhere(
        &recipe,
        &c.join("layout"),
        &b.join("cache"),
        &b,
        "022",
        false,
        &fixture,
    );
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(!gone.status.success());
    assert!(
        stderr.contains("1 locked .deb could not be fetched")
            && stderr.contains(&format!("tzdata {}", tzdata.version))
            && stderr.contains("404"),
        "{stderr}"
    );
    assert!(stderr.contains("cudastack lock --upgrade"), "{stderr}");

    // The lock's fallback URL (the snapshot archive) still has it.
    let snapshot_server = DirServer::serve(&snapshot).unwrap();
    set_deb_field(
        &lock_file,
        "tzdata",
        "fallback_url",
        &format!("{}/{}", snapshot_server.url(), copied[0]),
    );
    let mut with_snapshot = fixture.clone();
    with_snapshot.push(("CUDASTACK_APT_SNAPSHOT", snapshot_server.url()));
    let from_snapshot = build_elsewhere(
        &recipe,
        &c.join("layout"),
        &b.join("cache"),
        &b,
        "022",
        false,
        &with_snapshot,
    );
    // The lock changed (its fallback URL), so the config layer that records it did too;
    // the base is the same layer.
    digest(&from_snapshot);
    assert_eq!(
        layer_digests(&c.join("layout"))[0],
        layer_digests(&a.join("layout"))[0]
    );
    assert_eq!(snapshot_server.requests_for(".deb").len(), 1);
}

/// The image config of the one image in `layout`.
fn image_config(layout: &Path) -> serde_json::Value {
    let blob = |digest: &str| {
        let path = layout.join("blobs").join(digest.replace(':', "/"));
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(path).unwrap()).unwrap()
    };
    let index = blob_index(layout);
    let manifest = blob(index["manifests"][0]["digest"].as_str().unwrap());
    blob(manifest["config"]["digest"].as_str().unwrap())
}

fn blob_index(layout: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap()
}

/// An Ubuntu base is locked from Ubuntu's archive (archive.ubuntu.com: noble, -updates,
/// -security, main and universe, checked against Ubuntu's keyring) and built from those
/// .debs alone, as a Debian one is.
#[test]
fn an_ubuntu_noble_base_is_locked_and_built_from_its_debs() {
    if let Some(skip) = e2e_support::skip_reason(&[]) {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    cuda_12_4_wheels(
        Target::X86_64,
        &work.path().join("libs"),
        &work.path().join("mirror"),
    );
    let recipe = work.path().join("noble.yaml");
    std::fs::write(&recipe, "name: noble\nbase: { ubuntu: noble }\npython: \"3.12\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    e2e_support::stand_in::lock(&recipe, &work.path().join("mirror"));
    let lock = cudastack::lock::Lockfile::read(&recipe.with_extension("lock")).unwrap();
    let python3 = lock.artifacts.iter().find(|a| a.name == "python3").unwrap();
    assert!(python3
        .url
        .to_string()
        .starts_with("http://archive.ubuntu.com/ubuntu/"));
    assert!(python3.version.starts_with("3.12."), "{}", python3.version);
    let layout = work.path().join("layout");
    digest(&build(&recipe, &layout, &work.path().join("cache"), &[]));
    let config = image_config(&layout);
    let os = config["config"]["Labels"]["io.cudastack.os"]
        .as_str()
        .unwrap_or_default();
    assert!(os.starts_with("Ubuntu 24.04"), "{config}");
}
