//! `cudastack verify` against a real Docker daemon (issue 16): a run ended by SIGTERM
//! removes its container; a container left by a run killed with SIGKILL is removed by the
//! next verify while a concurrent live run keeps its own; an unchanged image on an
//! unchanged host is verified from the cache without loading or running anything.
//!
//! The images are tiny real ones: static busybox, with `python3` a shell script that runs
//! the "probe" with sh, and a probe that either sleeps (a long GPU run, as far as the
//! container's lifetime goes) or prints a static-level report at once. The real probe
//! needs PyTorch and runs in tests/build_e2e.rs.
//!
//! Needs docker and /bin/busybox (Debian's busybox-static); each test says why it skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::gate::Skip;

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::engine::run::RUN_LABEL;
use cudastack::layer::{self, BuildOptions, Compression, Entry, LayerContents, LayerPath};
use cudastack::oci::{layout, Image};

const EPOCH: u64 = 1_714_521_600;
const BUSYBOX: &str = "/bin/busybox";

/// Why these tests cannot run here, if they cannot (the caller reports it: `.report()`).
fn skip_reason() -> Option<Skip> {
    if !Path::new(BUSYBOX).is_file() {
        return Some(Skip::missing(
            "busybox",
            format!("{BUSYBOX} is missing (apt-get install busybox-static)"),
        ));
    }
    match Command::new("docker").arg("info").output() {
        Ok(output) if output.status.success() => None,
        _ => Some(Skip::missing(
            "docker",
            "no Docker daemon answers `docker info`",
        )),
    }
}

macro_rules! require_docker {
    () => {
        if let Some(reason) = skip_reason() {
            reason.report();
            return;
        }
    };
}

fn p(s: &str) -> LayerPath {
    LayerPath::parse(s).unwrap()
}

/// A static-level report, as the probe prints it.
fn quick_report() -> String {
    let report = serde_json::json!({
        "schema": "cudastack.verify.report/v1", "probe_version": "1",
        "started": "2026-11-30T12:00:00Z", "seconds": 0.1, "hostname": "stand-in",
        "levels": ["static"], "expect": {}, "driver": null, "gpus": [],
        "checks": [{"id": "static.files", "level": "static", "status": "pass",
                    "seconds": 0.1, "detail": "the stand-in probe ran"}],
        "counts": {"pass": 1, "fail": 0, "skip": 0},
    });
    // With the run's nonce, as the probe prints it (issue 32).
    format!("printf 'cudastack-report-v1 nonce=%s %s\\n' \"$CUDASTACK_REPORT_NONCE\" '{report}'\n")
}

/// A busybox image whose probe is the shell script `probe`, unique to `name` and this
/// process; returns the layout and the image ID.
fn stand_in_layout(work: &Path, name: &str, probe: &str) -> (PathBuf, Digest) {
    let store = BlobStore::open(work.join("store")).unwrap();
    let base = LayerContents::from_entries([
        Entry::file_bytes(p("bin/busybox"), 0o755, std::fs::read(BUSYBOX).unwrap()),
        Entry::symlink(p("bin/sh"), "busybox"),
        Entry::symlink(p("bin/sleep"), "busybox"),
        Entry::file_bytes(
            p("usr/bin/python3"),
            0o755,
            // Drops the interpreter's flags (`/usr/bin/python3 -I -S probe.py`).
            b"#!/bin/sh\nwhile [ \"${1#-}\" != \"$1\" ]; do shift; done\nexec /bin/sh \"$@\"\n"
                .to_vec(),
        ),
        Entry::dir(p("tmp"), 0o1777),
    ])
    .unwrap();
    let base = layer::build(
        &store,
        &base,
        &BuildOptions::new(EPOCH, Compression::Gzip { level: 1 }),
    )
    .unwrap();
    let top = LayerContents::from_entries([
        Entry::file_bytes(
            p("opt/cudastack/probe/probe.py"),
            0o644,
            probe.as_bytes().to_vec(),
        ),
        Entry::file_bytes(
            p("etc/marker"),
            0o644,
            format!("{name} {}\n", std::process::id()).into_bytes(),
        ),
    ])
    .unwrap();
    let top = layer::build(&store, &top, &BuildOptions::new(EPOCH, Compression::None)).unwrap();
    let image = Image::new(EPOCH)
        .with_layer(base, "busybox")
        .with_layer(top, "probe")
        .with_env("PATH", "/bin");
    let dir = work.join(name);
    layout::write(&image, &dir, "latest").unwrap();
    (dir, image.documents().unwrap().config.digest)
}

