//! The static audit on image roots built from real gcc-built libraries: a clean tree passes,
//! and each planted failure gives exactly the finding it should.

use crate::elf_support;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use cudastack::audit::{AuditOptions, AuditReport, FindingKind};
use cudastack::elf::read_elf;
use elf_support::{audit, bare_lib, build, skip_without_gcc, Lib};

const TOOLKIT_LIB: &str = "usr/local/cuda-12.1/targets/x86_64-linux/lib";
const SITE: &str = "usr/local/lib/python3.11/site-packages";

fn cudnn_header(major: u32, minor: u32, patch: u32) -> String {
    format!("#ifndef CUDNN_VERSION_H_\n#define CUDNN_VERSION_H_\n#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n#define CUDNN_PATCHLEVEL {patch}\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)\n#endif\n")
}

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A small image laid out like a cudastack image:
/// - /usr/local/cuda-12.1 with the cuDNN chain (redist style) and its header,
///   /usr/local/cuda -> /usr/local/cuda-12.1 (absolute link), lib64 -> targets/.../lib;
/// - /opt/app/lib/libapp.so.1 needing libcudnn.so.9 (RUNPATH /usr/local/cuda/lib64) and the
///   driver's libcuda.so.1 (injected at run time, so exempt);
/// - /opt/app/bin/app needing libapp.so.1 through RUNPATH $ORIGIN/../lib;
/// - /opt/conf/lib/libconf.so.1, found through /etc/ld.so.conf.d, needed by libapp;
/// - the nvidia-cudnn-cu12 9.1.0.70 dist-info.
fn clean_root(outside: &Path) -> PathBuf {
    let root = outside.join("root");
    let lib = root.join(TOOLKIT_LIB);
    let cudnn = bare_lib(&lib, "libcudnn.so.9.1.0", "libcudnn.so.9", vec![], None);
    symlink("libcudnn.so.9.1.0", lib.join("libcudnn.so.9")).unwrap();
    symlink("libcudnn.so.9", lib.join("libcudnn.so")).unwrap();
    write(
        &root,
        "usr/local/cuda-12.1/targets/x86_64-linux/include/cudnn_version.h",
        &cudnn_header(9, 1, 0),
    );
    symlink(
        "targets/x86_64-linux/lib",
        root.join("usr/local/cuda-12.1/lib64"),
    )
    .unwrap();
    symlink("/usr/local/cuda-12.1", root.join("usr/local/cuda")).unwrap();

    // The driver library is linked at build time from a stub outside the image.
    let stub = bare_lib(
        &outside.join("stubs"),
        "libcuda.so",
        "libcuda.so.1",
        vec![],
        None,
    );
    let conf = bare_lib(
        &root.join("opt/conf/lib"),
        "libconf.so.1",
        "libconf.so.1",
        vec![],
        None,
    );
    write(
        &root,
        "etc/ld.so.conf",
        "include /etc/ld.so.conf.d/*.conf\n",
    );
    write(
        &root,
        "etc/ld.so.conf.d/conf.conf",
        "# from a test\n/opt/conf/lib\n",
    );
    let app = bare_lib(
        &root.join("opt/app/lib"),
        "libapp.so.1",
        "libapp.so.1",
        vec![cudnn, stub, conf],
        Some("/usr/local/cuda/lib64"),
    );
    let exe = build(
        &root.join("opt/app/bin"),
        &Lib {
            file: "app",
            link: vec![app],
            runpath: Some("$ORIGIN/../lib"),
            executable: true,
            nostdlib: true,
            ..Default::default()
        },
    );
    // The program interpreter gcc wrote, copied from this machine (a real ld.so).
    let interpreter = read_elf(&exe)
        .unwrap()
        .into_elf()
        .unwrap()
        .interpreter
        .unwrap();
    let target = root.join(interpreter.trim_start_matches('/'));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::copy(&interpreter, &target).unwrap();
    write(
        &root,
        &format!("{SITE}/nvidia_cudnn_cu12-9.1.0.70.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: nvidia-cudnn-cu12\nVersion: 9.1.0.70\n\nDescription\n",
    );
    root
}

fn pins() -> AuditOptions {
    AuditOptions {
        pins: BTreeMap::from([("nvidia-cudnn-cu12".to_string(), "9.1.0.70".to_string())]),
        ..Default::default()
    }
}

fn only_finding(report: &AuditReport, kind: FindingKind) -> &cudastack::audit::Finding {
    assert_eq!(
        report.findings.len(),
        1,
        "expected exactly one finding:\n{}",
        report.render()
    );
    let finding = &report.findings[0];
    assert_eq!(finding.kind, kind, "{}", report.render());
    finding
}

#[test]
fn clean_tree_passes() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    let report = audit(&root, &pins()).unwrap();
    assert!(report.is_clean(), "{}", report.render());
    // libcudnn, libconf, libapp, app and the interpreter.
    assert_eq!(report.elf_files, 5, "{}", report.render());
    // libapp: libcudnn.so.9, libcuda.so.1, libconf.so.1; app: libapp.so.1.
    assert_eq!(report.needed_checked, 4);
    assert_eq!(report.distributions, 1);
    assert!(report.render().contains(": clean"));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["findings"], serde_json::json!([]));
}

