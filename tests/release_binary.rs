//! The released binary (issue 24): `scripts/release.sh x86_64-unknown-linux-musl` builds
//! cudastack and packs it as the release workflow does. The binary must be static (no
//! PT_INTERP, no DT_NEEDED) and work in a fresh Debian bookworm container, as a non-root
//! user, with nothing of cudastack but the unpacked archive: `--version`, `validate` of a
//! recipe of recipes/, `lock` against a fixture index on 127.0.0.1 (the container shares
//! the host's network), and `check` of an image layout for a node described by flags (no
//! GPU needed). The archive, served with a SHA256SUMS made as release.yml makes it, also
//! installs through the install step of the emitted workflows.
//!
//! Then the build (issue 24's "done means"): in a bookworm container that has only the
//! release, mmdebstrap, fakechroot and fakeroot (no root, no user namespaces: Docker's
//! default seccomp profile blocks them), `cudastack build --build-mode fakechroot` of the
//! stand-in stack of tests/build_rootless.rs, whose layers must equal those of a root
//! build of the same lock by the same binary on the host. And `doctor` of the static binary
//! on a host with a driver library says it cannot load it, rather than blaming the driver.
//!
//! Heavy: the first run compiles every dependency for musl in release mode (several
//! minutes; later runs reuse target/). `CUDASTACK_SKIP_E2E` skips it; a missing musl
//! toolchain, Docker or mmdebstrap goes through the gate (a failure under
//! `CUDASTACK_REQUIRE=1`). To extend it (a rootless `build` in the container), add a step
//! function that takes the [`Container`] and call it from the test.

use crate::fetch_support::{sha256_hex, wheel_bytes, FixtureServer};
use crate::gate::Skip;
use crate::oci_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TARGET: &str = "x86_64-unknown-linux-musl";
/// Used when present; else a minbase bookworm made by mmdebstrap is imported under
/// [`BUILT_IMAGE`] (Docker Hub is not reachable from every test machine).
const BOOKWORM_IMAGE: &str = "debian:bookworm-slim";
const BUILT_IMAGE: &str = "cudastack-test/bookworm-minbase:latest";
/// A bookworm with what a rootless build needs besides cudastack (made once, kept: 0.3 GB).
const BUILD_IMAGE: &str = "cudastack-test/bookworm-build:latest";
/// The packages of [`BUILD_IMAGE`] on top of minbase.
const BUILD_PACKAGES: &str = "mmdebstrap,fakechroot,fakeroot,uidmap,ca-certificates";
/// `nobody` in Debian's base-passwd.
const USER: &str = "65534:65534";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn have(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Why the release build cannot run here, or None.
fn skip_reason() -> Option<Skip> {
    if std::env::var_os("CUDASTACK_SKIP_E2E").is_some() {
        return Some(Skip::switch(
            "CUDASTACK_SKIP_E2E",
            "it switches off the release build",
        ));
    }
    if !cfg!(target_arch = "x86_64") {
        return Some(Skip::host(
            "the release test builds the x86_64 binary on x86_64",
        ));
    }
    if !have("musl-gcc", &["--version"]) {
        return Some(Skip::missing(
            "musl-gcc",
            "musl-gcc is not installed (apt-get install musl-tools)",
        ));
    }
    let targets = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    if !targets.lines().any(|t| t == TARGET) {
        return Some(Skip::missing(
            "rust-musl",
            format!("the Rust standard library for {TARGET} is not installed (rustup target add {TARGET})"),
        ));
    }
    if let Err(reason) = oci_support::docker() {
        return Some(Skip::missing("docker", reason));
    }
    None
}

/// The archive scripts/release.sh made, and the directory it was unpacked into.
struct Release {
    archive: PathBuf,
    sha256_line: String,
    unpacked: PathBuf,
}

impl Release {
    fn binary(&self) -> PathBuf {
        self.unpacked.join("bin/cudastack")
    }
}

fn build_release(out: &Path) -> Release {
    let started = std::time::Instant::now();
    // `static-check`: the dist build's target and linking, unoptimised (Cargo.toml says why).
    let output = Command::new(root().join("scripts/release.sh"))
        .args([TARGET, "--profile", "static-check", "--out"])
        .arg(out)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "scripts/release.sh:\n{}",
        text(&output)
    );
    eprintln!("scripts/release.sh took {:.0?}", started.elapsed());
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("cudastack-{version}-{TARGET}");
    let archive = out.join(format!("{name}.tar.gz"));
    let sha256_line = std::fs::read_to_string(out.join(format!("{name}.tar.gz.sha256"))).unwrap();
    let bytes = std::fs::read(&archive).unwrap();
    assert_eq!(
        sha256_line,
        format!("{}  {name}.tar.gz\n", sha256_hex(&bytes)),
        "the .sha256 file is `sha256sum` output for the archive"
    );
    eprintln!("{name}.tar.gz: {} bytes", bytes.len());
    let unpack = out.join("unpacked");
    std::fs::create_dir_all(&unpack).unwrap();
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpack)
        .output()
        .unwrap();
    assert!(untar.status.success(), "{}", text(&untar));
    Release {
        archive,
        sha256_line,
        unpacked: unpack.join(name),
    }
}