/// Removes the images and any container of the given runs at the end of a test.
struct Cleanup {
    images: Vec<Digest>,
    pids: Vec<u32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in &self.pids {
            for id in containers_of(*pid, false) {
                let _ = Command::new("docker").args(["rm", "-f", &id]).output();
            }
        }
        for image in &self.images {
            let _ = Command::new("docker")
                .args(["rmi", "-f", &image.to_string()])
                .output();
        }
    }
}

/// Containers labelled as started by `pid` (only running ones if `running`).
fn containers_of(pid: u32, running: bool) -> Vec<String> {
    let mut command = Command::new("docker");
    command
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label={RUN_LABEL}={pid}"));
    if running {
        command.args(["--filter", "status=running"]);
    }
    let output = command.output().unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn verify(args: &[&str], cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudastack"));
    command
        .arg("verify")
        .args(["--gpus", "none", "--cache-dir"])
        .arg(cache)
        .args(args);
    command
}

fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait until `child` has a running container; its ID.
fn running_container(child: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(id) = containers_of(child.id(), true).into_iter().next() {
            return id;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let output = wait(child);
            panic!(
                "the verify exited ({status}) before its container ran:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(Instant::now() < deadline, "no container ran within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait(child: &mut Child) -> Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the verify did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status: child.wait().unwrap(),
        stdout,
        stderr,
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} failed");
}

fn container_exists(id: &str) -> bool {
    Command::new("docker")
        .args(["inspect", "--type", "container", id])
        .output()
        .unwrap()
        .status
        .success()
}

/// Issue 16: SIGTERM (a CI runner cancelling the job) used to leave the probe container
/// running for up to the 30 minute timeout, holding the GPUs.
#[test]
fn sigterm_ends_the_run_and_removes_its_container() {
    require_docker!();
    let work = tempfile::tempdir().unwrap();
    let (dir, id) = stand_in_layout(work.path(), "verify-sigterm", "echo started; sleep 300\n");
    let mut cleanup = Cleanup {
        images: vec![id],
        pids: Vec::new(),
    };
    let mut child = spawn({
        let mut command = verify(&["--no-cache"], &work.path().join("cache"));
        command.arg(&dir);
        command
    });
    cleanup.pids.push(child.id());
    let container = running_container(&mut child);
    signal(&child, "TERM");
    let started = Instant::now();
    let output = wait(&mut child);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !container_exists(&container),
        "SIGTERM left the container {container}"
    );
    // The untagged image the run loaded went with it.
    assert!(!Command::new("docker")
        .args(["image", "inspect", &id.to_string()])
        .output()
        .unwrap()
        .status
        .success());
}

/// Issue 16: nothing runs after SIGKILL, so the next verify removes what a dead run left,
/// and only that: a concurrent live verify on the same host keeps its container.
#[test]
fn the_next_verify_reaps_a_killed_runs_container_and_spares_a_live_one() {
    require_docker!();
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let (sleepy, sleepy_id) = stand_in_layout(
        work.path(),
        "verify-reap-sleepy",
        "echo started; sleep 300\n",
    );
    let (quick, quick_id) = stand_in_layout(work.path(), "verify-reap-quick", &quick_report());
    let mut cleanup = Cleanup {
        images: vec![sleepy_id, quick_id],
        pids: Vec::new(),
    };
    let mut live = spawn({
        let mut command = verify(&["--no-cache"], &cache);
        command.arg(&sleepy);
        command
    });
    cleanup.pids.push(live.id());
    let alive = running_container(&mut live);

    // Any verify reaps a dead run's container, so another test's verify running beside this
    // one (the suite runs two at once) may take the orphan first: then the scenario runs
    // again, three times at most, until this test's own verify is the one that reaps it.
    let mut attempt = 0;
    let (orphan, stderr) = loop {
        attempt += 1;
        let mut killed = spawn({
            let mut command = verify(&["--no-cache"], &cache);
            command.arg(&sleepy);
            command
        });
        cleanup.pids.push(killed.id());
        let orphan = running_container(&mut killed);
        signal(&killed, "KILL");
        let _ = wait(&mut killed);
        std::thread::sleep(Duration::from_millis(500));
        if !container_exists(&orphan) {
            assert!(
                attempt < 3,
                "the killed run's container was gone before the next verify three times: the daemon removes it by itself, or other verifies always came first"
            );
            continue;
        }
        let output = verify(&["--no-cache"], &cache)
            .arg(&quick)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        eprintln!("{stderr}");
        assert!(output.status.success(), "{stderr}");
        if stderr.contains(&format!("removed container {}", &orphan[..12])) {
            break (orphan, stderr);
        }
        // Another verify reaped it between the check and this one's start.
        assert!(
            !container_exists(&orphan),
            "the orphan {orphan} is still there: {stderr}"
        );
        assert!(
            attempt < 3,
            "another verify reaped the orphan first, three times"
        );
    };
    assert!(stderr.contains("is gone"), "{stderr}");
    assert!(
        !container_exists(&orphan),
        "the orphan {orphan} is still there"
    );
    assert!(
        containers_of(live.id(), true).contains(&alive),
        "the live run's container {alive} was removed"
    );
    assert!(
        !stderr.contains(&alive[..12]),
        "the live run's container was named: {stderr}"
    );

    signal(&live, "TERM");
    let output = wait(&mut live);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("interrupted by SIGTERM"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!container_exists(&alive));
}

/// Issue 16: every no-op rebuild with a daemon re-loaded the image and re-ran the probe.
/// The same image, probe, level and host is a cached report: nothing is loaded or run.
/// Image code that prints without end (256 MiB here, no newline) took `verify` to 820 MB of
/// memory and 512 MiB of terminal output. Each stream keeps its last 8 MiB; the message shows
/// the last lines escaped and cut.
#[test]
fn a_probe_that_prints_without_end_is_kept_to_its_tail() {
    require_docker!();
    let work = tempfile::tempdir().unwrap();
    let probe = "busybox head -c 268435456 /dev/zero | busybox tr '\\0' A\n";
    let (dir, id) = stand_in_layout(work.path(), "verify-loud", probe);
    let cleanup = Cleanup {
        images: vec![id],
        pids: vec![std::process::id()],
    };
    let timed = Path::new("/usr/bin/time").is_file();
    let mut command = if timed {
        let mut command = Command::new("/usr/bin/time");
        command.arg("-v").arg(env!("CARGO_BIN_EXE_cudastack"));
        command
    } else {
        Command::new(env!("CARGO_BIN_EXE_cudastack"))
    };
    let output = command
        .args(["verify", "--gpus", "none", "--no-cache", "--cache-dir"])
        .arg(work.path().join("cache"))
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        &stderr[..stderr.len().min(2000)]
    );
    assert!(stderr.len() < 64 << 10, "{} bytes of stderr", stderr.len());
    assert!(
        stderr.contains("bytes)"),
        "the line is cut, saying how long it was:\n{stderr}"
    );
    if timed {
        let peak_kib: u64 = stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        assert!(peak_kib < 96 << 10, "peak memory {} MiB", peak_kib >> 10);
    }
    drop(cleanup);
}