#[test]
fn missing_needed_is_found() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    // libconf's directory is no longer configured: libapp's NEEDED cannot resolve.
    std::fs::remove_file(root.join("etc/ld.so.conf.d/conf.conf")).unwrap();
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::UnresolvedNeeded);
    assert_eq!(
        finding.paths,
        vec![PathBuf::from("/opt/app/lib/libapp.so.1")]
    );
    assert!(
        finding.evidence.contains("needs `libconf.so.1`"),
        "{}",
        finding.evidence
    );
    assert!(
        finding.evidence.contains("RUNPATH: /usr/local/cuda/lib64"),
        "{}",
        finding.evidence
    );
    assert!(
        finding.hint.contains("/opt/conf/lib/libconf.so.1"),
        "{}",
        finding.hint
    );

    // And a library that exists nowhere.
    let ghost = bare_lib(
        &temp.path().join("elsewhere"),
        "libghost.so.1",
        "libghost.so.1",
        vec![],
        None,
    );
    bare_lib(
        &root.join("opt/extra"),
        "libextra.so",
        "libextra.so",
        vec![ghost],
        None,
    );
    let report = audit(&root, &pins()).unwrap();
    let ghost_finding = report
        .findings_of(FindingKind::UnresolvedNeeded)
        .find(|f| f.paths == [PathBuf::from("/opt/extra/libextra.so")])
        .expect("libextra's missing NEEDED");
    assert!(ghost_finding
        .hint
        .contains("add the library that provides `libghost.so.1`"));
}

#[test]
fn ld_library_path_from_the_image_config_is_searched() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    let cudnn = root.join(TOOLKIT_LIB).join("libcudnn.so.9.1.0");
    bare_lib(
        &root.join("opt/tool/lib"),
        "libtool.so.1",
        "libtool.so.1",
        vec![cudnn],
        None,
    );
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::UnresolvedNeeded);
    assert_eq!(
        finding.paths,
        vec![PathBuf::from("/opt/tool/lib/libtool.so.1")]
    );
    let options = pins().with_ld_library_path("/usr/local/nvidia/lib64:/usr/local/cuda/lib64");
    let report = audit(&root, &options).unwrap();
    assert!(report.is_clean(), "{}", report.render());
}

