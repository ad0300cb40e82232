//! The audit agrees with the real loader. Each case builds an image root from gcc-built
//! libraries plus this machine's glibc, asks the audit, then asks ld.so itself by running a
//! dlopen probe inside the root with chroot. Needs root (for chroot), gcc and an x86_64
//! glibc; skips with a printed reason otherwise.

use crate::elf_support;

use elf_support::gate;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudastack::audit::{AuditOptions, FindingKind};
use elf_support::{audit, bare_lib, build, skip_without_gcc, Lib};

const GLIBC: &[&str] = &["libc.so.6", "ld-linux-x86-64.so.2"];
const PROBE: &str = "#include <dlfcn.h>\n#include <stdio.h>\nint main(int argc, char **argv) {\n  for (int i = 1; i < argc; i++) {\n    if (!dlopen(argv[i], RTLD_NOW)) { printf(\"FAIL %s\\n\", dlerror()); return 1; }\n  }\n  printf(\"OK\\n\");\n  return 0;\n}\n";

fn can_chroot() -> bool {
    if skip_without_gcc() {
        return false;
    }
    let uid = Command::new("id").arg("-u").output().ok();
    if uid.map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0") != Some(true) {
        gate::skip(
            "root",
            "chroot needs root; the loader comparison cannot run",
        );
        return false;
    }
    let host = Path::new("/lib/x86_64-linux-gnu");
    if !GLIBC.iter().all(|name| host.join(name).exists()) {
        gate::not_applicable(format!(
            "no x86_64 glibc in {} to build the root from",
            host.display()
        ));
        return false;
    }
    true
}