#[test]
fn an_unchanged_image_on_an_unchanged_host_is_verified_from_the_cache() {
    require_docker!();
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    // The probe takes 2 s, so a cached answer is visibly not a run.
    let probe = format!("sleep 2\n{}", quick_report());
    let (dir, id) = stand_in_layout(work.path(), "verify-cache", &probe);
    let cleanup = Cleanup {
        images: vec![id],
        pids: vec![std::process::id()],
    };
    let run = |args: &[&str]| {
        let started = Instant::now();
        let output = verify(args, &cache)
            .arg("--json")
            .arg(&dir)
            .output()
            .unwrap();
        let seconds = started.elapsed().as_secs_f64();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{stderr}");
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        eprintln!("{args:?}: {seconds:.2} s\n{stderr}");
        (json, stderr, seconds)
    };
    let manifest = layout::resolve(&dir, "latest").unwrap().manifest_digest;

    let (first, stderr, _) = run(&[]);
    assert!(!stderr.contains("cached report"), "{stderr}");
    assert_eq!(first["load"]["image_id"], id.to_string(), "{first}");

    let (second, stderr, seconds) = run(&[]);
    assert!(
        stderr.contains(&format!(
            "verification: cached report of 2026-11-30T12:00:00Z for {manifest}"
        )),
        "{stderr}"
    );
    assert!(second.get("load").is_none(), "{second}");
    // What proves the cache answered is above (its line, no load); the time is printed, not
    // asserted: under CI load the same path took 4.2 s (a timed test is a benchmark's job).
    eprintln!("a cached verify took {seconds:.2} s");
    assert_eq!(second["verdict"], first["verdict"]);
    assert_eq!(second["report"]["checks"], first["report"]["checks"]);
    assert_eq!(
        second["recorded"]["report_digest"], first["recorded"]["report_digest"],
        "the same report is recorded again"
    );

    // Another level is another verification; --no-cache always runs.
    for args in [&["--level", "static"][..], &["--no-cache"][..]] {
        let (json, stderr, _) = run(args);
        assert!(!stderr.contains("cached report"), "{args:?}: {stderr}");
        assert!(json.get("load").is_some(), "{json}");
    }
    drop(cleanup);
}