#[test]
fn duplicate_soname_is_found_but_links_are_one_copy() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    // A second real copy, as a wheel would install it.
    let wheel_lib = root.join(SITE).join("nvidia/cudnn/lib");
    std::fs::create_dir_all(&wheel_lib).unwrap();
    std::fs::copy(
        root.join(TOOLKIT_LIB).join("libcudnn.so.9.1.0"),
        wheel_lib.join("libcudnn.so.9"),
    )
    .unwrap();
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::DuplicateSoname);
    assert_eq!(
        finding.paths,
        vec![
            PathBuf::from(format!("/{TOOLKIT_LIB}/libcudnn.so.9.1.0")),
            PathBuf::from(format!("/{SITE}/nvidia/cudnn/lib/libcudnn.so.9")),
        ]
    );
    assert!(finding.evidence.contains("2 files provide `libcudnn.so.9`"));
    assert!(
        finding.evidence.contains("byte-identical"),
        "{}",
        finding.evidence
    );

    // Replace the copy with a link into the toolkit: one copy again.
    std::fs::remove_file(wheel_lib.join("libcudnn.so.9")).unwrap();
    symlink(
        format!("/{TOOLKIT_LIB}/libcudnn.so.9"),
        wheel_lib.join("libcudnn.so.9"),
    )
    .unwrap();
    let report = audit(&root, &pins()).unwrap();
    assert!(report.is_clean(), "{}", report.render());

    // A package's private copy that nothing links and no search path names (as triton ships
    // its own CUPTI, opened by absolute path) cannot win a loader race: not a duplicate.
    let private = root.join(SITE).join("triton/backends/nvidia/lib/cupti");
    std::fs::create_dir_all(&private).unwrap();
    std::fs::copy(
        root.join(TOOLKIT_LIB).join("libcudnn.so.9.1.0"),
        private.join("libcudnn.so.9"),
    )
    .unwrap();
    let report = audit(&root, &pins()).unwrap();
    assert!(report.is_clean(), "{}", report.render());
}

/// Ubuntu's packages leave links into translations and docs that language packs or other
/// packages provide (`LC_TIME/coreutils.mo -> ../LC_MESSAGES/coreutils.mo`): not the
/// runtime's, not findings. A dangling library link next to them still is.
/// A wheel's `.data/data/lib/` member installs into /usr/local/lib, which Debian's
/// ld.so.conf.d/libc.conf puts before the system directories: a library of the same SONAME
/// there would load instead of the base's into every process (the probe's interpreter too,
/// before its first line). The audit finds it, and a finding fails the build.
#[test]
fn a_wheel_library_in_usr_local_lib_shadowing_another_is_a_duplicate() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    write(&root, "etc/ld.so.conf.d/libc.conf", "/usr/local/lib\n");
    std::fs::create_dir_all(root.join("usr/local/lib")).unwrap();
    std::fs::copy(
        root.join("opt/conf/lib/libconf.so.1"),
        root.join("usr/local/lib/libconf.so.1"),
    )
    .unwrap();
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::DuplicateSoname);
    assert_eq!(
        finding.paths,
        vec![
            PathBuf::from("/opt/conf/lib/libconf.so.1"),
            PathBuf::from("/usr/local/lib/libconf.so.1"),
        ]
    );
}

/// glibc searches `DIR/glibc-hwcaps/<level>/` before every searched DIR: a copy there (a
/// wheel's `.data/data/nvidia/lib64/glibc-hwcaps/x86-64-v2/` member lands under the
/// driver directory on LD_LIBRARY_PATH) loads before the one in DIR, so it is a duplicate.
#[test]
fn a_copy_in_a_glibc_hwcaps_subdirectory_of_a_searched_dir_is_a_duplicate() {
    if skip_without_gcc() {
        return;
    }
    for (dir, ld_library_path) in [
        ("opt/conf/lib/glibc-hwcaps/x86-64-v2", ""),
        (
            "usr/local/nvidia/lib64/glibc-hwcaps/x86-64-v3",
            "/usr/local/nvidia/lib64",
        ),
    ] {
        let temp = tempfile::tempdir().unwrap();
        let root = clean_root(temp.path());
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::copy(
            root.join("opt/conf/lib/libconf.so.1"),
            root.join(dir).join("libconf.so.1"),
        )
        .unwrap();
        let report = audit(&root, &pins().with_ld_library_path(ld_library_path)).unwrap();
        let finding = only_finding(&report, FindingKind::DuplicateSoname);
        assert!(
            finding
                .paths
                .contains(&PathBuf::from(format!("/{dir}/libconf.so.1"))),
            "{dir}: {:?}",
            finding.paths
        );
    }
}