/// Static: nothing for a program interpreter or the loader to do.
fn assert_static(binary: &Path) {
    let elf = cudastack::elf::read_elf(binary)
        .unwrap()
        .into_elf()
        .expect("the release binary is an ELF file");
    assert_eq!(elf.interpreter, None, "PT_INTERP in {}", binary.display());
    assert!(elf.needed.is_empty(), "DT_NEEDED {:?}", elf.needed);
    assert_eq!(elf.machine, cudastack::elf::Machine::X86_64);
}

/// A bookworm image: `debian:bookworm-slim` when the daemon has it, else a minbase bookworm
/// made by mmdebstrap and imported once.
fn bookworm_image() -> Result<&'static str, Skip> {
    if have("docker", &["image", "inspect", BOOKWORM_IMAGE]) {
        return Ok(BOOKWORM_IMAGE);
    }
    imported_bookworm(BUILT_IMAGE, None)
}

/// `name`, made by mmdebstrap (minbase plus `include`) and `docker import`ed when the daemon
/// does not have it yet.
fn imported_bookworm(name: &'static str, include: Option<&str>) -> Result<&'static str, Skip> {
    if have("docker", &["image", "inspect", name]) {
        return Ok(name);
    }
    if !have("mmdebstrap", &["--version"]) {
        return Err(Skip::missing(
            "mmdebstrap",
            format!("neither {name} nor mmdebstrap (to make a bookworm image) is here"),
        ));
    }
    let work = tempfile::tempdir().unwrap();
    let tarball = work.path().join("bookworm.tar");
    let mut command = Command::new("mmdebstrap");
    command.args(["--variant=minbase", "--quiet"]);
    if let Some(include) = include {
        command.arg(format!("--include={include}"));
    }
    let output = command.arg("bookworm").arg(&tarball).output().unwrap();
    if !output.status.success() {
        return Err(Skip::missing(
            "debian-mirror",
            format!("mmdebstrap bookworm failed:\n{}", text(&output)),
        ));
    }
    let import = Command::new("docker")
        .arg("import")
        .arg(&tarball)
        .arg(name)
        .output()
        .unwrap();
    assert!(import.status.success(), "docker import: {}", text(&import));
    Ok(name)
}

/// A fresh container per command: the unpacked release read-only at /opt/cudastack, a
/// work directory at /work, a user that is not root, the host's network.
struct Container<'a> {
    image: &'a str,
    release: &'a Path,
    work: &'a Path,
    /// Host directories mounted read-only at the same path (a lock's `--mirror`).
    same_path: Vec<&'a Path>,
}

impl Container<'_> {
    fn cudastack(&self, args: &[&str]) -> Output {
        let mut command = Command::new("docker");
        command
            .args(["run", "--rm", "--network", "host", "--user", USER])
            .args(["-e", "HOME=/work", "-w", "/work"])
            .arg("-v")
            .arg(format!("{}:/opt/cudastack:ro", self.release.display()))
            .arg("-v")
            .arg(format!("{}:/work", self.work.display()));
        for path in &self.same_path {
            command
                .arg("-v")
                .arg(format!("{}:{}:ro", path.display(), path.display()));
        }
        command
            .arg(self.image)
            .arg("/opt/cudastack/bin/cudastack")
            .args(args)
            .output()
            .unwrap()
    }
}