/// The host's own Python (Debian's, which processes `.pth` files as every CPython does):
/// the real interpreter of the forgery tests below.
const HOST_PYTHON: &str = "/usr/bin/python3.11";

/// A report claiming every level passed on an H100: what the forged image prints.
fn forged_report_json() -> String {
    let gpu_checks = [
        ("driver.version", "driver"),
        ("driver.cuda", "driver"),
        ("device.count", "device"),
        ("device.kernels", "device"),
        ("ops.matmul", "ops"),
        ("ops.conv", "ops"),
        ("ops.conv_benchmark", "ops"),
        ("ops.loaded_libraries", "ops"),
        ("train.mlp", "train"),
    ];
    let mut checks = vec![serde_json::json!({"id": "static.torch", "level": "static",
        "status": "pass", "seconds": 1.0, "detail": "torch 2.4.1+cu121"})];
    for (id, level) in gpu_checks {
        checks.push(
            serde_json::json!({"id": id, "level": level, "status": "pass",
            "seconds": 0.5, "detail": "ok"}),
        );
    }
    serde_json::json!({
        "schema": "cudastack.verify.report/v1", "probe_version": "1",
        "started": "2026-11-29T23:00:00Z", "seconds": 42.0, "hostname": "forged",
        "levels": ["static", "driver", "device", "ops", "train"], "expect": {},
        "torch": "2.4.1+cu121", "driver": {"version": "550.54.15", "cuda": "12.4"},
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                  "memory_bytes": 85_000_000_000u64, "kernels": "sass:sm_90"}],
        "checks": checks, "counts": {"pass": 10, "fail": 0, "skip": 0},
    })
    .to_string()
}