/// The loader finds a NEEDED name by file name in each directory it searches: a file named
/// `libconf.so.1` that declares another SONAME still answers for `libconf.so.1`, ahead of
/// the real one when its directory comes first (the CUDA directory on LD_LIBRARY_PATH).
#[test]
fn a_file_named_like_another_library_is_a_duplicate_whatever_its_soname() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    bare_lib(
        &root.join(TOOLKIT_LIB),
        "libconf.so.1",
        "libforged.so.1",
        vec![],
        None,
    );
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::DuplicateSoname);
    assert_eq!(
        finding.paths,
        vec![
            PathBuf::from("/opt/conf/lib/libconf.so.1"),
            PathBuf::from(format!("/{TOOLKIT_LIB}/libconf.so.1")),
        ]
    );
}

#[test]
fn dangling_links_in_docs_and_translations_are_the_distributions() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    let locale = root.join("usr/share/locale/af/LC_TIME");
    std::fs::create_dir_all(&locale).unwrap();
    symlink("../LC_MESSAGES/coreutils.mo", locale.join("coreutils.mo")).unwrap();
    let doc = root.join("usr/share/doc/openssl");
    std::fs::create_dir_all(&doc).unwrap();
    symlink("../libssl3t64/changelog.gz", doc.join("changelog.gz")).unwrap();
    let report = audit(&root, &pins()).unwrap();
    assert!(report.is_clean(), "{}", report.render());
    symlink(
        "libcudnn_ops.so.9",
        root.join(TOOLKIT_LIB).join("libcudnn_ops.so"),
    )
    .unwrap();
    let report = audit(&root, &pins()).unwrap();
    only_finding(&report, FindingKind::DanglingSymlink);
}

#[test]
fn dangling_symlink_is_found() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    // A chain copied without its target (`cp` of the links only).
    symlink(
        "libcudnn_ops.so.9",
        root.join(TOOLKIT_LIB).join("libcudnn_ops.so"),
    )
    .unwrap();
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::DanglingSymlink);
    assert_eq!(
        finding.paths,
        vec![PathBuf::from(format!("/{TOOLKIT_LIB}/libcudnn_ops.so"))]
    );
    assert!(
        finding.evidence.contains("points to `libcudnn_ops.so.9`"),
        "{}",
        finding.evidence
    );

    // An absolute target is resolved inside the root, not on the host: /bin/sh exists on
    // the host but not in this image.
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    symlink("/bin/sh", root.join("usr/bin/sh")).unwrap();
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::DanglingSymlink);
    assert!(
        finding
            .evidence
            .contains("`/bin` does not exist in the image"),
        "{}",
        finding.evidence
    );
}

#[test]
fn cudnn_header_disagreeing_with_the_library_is_found() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    write(
        &root,
        "usr/local/cuda-12.1/targets/x86_64-linux/include/cudnn_version.h",
        &cudnn_header(9, 2, 0),
    );
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::CudnnVersionMismatch);
    assert!(
        finding.evidence.contains("cudnn_version.h says 9.2.0"),
        "{}",
        finding.evidence
    );
    assert!(
        finding.evidence.contains("library file name says 9.1.0"),
        "{}",
        finding.evidence
    );
    assert!(
        finding
            .evidence
            .contains("nvidia-cudnn-cu12 wheel version says 9.1.0"),
        "{}",
        finding.evidence
    );
    assert!(finding.paths.contains(&PathBuf::from(
        "/usr/local/cuda-12.1/targets/x86_64-linux/include/cudnn_version.h"
    )));
}

#[test]
fn cudnn_wheel_disagreeing_with_the_header_is_found() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    let dist_info = root.join(SITE).join("nvidia_cudnn_cu12-9.1.0.70.dist-info");
    std::fs::remove_dir_all(&dist_info).unwrap();
    write(
        &root,
        &format!("{SITE}/nvidia_cudnn_cu12-8.9.2.26.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: nvidia-cudnn-cu12\nVersion: 8.9.2.26\n",
    );
    let report = audit(&root, &AuditOptions::default()).unwrap();
    let finding = only_finding(&report, FindingKind::CudnnVersionMismatch);
    assert!(
        finding.evidence.contains("wheel version says 8.9.2"),
        "{}",
        finding.evidence
    );
}