fn version_step(container: &Container) {
    let output = container.cudastack(&["--version"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("cudastack {}", env!("CARGO_PKG_VERSION"))
    );
}

fn validate_step(container: &Container) {
    let recipe = "torch2.4.1-cu121-py3.11.yaml";
    std::fs::copy(
        root().join("recipes").join(recipe),
        container.work.join(recipe),
    )
    .unwrap();
    let output = container.cudastack(&["validate", recipe]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("valid"), "{}", text(&output));
}

/// A PyTorch-style index on 127.0.0.1 serving one torch wheel without dependencies, and
/// pip: the recipe's torch index points at it, so the lock needs no other index.
fn lock_step(container: &Container) {
    let server = FixtureServer::start();
    let filename = "torch-2.4.1+cu121-cp311-cp311-linux_x86_64.whl";
    let (bytes, _) = wheel_bytes("torch", "2.4.1+cu121", &[]);
    let path = format!("/whl/cu121/files/{}", filename.replace('+', "%2B"));
    let page = format!(
        "<!DOCTYPE html><html><body><a href=\"{path}#sha256={}\">{filename}</a><br/></body></html>\n",
        sha256_hex(&bytes)
    );
    server.add_bytes(&path, "application/octet-stream", bytes);
    server.add_bytes("/whl/cu121/torch/", "text/html", page.into_bytes());
    // Every lock has pip (the image's installer): the index serves it too, so nothing is
    // asked of PyPI (a fresh container may not trust this host's way out).
    let pip_file = "pip-24.2-py3-none-any.whl";
    let (pip_bytes, _) = wheel_bytes("pip", "24.2", &[]);
    let pip_path = format!("/whl/cu121/files/{pip_file}");
    let pip_page = format!(
        "<!DOCTYPE html><html><body><a href=\"{pip_path}#sha256={}\">{pip_file}</a><br/></body></html>\n",
        sha256_hex(&pip_bytes)
    );
    server.add_bytes(&pip_path, "application/octet-stream", pip_bytes);
    server.add_bytes("/whl/cu121/pip/", "text/html", pip_page.into_bytes());
    let recipe = format!(
        "name: fixture-torch\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\n\
         cuda: {{ version: \"12.1\" }}\ntorch: {{ version: \"2.4.1\", index: \"{}\" }}\n",
        server.url("/whl/cu121")
    );
    std::fs::write(container.work.join("fixture-torch.yaml"), recipe).unwrap();
    let output = container.cudastack(&["lock", "fixture-torch.yaml"]);
    assert!(output.status.success(), "{}", text(&output));
    let lock = std::fs::read_to_string(container.work.join("fixture-torch.lock")).unwrap();
    assert!(lock.contains(filename), "{lock}");
}

/// An image layout whose config declares a driver floor and sm list; the node is given by
/// flags: yes (exit 0) for a driver above the floor, no (exit 1) below it.
fn check_step(container: &Container) {
    use cudastack::oci::{self, Image};
    let image = Image::new(1_700_000_000)
        .with_env("NVIDIA_REQUIRE_CUDA", "cuda>=12.1")
        .with_label("io.cudastack.driver-floor", "530.30.02")
        .with_label("io.cudastack.torch.sm", "sm_80 sm_86 sm_90");
    oci::layout::write(&image, &container.work.join("image"), "latest").unwrap();
    let output = container.cudastack(&["check", "image", "--driver", "550.54.15", "--gpu", "A100"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let output = container.cudastack(&["check", "image", "--driver", "470.82.01", "--gpu", "A100"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
}

/// The install step of the emitted workflows, run against the real archive and a
/// SHA256SUMS made as release.yml's publish job makes it.
fn install_step(release: &Release, runner: &Path) {
    let version = env!("CARGO_PKG_VERSION");
    let server = FixtureServer::start();
    let name = release.archive.file_name().unwrap().to_str().unwrap();
    server.add_bytes(
        &format!("/v{version}/{name}"),
        "application/gzip",
        std::fs::read(&release.archive).unwrap(),
    );
    server.add_bytes(
        &format!("/v{version}/SHA256SUMS"),
        "text/plain",
        release.sha256_line.clone().into_bytes(),
    );
    let publish = std::fs::read_to_string(root().join(".github/workflows/publish.yml")).unwrap();
    let workflow: serde_json::Value = serde_saphyr::from_str(&publish).unwrap();
    let script = workflow["jobs"]["build"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|step| step["name"] == cudastack::cluster::workflows::INSTALL_STEP_NAME)
        .expect("the build job installs cudastack")["run"]
        .as_str()
        .unwrap()
        .to_string();
    let output = Command::new("bash")
        .args(["--noprofile", "--norc", "-eo", "pipefail", "-c", &script])
        .current_dir(runner)
        .env("CUDASTACK_VERSION", version)
        .env("CUDASTACK_RELEASE_URL", &server.base)
        .env(
            "CUDASTACK_SHA256SUMS",
            sha256_hex(release.sha256_line.as_bytes()),
        )
        .env("RUNNER_TEMP", runner)
        .env("GITHUB_PATH", runner.join("path"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains(&format!("cudastack {version}")),
        "{}",
        text(&output)
    );
}

#[test]
fn static_release_binary_runs_in_a_fresh_bookworm_container() {
    if let Some(skip) = skip_reason() {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let release = build_release(&work.path().join("dist"));
    assert_static(&release.binary());
    install_step(&release, &work.path().join("dist"));

    let image = match bookworm_image() {
        Ok(image) => image,
        Err(skip) => {
            skip.report();
            return;
        }
    };
    let container_work = work.path().join("work");
    std::fs::create_dir_all(&container_work).unwrap();
    // The container's user is not root: it needs a directory it may write.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&container_work, std::fs::Permissions::from_mode(0o777)).unwrap();
    let container = Container {
        image,
        release: &release.unpacked,
        work: &container_work,
        same_path: Vec::new(),
    };
    version_step(&container);
    validate_step(&container);
    lock_step(&container);
    check_step(&container);
    doctor_step(&release.binary(), work.path());
    match imported_bookworm(BUILD_IMAGE, Some(BUILD_PACKAGES)) {
        Ok(image) => {
            install_script_step(&release, image, work.path());
            rootless_build_step(&release, image, work.path());
        }
        Err(skip) => skip.report(),
    }
}

/// A user's setup, `scripts/install.sh ARCHIVE`, in a fresh container of a build host:
/// the archive installs and runs; a copy with one byte changed is refused before anything
/// is unpacked.
fn install_script_step(release: &Release, image: &str, work: &Path) {
    let name = release.archive.file_name().unwrap().to_str().unwrap();
    let tampered = work.join("tampered");
    std::fs::create_dir_all(&tampered).unwrap();
    let mut bytes = std::fs::read(&release.archive).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(tampered.join(name), bytes).unwrap();
    std::fs::write(
        tampered.join(format!("{name}.sha256")),
        &release.sha256_line,
    )
    .unwrap();
    let install = |dir: &Path, prefix: &str| {
        Command::new("docker")
            .args(["run", "--rm", "--network", "host", "-v"])
            .arg(format!("{}:/dist:ro", dir.display()))
            .arg("-v")
            .arg(format!("{}:/scripts:ro", root().join("scripts").display()))
            .arg(image)
            .args(["bash", "-c"])
            .arg(format!(
                "bash /scripts/install.sh /dist/{name} --prefix {prefix} && {prefix}/bin/cudastack --version; status=$?; ls {prefix}/bin 2>&1; exit $status"
            ))
            .output()
            .unwrap()
    };
    let installed = install(release.archive.parent().unwrap(), "/tmp/user");
    assert!(installed.status.success(), "{}", text(&installed));
    assert!(
        String::from_utf8_lossy(&installed.stdout)
            .contains(&format!("cudastack {}", env!("CARGO_PKG_VERSION"))),
        "{}",
        text(&installed)
    );
    let refused = install(&tampered, "/tmp/user");
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("does not match its .sha256"), "{said}");
    assert!(
        said.contains("No such file or directory"),
        "nothing installed: {said}"
    );

    // An archive whose bin/cudastack is a link (to the container's shell), with a matching
    // .sha256: refused for what it holds, nothing installed.
    let linked = work.join("linked");
    let top = name.trim_end_matches(".tar.gz");
    std::fs::create_dir_all(linked.join(top).join("bin")).unwrap();
    std::os::unix::fs::symlink("/bin/sh", linked.join(top).join("bin/cudastack")).unwrap();
    let packed = Command::new("tar")
        .arg("-czf")
        .arg(linked.join(name))
        .arg("-C")
        .arg(&linked)
        .arg(top)
        .output()
        .unwrap();
    assert!(packed.status.success(), "{}", text(&packed));
    let bytes = std::fs::read(linked.join(name)).unwrap();
    std::fs::write(
        linked.join(format!("{name}.sha256")),
        format!("{}  {name}\n", sha256_hex(&bytes)),
    )
    .unwrap();
    let refused = install(&linked, "/tmp/user");
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("not a file or a directory"), "{said}");
    assert!(
        said.contains("No such file or directory"),
        "nothing installed: {said}"
    );
}

/// `doctor` of the static binary on a host whose loader path has libcuda.so.1 (a planted
/// root): a static binary cannot dlopen, so it says the library was not loaded and reads the
/// driver from /proc, instead of failing the driver (`driver.libcuda_load_failed`).
fn doctor_step(binary: &Path, work: &Path) {
    let root = work.join("planted-host");
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(root.join("proc/driver/nvidia")).unwrap();
    std::fs::write(
        root.join("proc/driver/nvidia/version"),
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(root.join("dev/nvidia0"), "").unwrap();
    // Any shared library will do: the static binary must not try to load it at all.
    let any_library = Path::new("/usr/lib/x86_64-linux-gnu/libz.so.1");
    assert!(any_library.exists(), "zlib1g is part of every Debian");
    std::fs::copy(any_library, lib.join("libcuda.so.550.54.15")).unwrap();
    std::os::unix::fs::symlink("libcuda.so.550.54.15", lib.join("libcuda.so.1")).unwrap();
    std::fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf.d/x86_64-linux-gnu.conf"),
        "/usr/lib/x86_64-linux-gnu\n",
    )
    .unwrap();
    let output = Command::new(binary)
        .args(["doctor", "--keep-going", "--json", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    let report = text(&output);
    assert!(report.contains("driver.libcuda_not_loaded"), "{report}");
    assert!(!report.contains("driver.libcuda_load_failed"), "{report}");
}

/// `build --build-mode fakechroot` in the container, as `nobody`, of the stand-in stack
/// locked against a local mirror; the layers equal a root build's by the same binary.
fn rootless_build_step(release: &Release, image: &str, work: &Path) {
    use crate::build_rootless::{blob, differences, layer_digests, locked_stand_in};
    let stack = work.join("stack");
    let mirror = stack.join("mirror");
    let recipe = locked_stand_in(&stack);

    let root_layout = stack.join("layout-root");
    let output = Command::new(release.binary())
        .args(["build", "--no-verify", "--quiet", "--mirror"])
        .arg(&mirror)
        .arg("--layout")
        .arg(&root_layout)
        .arg("--cache-dir")
        .arg(stack.join("cache-root"))
        .arg(&recipe)
        .output()
        .unwrap();
    assert!(output.status.success(), "root build: {}", text(&output));

    let container_work = work.join("build-work");
    std::fs::create_dir_all(&container_work).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&container_work, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::copy(&recipe, container_work.join("rootless.yaml")).unwrap();
    std::fs::copy(
        stack.join("rootless.lock"),
        container_work.join("rootless.lock"),
    )
    .unwrap();
    let container = Container {
        image,
        release: &release.unpacked,
        work: &container_work,
        same_path: vec![&mirror],
    };
    let mirror_arg = mirror.to_str().unwrap();
    let output = container.cudastack(&[
        "build",
        "--no-verify",
        "--build-mode",
        "fakechroot",
        "--mirror",
        mirror_arg,
        "--layout",
        "layout",
        "--cache-dir",
        "cache",
        "rootless.yaml",
    ]);
    assert!(
        output.status.success(),
        "rootless build in the container: {}",
        text(&output)
    );
    let layout = container_work.join("layout");
    let ours = layer_digests(&layout);
    let theirs = layer_digests(&root_layout);
    let mut report = Vec::new();
    for (index, (ours, theirs)) in ours.iter().zip(&theirs).enumerate() {
        if ours != theirs {
            let diff = differences(&blob(&root_layout, theirs), &blob(&layout, ours));
            report.push(format!(
                "layer {index}: {} entries differ:\n  {}",
                diff.len(),
                diff.join("\n  ")
            ));
        }
    }
    assert_eq!(ours.len(), theirs.len());
    assert!(
        report.is_empty(),
        "the container's rootless build differs from root's:\n{}",
        report.join("\n")
    );
}