/// The files of a root with `python3` (the host's Debian CPython, its stdlib and the
/// shared libraries it and its extension modules need): the base of the forged images.
fn python_root(root: &Path) {
    let copy = |from: &Path| {
        let to = root.join(from.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    };
    copy(Path::new(HOST_PYTHON));
    std::os::unix::fs::symlink("python3.11", root.join("usr/bin/python3")).unwrap();
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    let status = Command::new("cp")
        .args(["-a", "/usr/lib/python3.11"])
        .arg(root.join("usr/lib/"))
        .status()
        .unwrap();
    assert!(status.success());
    for unused in [
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
    ] {
        let _ = std::fs::remove_dir_all(root.join("usr/lib/python3.11").join(unused));
    }
    // Every library the interpreter and its extension modules load, where ldd finds it.
    let mut objects = vec![PathBuf::from(HOST_PYTHON)];
    for entry in std::fs::read_dir("/usr/lib/python3.11/lib-dynload").unwrap() {
        objects.push(entry.unwrap().path());
    }
    let mut libraries = std::collections::BTreeSet::new();
    for object in objects {
        let output = Command::new("ldd").arg(&object).output().unwrap();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(path) = path.filter(|p| p.starts_with('/')) {
                libraries.insert(PathBuf::from(path));
            }
        }
    }
    for library in libraries {
        copy(&library);
    }
}