#[test]
fn pin_mismatch_is_found() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    let options = AuditOptions {
        pins: BTreeMap::from([
            ("nvidia-cudnn-cu12".to_string(), "9.1.0.70".to_string()),
            (
                "nvidia_cuda_runtime_cu12".to_string(),
                "12.1.105".to_string(),
            ),
        ]),
        ..Default::default()
    };
    let report = audit(&root, &options).unwrap();
    let finding = only_finding(&report, FindingKind::PinMismatch);
    assert!(finding
        .evidence
        .contains("nvidia_cuda_runtime_cu12==12.1.105 is expected but not installed"));

    let options = AuditOptions {
        pins: BTreeMap::from([("NVIDIA-cuDNN-cu12".to_string(), "9.1.0.69".to_string())]),
        ..Default::default()
    };
    let report = audit(&root, &options).unwrap();
    let finding = only_finding(&report, FindingKind::PinMismatch);
    assert_eq!(
        finding.paths,
        vec![PathBuf::from(format!(
            "/{SITE}/nvidia_cudnn_cu12-9.1.0.70.dist-info"
        ))]
    );
    assert!(
        finding
            .evidence
            .contains("expected 9.1.0.69, installed 9.1.0.70"),
        "{}",
        finding.evidence
    );
    assert!(report.render().contains("error[pin-mismatch]"));
}

#[test]
fn link_time_stubs_are_not_duplicates() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    // The toolkit's link-time stub of libcudnn shares the SONAME but never loads.
    let stubs = root.join(TOOLKIT_LIB).join("stubs");
    std::fs::create_dir_all(&stubs).unwrap();
    std::fs::copy(
        root.join(TOOLKIT_LIB).join("libcudnn.so.9.1.0"),
        stubs.join("libcudnn.so"),
    )
    .unwrap();
    let report = audit(&root, &pins()).unwrap();
    assert!(report.is_clean(), "{}", report.render());
}

#[test]
fn missing_interpreter_is_found() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    let interpreter = read_elf(&root.join("opt/app/bin/app"))
        .unwrap()
        .into_elf()
        .unwrap()
        .interpreter
        .unwrap();
    std::fs::remove_file(root.join(interpreter.trim_start_matches('/'))).unwrap();
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::MissingInterpreter);
    assert_eq!(finding.paths, vec![PathBuf::from("/opt/app/bin/app")]);
    assert!(
        finding.evidence.contains(&interpreter),
        "{}",
        finding.evidence
    );
}

#[test]
fn missing_symbol_version_is_found() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    let script_v2 =
        "VERS_1.0 { global: old_fn; local: *; };\nVERS_2.0 { global: new_fn; } VERS_1.0;\n";
    let newer = build(
        &temp.path().join("build"),
        &Lib {
            file: "libver.so.1",
            soname: Some("libver.so.1"),
            source: "int old_fn(void) { return 1; }\nint new_fn(void) { return 2; }\n",
            version_script: Some(script_v2),
            nostdlib: true,
            ..Default::default()
        },
    );
    let newer_copy = newer.clone();
    // The image holds the older libver, which only defines VERS_1.0 ...
    let older_dir = root.join("opt/user/lib");
    build(
        &older_dir,
        &Lib {
            file: "libver.so.1",
            soname: Some("libver.so.1"),
            source: "int old_fn(void) { return 1; }\n",
            version_script: Some("VERS_1.0 { global: old_fn; local: *; };\n"),
            nostdlib: true,
            ..Default::default()
        },
    );
    // ... and a library built against the newer one, calling its VERS_2.0 symbol.
    build(
        &older_dir,
        &Lib {
            file: "libconsumer.so.1",
            soname: Some("libconsumer.so.1"),
            link: vec![newer.clone()],
            runpath: Some("$ORIGIN"),
            source: "int new_fn(void);\nint consume(void) { return new_fn(); }\n",
            nostdlib: true,
            ..Default::default()
        },
    );
    let report = audit(&root, &pins()).unwrap();
    let finding = only_finding(&report, FindingKind::MissingSymbolVersion);
    assert_eq!(
        finding.paths,
        vec![
            PathBuf::from("/opt/user/lib/libconsumer.so.1"),
            PathBuf::from("/opt/user/lib/libver.so.1"),
        ]
    );
    assert!(
        finding
            .evidence
            .contains("requires version `VERS_2.0` of `libver.so.1`"),
        "{}",
        finding.evidence
    );
    assert!(
        finding.evidence.contains("it defines VERS_1.0"),
        "{}",
        finding.evidence
    );

    // With the library it was built against, the requirement is met.
    std::fs::copy(&newer_copy, older_dir.join("libver.so.1")).unwrap();
    let report = audit(&root, &pins()).unwrap();
    assert!(report.is_clean(), "{}", report.render());
}

