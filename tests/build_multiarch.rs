//! A recipe with `platforms: [linux/amd64, linux/arm64]` builds on this x86_64 machine,
//! without emulation, into an OCI image index that skopeo reads per platform; the arm64
//! image is a real aarch64 Debian root (unpacked and finished by cudastack: users, CA
//! bundle, alternatives, dpkg database, a loader cache written by cudastack) with the CUDA
//! libraries under `targets/sbsa-linux`.
//!
//! The stack is stand-in CUDA 12.4 / cuDNN 9.1 wheels for both architectures, built here
//! with gcc and aarch64-linux-gnu-gcc (real ELF objects with the real SONAMEs). Where
//! qemu-user is installed, the arm64 image's own Python and glibc loader run under
//! `qemu-aarch64 -L` (emulation used by the test only, to prove the loader cache works):
//! the stand-in libcudart is found through /etc/ld.so.cache with no LD_LIBRARY_PATH.

use crate::e2e_support;

use e2e_support::gate;

use std::path::Path;
use std::process::Command;

use cudastack::elf::{read_elf, ElfProbe, Machine};
use e2e_support::stand_in::{cuda_12_4_wheels, lock, Target};

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn machine(path: &Path) -> Machine {
    match read_elf(path).unwrap() {
        ElfProbe::Elf(info) => info.machine,
        ElfProbe::NotElf => panic!("{} is not an ELF file", path.display()),
    }
}