/// A root with glibc (Debian merged-usr layout) and /usr/bin/probe, a dlopen driver.
fn base_root(temp: &Path) -> PathBuf {
    let root = temp.join("root");
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    for name in GLIBC {
        std::fs::copy(
            Path::new("/lib/x86_64-linux-gnu").join(name),
            lib.join(name),
        )
        .unwrap();
    }
    std::fs::create_dir_all(root.join("usr/lib64")).unwrap();
    symlink("usr/lib", root.join("lib")).unwrap();
    symlink("usr/lib64", root.join("lib64")).unwrap();
    symlink(
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        root.join("usr/lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    build(
        &root.join("usr/bin"),
        &Lib {
            file: "probe",
            source: PROBE,
            executable: true,
            ..Default::default()
        },
    );
    root
}

/// What ld.so says about loading `libraries` (image paths) in the root.
fn loader(root: &Path, ld_library_path: Option<&str>, libraries: &[&str]) -> String {
    let mut command = Command::new(which("chroot").expect("chroot is installed"));
    command
        .env_clear()
        .arg(root)
        .arg("/usr/bin/probe")
        .args(libraries);
    if let Some(value) = ld_library_path {
        command.env("LD_LIBRARY_PATH", value);
    }
    let output = command.output().unwrap();
    String::from_utf8_lossy(&output.stdout).trim().to_string()
        + &String::from_utf8_lossy(&output.stderr)
}

fn kinds(root: &Path, options: &AuditOptions) -> Vec<FindingKind> {
    let report = audit(root, options).unwrap();
    eprintln!("{}", report.render());
    report.findings.iter().map(|f| f.kind).collect()
}

#[test]
fn runpath_origin_and_missing_needed() {
    if !can_chroot() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = base_root(temp.path());
    let dep = bare_lib(
        &root.join("opt/pkg/dep"),
        "libdep.so.1",
        "libdep.so.1",
        vec![],
        None,
    );
    bare_lib(
        &root.join("opt/pkg/lib"),
        "libtop.so.1",
        "libtop.so.1",
        vec![dep],
        Some("$ORIGIN/../dep"),
    );
    assert_eq!(kinds(&root, &AuditOptions::default()), vec![]);
    assert_eq!(loader(&root, None, &["/opt/pkg/lib/libtop.so.1"]), "OK");

    std::fs::remove_file(root.join("opt/pkg/dep/libdep.so.1")).unwrap();
    assert_eq!(
        kinds(&root, &AuditOptions::default()),
        vec![FindingKind::UnresolvedNeeded]
    );
    let said = loader(&root, None, &["/opt/pkg/lib/libtop.so.1"]);
    assert!(
        said.contains("libdep.so.1: cannot open shared object file"),
        "{said}"
    );
}

#[test]
fn ld_library_path_and_ld_so_conf() {
    if !can_chroot() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = base_root(temp.path());
    let dep = bare_lib(&root.join("opt/x"), "libx.so.1", "libx.so.1", vec![], None);
    bare_lib(
        &root.join("opt/app"),
        "libapp.so.1",
        "libapp.so.1",
        vec![dep],
        None,
    );

    assert_eq!(
        kinds(&root, &AuditOptions::default()),
        vec![FindingKind::UnresolvedNeeded]
    );
    assert!(loader(&root, None, &["/opt/app/libapp.so.1"]).starts_with("FAIL"));

    let with_path = AuditOptions::default().with_ld_library_path("/opt/x");
    assert_eq!(kinds(&root, &with_path), vec![]);
    assert_eq!(
        loader(&root, Some("/opt/x"), &["/opt/app/libapp.so.1"]),
        "OK"
    );

    // ld.so.conf.d, made effective the way an image build does: ldconfig -r ROOT.
    let Ok(ldconfig) = which("ldconfig") else {
        gate::skip("ldconfig", "ld.so.conf part: ldconfig not found");
        return;
    };
    std::fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/ld.so.conf.d/x.conf"), "/opt/x\n").unwrap();
    let status = Command::new(ldconfig)
        .arg("-r")
        .arg(&root)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(kinds(&root, &AuditOptions::default()), vec![]);
    assert_eq!(loader(&root, None, &["/opt/app/libapp.so.1"]), "OK");
}

#[test]
fn missing_symbol_version() {
    if !can_chroot() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = base_root(temp.path());
    let newer = build(
        &temp.path().join("build"),
        &Lib {
            file: "libver.so.1",
            soname: Some("libver.so.1"),
            source: "int old_fn(void) { return 1; }\nint new_fn(void) { return 2; }\n",
            version_script: Some(
                "VERS_1.0 { global: old_fn; local: *; };\nVERS_2.0 { global: new_fn; } VERS_1.0;\n",
            ),
            nostdlib: true,
            ..Default::default()
        },
    );
    let dir = root.join("opt/v");
    build(
        &dir,
        &Lib {
            file: "libver.so.1",
            soname: Some("libver.so.1"),
            source: "int old_fn(void) { return 1; }\n",
            version_script: Some("VERS_1.0 { global: old_fn; local: *; };\n"),
            nostdlib: true,
            ..Default::default()
        },
    );
    build(
        &dir,
        &Lib {
            file: "libuse.so.1",
            soname: Some("libuse.so.1"),
            link: vec![newer.clone()],
            runpath: Some("$ORIGIN"),
            source: "int new_fn(void);\nint use_it(void) { return new_fn(); }\n",
            nostdlib: true,
            ..Default::default()
        },
    );
    assert_eq!(
        kinds(&root, &AuditOptions::default()),
        vec![FindingKind::MissingSymbolVersion]
    );
    let said = loader(&root, None, &["/opt/v/libuse.so.1"]);
    assert!(said.contains("version `VERS_2.0' not found"), "{said}");

    std::fs::copy(&newer, dir.join("libver.so.1")).unwrap();
    assert_eq!(kinds(&root, &AuditOptions::default()), vec![]);
    assert_eq!(loader(&root, None, &["/opt/v/libuse.so.1"]), "OK");
}

fn which(program: &str) -> Result<PathBuf, ()> {
    for dir in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        let candidate = Path::new(dir).join(program);
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(())
}