/// Audit a real root given by `CUDASTACK_AUDIT_ROOT` (e.g. an mmdebstrap'd Debian, or an
/// unpacked image) and print the report; with `CUDASTACK_AUDIT_EXPECT_CLEAN=1` it must be
/// clean. `cargo test --test suite audit_static::audit_root_from_env -- --ignored --nocapture`.
#[test]
#[ignore = "needs an assembled root; CUDASTACK_AUDIT_ROOT=DIR cargo test --test suite audit_static::audit_root_from_env -- --ignored --nocapture"]
fn audit_root_from_env() {
    let Some(root) = std::env::var_os("CUDASTACK_AUDIT_ROOT") else {
        panic!("CUDASTACK_AUDIT_ROOT is not set: point it at an assembled root to run this test");
    };
    let options = AuditOptions::default().with_ld_library_path(
        &std::env::var("CUDASTACK_AUDIT_LD_LIBRARY_PATH").unwrap_or_default(),
    );
    let started = std::time::Instant::now();
    let report = audit(Path::new(&root), &options).unwrap();
    eprintln!("{}", report.render());
    eprintln!(
        "audit took {:.2?}; image glibc {:?}",
        started.elapsed(),
        cudastack::audit::image_glibc(Path::new(&root)).unwrap()
    );
    if std::env::var("CUDASTACK_AUDIT_EXPECT_CLEAN").as_deref() == Ok("1") {
        assert!(report.is_clean());
    }
}

#[test]
fn pins_read_from_the_installed_framework() {
    if skip_without_gcc() {
        return;
    }
    use cudastack::audit::pins::{linux_environment, pins_of_installed};
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    write(
        &root,
        &format!("{SITE}/torch-2.4.1.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\nRequires-Dist: filelock\nRequires-Dist: nvidia-cudnn-cu12==9.1.0.70; platform_system == \"Linux\" and platform_machine == \"x86_64\"\n",
    );
    let environment = linux_environment("3.11".parse().unwrap(), "x86_64");
    let site = Path::new("/").join(SITE);
    let pins = pins_of_installed(&root, &site, "torch", &environment)
        .unwrap()
        .unwrap();
    assert_eq!(
        pins,
        BTreeMap::from([("nvidia-cudnn-cu12".to_string(), "9.1.0.70".to_string())])
    );
    assert!(pins_of_installed(&root, &site, "jax", &environment)
        .unwrap()
        .is_none());
    let options = AuditOptions {
        pins,
        ..Default::default()
    };
    assert!(audit(&root, &options).unwrap().is_clean());

    // A different cuDNN wheel swapped in: the pin catches it (and the version sources disagree).
    std::fs::remove_dir_all(root.join(SITE).join("nvidia_cudnn_cu12-9.1.0.70.dist-info")).unwrap();
    write(
        &root,
        &format!("{SITE}/nvidia_cudnn_cu12-9.3.0.75.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: nvidia-cudnn-cu12\nVersion: 9.3.0.75\n",
    );
    let report = audit(&root, &options).unwrap();
    let kinds: Vec<_> = report.findings.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![FindingKind::CudnnVersionMismatch, FindingKind::PinMismatch],
        "{}",
        report.render()
    );
}

#[test]
fn preloaded_sonames_count_when_the_image_holds_one_copy() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = clean_root(temp.path());
    // Like nvidia/cusolver needing libcublas.so.12 with no RUNPATH to it: torch preloads it.
    let cublas = bare_lib(
        &root.join("opt/nv/cublas/lib"),
        "libcublas.so.12",
        "libcublas.so.12",
        vec![],
        None,
    );
    bare_lib(
        &root.join("opt/nv/cusolver/lib"),
        "libcusolver.so.11",
        "libcusolver.so.11",
        vec![cublas.clone()],
        None,
    );
    let report = audit(&root, &pins()).unwrap();
    only_finding(&report, FindingKind::UnresolvedNeeded);

    let mut options = pins();
    options.preloaded.insert("libcublas.so.12".to_string());
    assert!(audit(&root, &options).unwrap().is_clean());

    // With two copies of the preloaded library, which one loads first is not known.
    std::fs::create_dir_all(root.join("opt/other")).unwrap();
    std::fs::copy(&cublas, root.join("opt/other/libcublas.so.12")).unwrap();
    let report = audit(&root, &options).unwrap();
    let kinds: Vec<_> = report.findings.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![FindingKind::UnresolvedNeeded, FindingKind::DuplicateSoname],
        "{}",
        report.render()
    );
}