#[test]
fn two_platforms_build_into_an_index_without_emulation() {
    if let Some(reason) = e2e_support::skip_reason(&[
        ("gcc", &["--version"][..]),
        ("aarch64-linux-gnu-gcc", &["--version"][..]),
        ("skopeo", &["--version"][..]),
        ("umoci", &["--version"][..]),
    ]) {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mirror = work.path().join("mirror");
    for target in [Target::X86_64, Target::Aarch64] {
        cuda_12_4_wheels(target, &work.path().join("libs"), &mirror);
    }
    let recipe = work.path().join("two-platforms.yaml");
    std::fs::write(&recipe, "name: two-platforms\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\nplatforms: [linux/amd64, linux/arm64]\ntags: [\"{registry}/two:{cuda}\"]\n").unwrap();
    lock(&recipe, &mirror);
    assert!(work.path().join("two-platforms.linux-arm64.lock").is_file());

    let layout = work.path().join("layout");
    let stdout = run(Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--no-verify", "--mirror"])
        .arg(&mirror)
        .arg("--layout")
        .arg(&layout)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(&recipe)
        .env("CUDASTACK_PROBE_DIR", native_probe_dir()));
    let index_digest = stdout.lines().next().unwrap().to_string();

    // The ref names the index; skopeo resolves it per platform.
    let raw: serde_json::Value = serde_json::from_str(&run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!("oci:{}:latest", layout.display()))))
    .unwrap();
    assert_eq!(
        raw["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{raw}"
    );
    let platforms: Vec<String> = raw["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap(),
                m["platform"]["architecture"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    // Each platform's image has its own SBOM and provenance, of its own lock (issue 22).
    for (child, arch) in raw["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["amd64", "arm64"])
    {
        let digest: cudastack::digest::Digest = child["digest"].as_str().unwrap().parse().unwrap();
        let referrers = cudastack::attest::store::referrers_of(&layout, &digest).unwrap();
        let kinds: Vec<&str> = referrers.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(kinds, ["provenance", "sbom", "sbom.cdx"], "{arch}");
        let sbom = String::from_utf8_lossy(&referrers[1].blob);
        assert!(
            sbom.contains(&format!("arch={arch}")),
            "{arch}: no {arch} package in its SBOM"
        );
        let other = if arch == "amd64" { "arm64" } else { "amd64" };
        assert!(
            !sbom.contains(&format!("arch={other}")),
            "{arch}: the {other} lock in its SBOM"
        );
    }
    let index_bytes = std::fs::read(
        layout
            .join("blobs/sha256")
            .join(index_digest.trim_start_matches("sha256:")),
    )
    .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&index_bytes).unwrap(),
        raw
    );
    for (arch, lib_dir) in [("amd64", "x86_64-linux"), ("arm64", "sbsa-linux")] {
        let inspected: serde_json::Value = serde_json::from_str(&run(Command::new("skopeo")
            .args(["inspect", "--override-os", "linux", "--override-arch", arch])
            .arg(format!("oci:{}:latest", layout.display()))))
        .unwrap();
        assert_eq!(inspected["Architecture"], arch, "{inspected}");
        let env: Vec<&str> = inspected["Env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            env.contains(&format!("LD_LIBRARY_PATH=/usr/local/cuda-12.4/targets/{lib_dir}/lib:/usr/local/nvidia/lib64").as_str()),
            "{env:?}"
        );
    }
    // The recipe's tag names the index too; inspect/check on this x86_64 host pick amd64.
    let refs = cudastack::oci::layout::list_refs(&layout).unwrap();
    for name in [
        "latest",
        "latest-linux-amd64",
        "latest-linux-arm64",
        "localhost/two:12.4",
    ] {
        assert!(refs.contains(&name.to_string()), "{refs:?}");
    }
    let host = cudastack::oci::layout::resolve(&layout, "latest").unwrap();
    assert_eq!(host.config.architecture().to_string(), "amd64");

    // `load` of the index puts this host's (amd64) image into Docker under the index's tag.
    if Command::new("docker")
        .arg("info")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
    {
        let tag = "localhost/two:12.4";
        run(Command::new(env!("CARGO_BIN_EXE_cudastack"))
            .arg("load")
            .arg(&layout));
        let machine = run(Command::new("docker").args([
            "run",
            "--rm",
            tag,
            "python3",
            "-c",
            "import platform; print(platform.machine())",
        ]));
        let _ = Command::new("docker").args(["rmi", "-f", tag]).output();
        assert_eq!(machine.trim(), "x86_64");
    } else {
        eprintln!("no Docker daemon: `load` of the index was not checked");
    }

    // The arm64 root, as a runtime unpacks it.
    let bundle = work.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:latest-linux-arm64", layout.display()))
        .arg(&bundle));
    let root = bundle.join("rootfs");
    assert_eq!(machine(&root.join("usr/bin/python3.11")), Machine::Aarch64);
    let cudart = root.join("usr/local/cuda-12.4/targets/sbsa-linux/lib/libcudart.so.12");
    assert_eq!(machine(&cudart), Machine::Aarch64);
    assert!(std::fs::read_to_string(root.join("etc/passwd"))
        .unwrap()
        .starts_with("root:"));
    // What base-files, passwd and tzdata's maintainer scripts would have made.
    for file in [
        "etc/shadow",
        "etc/profile",
        "root/.bashrc",
        "etc/shells",
        "etc/timezone",
    ] {
        assert!(root.join(file).is_file(), "{file} is missing");
    }
    assert_eq!(
        std::fs::read_link(root.join("etc/localtime")).unwrap(),
        Path::new("/usr/share/zoneinfo/Etc/UTC")
    );
    assert!(
        std::fs::metadata(root.join("etc/ssl/certs/ca-certificates.crt"))
            .unwrap()
            .len()
            > 100_000
    );
    assert_eq!(
        std::fs::read_link(root.join("usr/bin/awk")).unwrap(),
        Path::new("/etc/alternatives/awk")
    );
    let status = std::fs::read_to_string(root.join("var/lib/dpkg/status")).unwrap();
    assert!(
        status.split("\n\n").any(|s| s.contains("Package: libc6\n")
            && s.contains("Architecture: arm64")
            && s.contains("Status: install ok unpacked")),
        "libc6 is not recorded as unpacked:\n{}",
        &status[..status.len().min(2000)]
    );
    assert!(root.join("var/lib/dpkg/info/libc6:arm64.list").is_file());
    let cache = cudastack::host::stack::parse_ld_so_cache(
        &std::fs::read(root.join("etc/ld.so.cache")).unwrap(),
    )
    .unwrap();
    let lookup = |name: &str| {
        cache
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.path.clone())
    };
    assert_eq!(
        lookup("libcudart.so.12").as_deref(),
        Some("/usr/local/cuda-12.4/targets/sbsa-linux/lib/libcudart.so.12")
    );
    assert!(
        lookup("libc.so.6").unwrap().contains("aarch64-linux-gnu"),
        "{cache:?}"
    );
    assert!(
        !cache.iter().any(|e| e.path.contains("x86_64")),
        "{cache:?}"
    );

    // The real aarch64 loader, under emulation (the test's only use of it).
    if Command::new("qemu-aarch64")
        .arg("--version")
        .output()
        .is_err()
    {
        gate::skip(
            "qemu-user",
            "qemu-aarch64 is not installed: the arm64 loader was not run",
        );
        return;
    }
    let version = run(Command::new("qemu-aarch64")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .arg("-L")
        .arg(&root)
        .arg(root.join("usr/bin/python3.11"))
        .args(["-c", "import ctypes, ssl; v = ctypes.c_int(); ctypes.CDLL('libcudart.so.12').cudaRuntimeGetVersion(ctypes.byref(v)); import zoneinfo; zoneinfo.ZoneInfo('Europe/Berlin'); print(v.value, ssl.create_default_context().cert_store_stats()['x509_ca'] > 100)"]));
    assert_eq!(version.trim(), "12040 True");

    // The aarch64 native probe (built in a Debian chroot by scripts/build-probe.sh) is baked
    // into this torch-free image and runs there against the image's glibc and libraries.
    let built =
        native_probe_dir().join(cudastack::probe::native::file_name(12, Machine::Aarch64).unwrap());
    let Ok(probe) = std::fs::read(&built) else {
        gate::skip(
            "native-probe",
            format!(
                "{} is not built (scripts/build-probe.sh): the arm64 native probe was not run",
                built.display()
            ),
        );
        return;
    };
    let baked = root.join(cudastack::probe::native::NATIVE_PROBE_PATH.trim_start_matches('/'));
    assert_eq!(std::fs::read(&baked).unwrap(), probe, "{}", baked.display());
    // In a chroot of the image, so /proc/self/maps names the image's paths (qemu-aarch64 -L
    // from outside shows the host's paths of the unpacked files): statically linked qemu-user.
    let Ok(qemu) = std::fs::read("/usr/bin/qemu-aarch64-static") else {
        gate::skip(
            "qemu-user-static",
            "qemu-user-static is not installed: the arm64 native probe was not run",
        );
        return;
    };
    std::fs::write(root.join("qemu-aarch64-static"), qemu).unwrap();
    std::fs::set_permissions(
        root.join("qemu-aarch64-static"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let output = e2e_support::in_image_chroot(&root)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args([
            "/qemu-aarch64-static",
            "-E",
            "LD_LIBRARY_PATH=/usr/local/cuda-12.4/targets/sbsa-linux/lib:/usr/local/nvidia/lib64",
            cudastack::probe::native::NATIVE_PROBE_PATH,
            "--level",
            "all",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = cudastack::verify::report::Report::from_output(&stdout, "the arm64 probe")
        .unwrap_or_else(|e| panic!("{e}\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
    let json = serde_json::to_value(&report).unwrap();
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    let status = |id: &str| {
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {json}"))["status"]
            .clone()
    };
    // The aarch64 libraries of the image, opened by SONAME and asked their versions.
    for id in [
        "static.cuda_libraries",
        "static.dlopen",
        "static.cudart",
        "static.cudnn",
        "static.cublas",
        "static.loaded_libraries",
    ] {
        assert_eq!(status(id), "pass", "{id}: {json}");
    }
    for check in json["checks"].as_array().unwrap() {
        match check["level"].as_str().unwrap() {
            "static" => assert_ne!(check["status"], "fail", "{check}"),
            // No GPU and no libcuda.so.1 in this image: every GPU level skips with the reason.
            _ => assert_eq!(check["status"], "skip", "{check}"),
        }
    }
    assert_eq!(output.status.code(), Some(0), "{stdout}");
}

/// Where scripts/build-probe.sh puts the native probes.
fn native_probe_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/probe")
}