/// A layout of a Python image holding the real probe (with no torch in the image, it runs
/// the static level) and the wheel `forge` installed by cudastack's installer, with
/// `members` (the forgery). Returns the layout and the image ID.
fn forged_layout(
    work: &Path,
    name: &str,
    members: Vec<crate::install_support::Member>,
) -> (PathBuf, Digest) {
    use crate::install_support::{member, write_wheel, RecordTweaks};
    let root = work.join(format!("{name}-root"));
    python_root(&root);
    let mut all = members;
    all.push(member(
        "forge-1.0.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: forge\nVersion: 1.0\n",
    ));
    all.push(member(
        "forge-1.0.dist-info/WHEEL",
        "Wheel-Version: 1.0\nGenerator: cudastack-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    ));
    let wheel = write_wheel(
        work,
        "forge-1.0-py3-none-any.whl",
        "forge-1.0.dist-info",
        &all,
        &RecordTweaks::default(),
    );
    let options = cudastack::install::InstallOptions::new(
        cudastack::install::Scheme::debian_local("3.11".parse().unwrap()),
    );
    cudastack::install::install_wheel(&wheel, &options, &root).unwrap();
    let probe = root.join(cudastack::probe::PROBE_PATH.trim_start_matches('/'));
    std::fs::create_dir_all(probe.parent().unwrap()).unwrap();
    std::fs::write(&probe, cudastack::probe::PROBE_SOURCE).unwrap();
    let expect = root.join(cudastack::probe::EXPECT_PATH.trim_start_matches('/'));
    std::fs::create_dir_all(expect.parent().unwrap()).unwrap();
    std::fs::write(&expect, b"{}").unwrap();

    let store = BlobStore::open(work.join("store")).unwrap();
    let contents = LayerContents::from_dir(&root, &Default::default()).unwrap();
    let layer = layer::build(
        &store,
        &contents,
        &BuildOptions::new(EPOCH, Compression::None),
    )
    .unwrap();
    let image = Image::new(EPOCH)
        .with_layer(layer, "python and the forged wheel")
        // As the stack's: /usr/local/bin, where wheels' scripts go, first.
        .with_env("PATH", "/usr/local/bin:/usr/bin:/bin");
    let dir = work.join(name);
    layout::write(&image, &dir, "latest").unwrap();
    (dir, image.documents().unwrap().config.digest)
}

fn forgery_skip_reason() -> Option<Skip> {
    skip_reason().or_else(|| {
        (!Path::new(HOST_PYTHON).is_file()).then(|| {
            Skip::missing(
                "python3.11",
                format!("{HOST_PYTHON} is missing (apt-get install python3.11)"),
            )
        })
    })
}

/// Issue 32, as reported: a wheel's `.pth` file prints a report claiming every level passed
/// on an H100 (at start-up and again at exit, so it is the last line). On a host that gives
/// the container no GPU, `verify` labelled the image verified. Now the probe runs with
/// `python3 -I -S`, so the `.pth` file never runs: the report is the probe's own, static
/// level only, and nothing is labelled.
#[test]
fn a_pth_file_cannot_forge_the_report() {
    if let Some(reason) = forgery_skip_reason() {
        reason.report();
        return;
    }
    use crate::install_support::member;
    let work = tempfile::tempdir().unwrap();
    let hook = format!(
        "import atexit\nLINE = 'cudastack-report-v1 ' + {json:?}\nprint(LINE, flush=True)\natexit.register(lambda: print(LINE, flush=True))\n",
        json = forged_report_json()
    );
    let (dir, id) = forged_layout(
        work.path(),
        "verify-forged-pth",
        vec![
            member("forge.pth", "import forge_hook\n"),
            member("forge_hook.py", hook),
        ],
    );
    let cleanup = Cleanup {
        images: vec![id],
        pids: vec![std::process::id()],
    };

    let output = verify(&["--no-cache", "--json"], &work.path().join("cache"))
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["verdict"]["verdict"], "partial", "{json}");
    assert_eq!(json["report"]["gpus"], serde_json::json!([]), "{json}");
    assert_ne!(json["report"]["hostname"], "forged");
    assert_eq!(
        json["report"]["runner"]["witness"]["gpus_given"], "none",
        "{json}"
    );
    assert!(json["recorded"]["verified_manifest"].is_null(), "{json}");
    let refs = layout::list_refs(&dir).unwrap();
    assert!(
        !refs
            .iter()
            .any(|r| r == "verified" || r.ends_with("-verified")),
        "{refs:?}"
    );

    // The control: run as every runner ran it before (`python3 probe.py`), in the image's
    // files (chroot, as root like the daemon), the .pth file does print the forged report,
    // last: the image really is the reported attack.
    let plain = Command::new("chroot")
        .arg(work.path().join("verify-forged-pth-root"))
        .args([
            "/usr/bin/python3",
            cudastack::probe::PROBE_PATH,
            "--level",
            "static",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&plain.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("cudastack-report-v1 "))
        .unwrap_or_else(|| panic!("{stdout}{}", String::from_utf8_lossy(&plain.stderr)));
    assert!(last.contains("\"hostname\":\"forged\""), "{stdout}");
    assert!(cudastack::verify::report::Report::from_output(&stdout, "the plain run").is_err());
    drop(cleanup);
}

/// A wheel's console script named `python3` lands in /usr/local/bin, first on the stack's
/// PATH: run as `python3`, it replaced the probe, read the nonce from its environment and
/// printed a static-level report the host accepted as witnessed. The probe now runs the
/// base's interpreter by absolute path, so the script never runs.
#[test]
fn a_python3_on_path_cannot_stand_in_for_the_probe() {
    if let Some(reason) = forgery_skip_reason() {
        reason.report();
        return;
    }
    use crate::install_support::member;
    let work = tempfile::tempdir().unwrap();
    let report = serde_json::json!({
        "schema": "cudastack.verify.report/v1", "probe_version": "1",
        "started": "2026-11-30T12:00:00Z", "seconds": 0.1, "hostname": "forged",
        "levels": ["static"], "expect": {}, "driver": null, "gpus": [],
        "checks": [{"id": "static.forged-by-image", "level": "static", "status": "pass",
                    "seconds": 0.1, "detail": "the image's own python3"}],
        "counts": {"pass": 1, "fail": 0, "skip": 0},
    })
    .to_string();
    let shadow = format!(
        "import os\ndef main():\n    print('cudastack-report-v1 nonce=' + os.environ.get('CUDASTACK_REPORT_NONCE', '') + ' ' + {report:?}, flush=True)\n"
    );
    let (dir, id) = forged_layout(
        work.path(),
        "verify-forged-python3",
        vec![
            member("forge_shadow.py", shadow),
            member(
                "forge-1.0.dist-info/entry_points.txt",
                "[console_scripts]\npython3 = forge_shadow:main\n",
            ),
        ],
    );
    let cleanup = Cleanup {
        images: vec![id],
        pids: vec![std::process::id()],
    };
    assert!(
        work.path()
            .join("verify-forged-python3-root/usr/local/bin/python3")
            .is_file(),
        "the wheel's script is in the image, first on its PATH"
    );
    let output = verify(&["--no-cache", "--json"], &work.path().join("cache"))
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let checks = json["report"]["checks"].to_string();
    assert!(!checks.contains("forged-by-image"), "{json}");
    assert_ne!(json["report"]["hostname"], "forged", "{json}");
    drop(cleanup);
}

/// Issue 32: code of the image that runs inside the probe (a `torch` it imports) and
/// prints a report of its own is a forgery, refused, whether it prints a line without the
/// nonce or steals the nonce from /proc/self/environ and silences the probe: a container
/// given no GPU can claim no GPU result.
#[test]
fn code_the_probe_imports_cannot_forge_the_report() {
    if let Some(reason) = forgery_skip_reason() {
        reason.report();
        return;
    }
    use crate::install_support::member;
    let work = tempfile::tempdir().unwrap();
    let json = forged_report_json();
    let cases = [
        (
            "verify-forged-torch",
            format!("print('cudastack-report-v1 ' + {json:?}, flush=True)\n__version__ = '2.4.1'\n"),
            "do not carry this run's nonce",
        ),
        (
            "verify-forged-thief",
            format!(
                "import os\nenv = open('/proc/self/environ', 'rb').read().split(b'\\0')\n\
                 nonce = [e.split(b'=', 1)[1].decode() for e in env if e.startswith(b'CUDASTACK_REPORT_NONCE=')][0]\n\
                 print('cudastack-report-v1 nonce=' + nonce + ' ' + {json:?}, flush=True)\nos._exit(0)\n"
            ),
            "the container was given no GPU",
        ),
    ];
    let cache = work.path().join("cache");
    for (name, torch, refusal) in cases {
        let (dir, id) = forged_layout(work.path(), name, vec![member("torch/__init__.py", torch)]);
        let cleanup = Cleanup {
            images: vec![id],
            pids: vec![std::process::id()],
        };
        let output = verify(&["--no-cache"], &cache).arg(&dir).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("{name}: {}\n{stderr}", output.status);
        assert!(!output.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains("refused") && stderr.contains(refusal),
            "{name}: {stderr}"
        );
        let refs = layout::list_refs(&dir).unwrap();
        assert!(
            !refs.iter().any(|r| r.contains("verif")),
            "{name}: nothing recorded: {refs:?}"
        );
        drop(cleanup);
    }
}

/// A stand-in cudastack image (busybox, the quick probe, the torch 2.4.1 lock in a layer
/// named as cudastack names its config layer, and `io.cudastack.layers`), and images another
/// tool derived from it by adding one layer of `added` entries. Returns the layout and the
/// images to remove.
fn derived_layout(work: &Path, added: &[(&str, Vec<Entry>)]) -> (PathBuf, Vec<Digest>) {
    let store = BlobStore::open(work.join("store")).unwrap();
    let (stand_in, _) = stand_in_layout(work, "derived-base", &quick_report());
    let stand_in = layout::read(&stand_in, "latest").unwrap();
    let lock = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/torch2.4.1-cu121-py3.11.lock"),
    )
    .unwrap();
    let config = LayerContents::from_entries([Entry::file_bytes(
        p(cudastack::labels::LOCK_IN_IMAGE),
        0o644,
        lock,
    )])
    .unwrap();
    let config = layer::build(
        &store,
        &config,
        &BuildOptions::new(EPOCH, Compression::None),
    )
    .unwrap();
    let mut base = Image::new(EPOCH).with_env("PATH", "/bin");
    for layer in stand_in.layers() {
        base = base.with_layer(layer.clone(), "stand-in");
    }
    base = base.with_layer(config, &cudastack::labels::layer_created_by("config"));
    let diff_ids: Vec<Digest> = base.layers().iter().map(|l| l.diff_id).collect();
    let top = *cudastack::oci::chain_ids(&diff_ids).last().unwrap();
    let base = base.with_label(cudastack::labels::LAYERS, &top.to_string());
    let dir = work.join("derived");
    layout::write(&base, &dir, "cudastack").unwrap();
    let mut images = vec![base.documents().unwrap().config.digest];
    for (name, entries) in added {
        let layer = LayerContents::from_entries(entries.clone()).unwrap();
        let layer = layer::build(
            &store,
            &layer,
            &BuildOptions::new(EPOCH, Compression::Gzip { level: 1 }),
        )
        .unwrap();
        let derived = base
            .clone()
            .with_layer(layer, "RUN pip install (another tool)");
        layout::write(&derived, &dir, name).unwrap();
        images.push(derived.documents().unwrap().config.digest);
    }
    (dir, images)
}

/// `cudastack verify` of an image derived from a cudastack image: the host reads the added
/// layers before the probe runs. A replaced torch or a second libcudnn fails, naming it; an
/// added pure-Python package passes. The probe in these images passes whatever the image
/// holds, as an image's own code may: the verdict comes from the host's reading.
#[test]
fn a_derived_image_fails_verify_when_its_layers_change_the_locked_stack() {
    require_docker!();
    if let Some(skip) = crate::e2e_support::skip_reason(&[("umoci", &["--version"])]) {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let site = "usr/local/lib/python3.11/dist-packages";
    let metadata = |name: &str, version: &str| {
        Entry::file_bytes(
            p(&format!("{site}/{name}-{version}.dist-info/METADATA")),
            0o644,
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").into_bytes(),
        )
    };
    let (dir, images) = derived_layout(
        work.path(),
        &[
            ("six", vec![metadata("six", "1.16.0")]),
            ("torch", vec![metadata("torch", "2.5.1")]),
            (
                "cudnn",
                vec![Entry::file_bytes(
                    p("opt/other/lib/libcudnn.so.9"),
                    0o755,
                    b"\x7fELF".to_vec(),
                )],
            ),
        ],
    );
    // A removal is a whiteout, which cudastack's own layer writer refuses to write: umoci
    // (a real OCI tool) adds it, as `RUN pip uninstall` would in a Dockerfile.
    layout::write(&layout::read(&dir, "cudastack").unwrap(), &dir, "removed").unwrap();
    let whiteout = Command::new("umoci")
        .args(["insert", "--image"])
        .arg(format!("{}:removed", dir.display()))
        .arg("--whiteout")
        .arg(format!("/{site}/sympy-1.13.3.dist-info"))
        .output()
        .unwrap();
    assert!(
        whiteout.status.success(),
        "umoci: {}",
        String::from_utf8_lossy(&whiteout.stderr)
    );
    let mut images = images;
    images.push(layout::resolve(&dir, "removed").unwrap().config_digest);
    let _cleanup = Cleanup {
        images,
        pids: vec![std::process::id()],
    };
    let cache = work.path().join("cache");
    let run = |name: &str| {
        let output = verify(&["--json", "--no-cache"], &cache)
            .arg(format!("oci:{}:{name}", dir.display()))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        eprintln!("verify {name}: {}\n{stderr}", output.status);
        (output.status.success(), stdout, stderr)
    };

    let (ok, stdout, stderr) = run("six");
    assert!(ok, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let check = json["report"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == cudastack::verify::derived::CHECK_ID)
        .unwrap_or_else(|| panic!("no derived-layers check: {json}"))
        .clone();
    assert_eq!(check["status"], "pass", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("1 layer(s) added above the cudastack image's 3 by another tool: adds six 1.16.0; the locked stack is intact"),
        "{check}"
    );

    let (ok, stdout, stderr) = run("torch");
    assert!(!ok, "a replaced torch was verified:\n{stdout}");
    assert!(
        stdout.contains("replaces torch 2.4.1 with 2.5.1"),
        "{stdout}
{stderr}"
    );
    let (ok, stdout, stderr) = run("cudnn");
    assert!(!ok, "a second libcudnn was verified:\n{stdout}");
    assert!(
        stdout.contains("adds a second copy of a CUDA library: /opt/other/lib/libcudnn.so.9"),
        "{stdout}\n{stderr}"
    );
    let (ok, stdout, stderr) = run("removed");
    assert!(!ok, "a removed sympy was verified:\n{stdout}");
    assert!(stdout.contains("removes sympy"), "{stdout}\n{stderr}");
    // The cudastack image itself is not derived: no such check.
    let (ok, stdout, stderr) = run("cudastack");
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains(cudastack::verify::derived::CHECK_ID),
        "{stdout}"
    );
}