/// auditwheel's layout (numpy.libs): the extension has DT_RPATH to the vendored directory,
/// the vendored libraries have neither RPATH nor RUNPATH, and their own NEEDED entries
/// resolve only through the RPATH inherited from the extension that loaded them
/// (libopenblas -> libgfortran -> libquadmath, two levels). With RUNPATH on the extension
/// instead, glibc does not pass it on, and the audit must say so.
#[test]
fn rpath_of_loading_libraries_is_inherited_but_runpath_is_not() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let outside = temp.path().join("build");
    let build_tree = |root: &Path, use_runpath: bool| {
        let libs = root.join("usr/local/lib/python3.11/dist-packages/numpy.libs");
        let quadmath = bare_lib(
            &libs,
            "libquadmath-96973f99.so.0.0.0",
            "libquadmath-96973f99.so.0.0.0",
            vec![],
            None,
        );
        let gfortran = bare_lib(
            &libs,
            "libgfortran-040039e1.so.5.0.0",
            "libgfortran-040039e1.so.5.0.0",
            vec![quadmath],
            None,
        );
        let openblas = bare_lib(
            &libs,
            "libopenblas64_p-r0.so",
            "libopenblas64_p-r0.so",
            vec![gfortran],
            None,
        );
        let core = root.join("usr/local/lib/python3.11/dist-packages/numpy/core");
        let path = "$ORIGIN/../../numpy.libs";
        build(
            &core,
            &Lib {
                file: "_multiarray_umath.so",
                soname: None,
                link: vec![openblas],
                runpath: use_runpath.then_some(path),
                rpath: (!use_runpath).then_some(path),
                nostdlib: true,
                ..Default::default()
            },
        );
        let _ = &outside;
    };
    let with_rpath = temp.path().join("rpath");
    build_tree(&with_rpath, false);
    let report = audit(&with_rpath, &AuditOptions::default()).unwrap();
    assert_eq!(
        report.findings_of(FindingKind::UnresolvedNeeded).count(),
        0,
        "{}",
        report.render()
    );

    let with_runpath = temp.path().join("runpath");
    build_tree(&with_runpath, true);
    let report = audit(&with_runpath, &AuditOptions::default()).unwrap();
    let unresolved: Vec<_> = report.findings_of(FindingKind::UnresolvedNeeded).collect();
    assert_eq!(unresolved.len(), 2, "{}", report.render());
    assert!(unresolved
        .iter()
        .any(|f| f.evidence.contains("libgfortran-040039e1.so.5.0.0")));
}
