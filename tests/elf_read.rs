//! ELF reading on real gcc-built libraries and executables.

use crate::elf_support;

use std::path::Path;

use cudastack::elf::chain::{plan_for_dir, scan_library_dir, LibraryEntryKind};
use cudastack::elf::{read_elf, ElfClass, ElfProbe, Machine, ObjectKind};
use elf_support::{build, skip_without_gcc, Lib};

#[test]
fn reads_soname_needed_runpath_and_glibc_versions() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let base = build(
        &temp.path().join("deps"),
        &Lib {
            file: "libbase.so.3.1.4",
            soname: Some("libbase.so.3"),
            ..Default::default()
        },
    );
    let top = build(
        &temp.path().join("lib"),
        &Lib {
            file: "libtop.so.1",
            soname: Some("libtop.so.1"),
            link: vec![base.clone()],
            runpath: Some("$ORIGIN/../deps:/opt/other"),
            source: "#include <string.h>\n#include <stdio.h>\nint f(char *d, const char *s, int n) { memcpy(d, s, n); return printf(\"%s\", d); }\n",
            ..Default::default()
        },
    );
    let info = read_elf(&top).unwrap().into_elf().expect("an ELF");
    assert_eq!(info.class, ElfClass::Elf64);
    if cfg!(target_arch = "x86_64") {
        assert_eq!(info.machine, Machine::X86_64);
    }
    assert_eq!(info.kind, ObjectKind::SharedObject);
    assert!(!info.is_executable());
    assert_eq!(info.soname.as_deref(), Some("libtop.so.1"));
    assert!(
        info.needed.contains(&"libbase.so.3".to_string()),
        "{:?}",
        info.needed
    );
    assert!(
        info.needed.contains(&"libc.so.6".to_string()),
        "{:?}",
        info.needed
    );
    assert_eq!(info.runpath, vec!["$ORIGIN/../deps", "/opt/other"]);
    assert!(info.rpath.is_empty());
    assert_eq!(
        info.expanded_runpath(Path::new("/usr/lib/top")),
        vec![Path::new("/usr/lib/deps"), Path::new("/opt/other")]
    );
    let libc_need = info
        .version_needs
        .iter()
        .find(|need| need.file == "libc.so.6")
        .expect("a verneed record for libc.so.6");
    assert!(libc_need.versions.iter().all(|v| v.starts_with("GLIBC_")));
    let min = info.min_glibc().expect("some GLIBC_ version is required");
    // x86_64 glibc symbols start at GLIBC_2.2.5 (aarch64 at 2.17).
    assert!(min >= "2.2.5".parse().unwrap(), "{min}");
}

#[test]
fn reads_rpath_and_executables() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let exe = build(
        temp.path(),
        &Lib {
            file: "tool",
            rpath: Some("/opt/lib"),
            executable: true,
            ..Default::default()
        },
    );
    let info = read_elf(&exe).unwrap().into_elf().unwrap();
    assert!(info.is_executable());
    assert!(info.interpreter.as_deref().unwrap().contains("ld-linux"));
    assert_eq!(info.rpath, vec!["/opt/lib"]);
    assert!(info.runpath.is_empty());
    assert!(info.soname.is_none());
}

#[test]
fn non_elf_files_are_reported_not_failed() {
    let temp = tempfile::tempdir().unwrap();
    let script = temp.path().join("libc.so");
    std::fs::write(&script, "/* GNU ld script */\nGROUP ( /lib/libc.so.6 )\n").unwrap();
    assert_eq!(read_elf(&script).unwrap(), ElfProbe::NotElf);
    let missing = read_elf(&temp.path().join("nope.so")).unwrap_err();
    assert!(missing.to_string().contains("nope.so"), "{missing}");
}

#[test]
fn chain_plan_from_real_wheel_style_directory() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("nvidia/cudnn/lib");
    // As the nvidia-cudnn wheel ships them: regular files named after their SONAME.
    build(
        &dir,
        &Lib {
            file: "libcudnn.so.9",
            soname: Some("libcudnn.so.9"),
            ..Default::default()
        },
    );
    build(
        &dir,
        &Lib {
            file: "libcudnn_ops.so.9",
            soname: Some("libcudnn_ops.so.9"),
            ..Default::default()
        },
    );
    // A fully versioned file (redist naming) without its links.
    build(
        &dir,
        &Lib {
            file: "libcublas.so.12.1.3.1",
            soname: Some("libcublas.so.12"),
            ..Default::default()
        },
    );
    std::fs::write(dir.join("__init__.py"), "").unwrap();

    let entries = scan_library_dir(&dir).unwrap();
    assert!(entries.iter().any(|e| e.name == "libcudnn.so.9"
        && e.kind
            == LibraryEntryKind::File {
                soname: Some("libcudnn.so.9".into())
            }));
    let plan = plan_for_dir(&dir).unwrap();
    assert_eq!(
        plan,
        vec![
            (dir.join("libcublas.so"), "libcublas.so.12".to_string()),
            (
                dir.join("libcublas.so.12"),
                "libcublas.so.12.1.3.1".to_string()
            ),
            (dir.join("libcudnn.so"), "libcudnn.so.9".to_string()),
            (dir.join("libcudnn_ops.so"), "libcudnn_ops.so.9".to_string()),
        ]
    );
    // Carry the plan out; the directory is then complete and plans nothing more.
    for (link, target) in &plan {
        std::os::unix::fs::symlink(target, link).unwrap();
    }
    assert!(plan_for_dir(&dir).unwrap().is_empty());
    let through_chain = read_elf(&dir.join("libcublas.so"))
        .unwrap()
        .into_elf()
        .unwrap();
    assert_eq!(through_chain.soname.as_deref(), Some("libcublas.so.12"));
}

#[test]
fn reads_version_definitions_and_needs() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let provider = build(
        &temp.path().join("v"),
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
    let info = read_elf(&provider).unwrap().into_elf().unwrap();
    assert_eq!(info.version_definitions, vec!["VERS_1.0", "VERS_2.0"]);
    assert!(info.glibc_provided().is_none());

    let user = build(
        &temp.path().join("u"),
        &Lib {
            file: "libuser.so",
            soname: Some("libuser.so"),
            link: vec![provider],
            source: "int new_fn(void);\nint use(void) { return new_fn(); }\n",
            nostdlib: true,
            ..Default::default()
        },
    );
    let info = read_elf(&user).unwrap().into_elf().unwrap();
    assert_eq!(
        info.version_needs,
        vec![cudastack::elf::VersionNeed {
            file: "libver.so.1".into(),
            versions: vec!["VERS_2.0".into()]
        }]
    );

    // The host's glibc defines its release as the newest GLIBC_ version.
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    if libc.exists() {
        let info = read_elf(libc).unwrap().into_elf().unwrap();
        let provided = info.glibc_provided().unwrap();
        assert!(provided >= "2.17".parse().unwrap(), "{provided}");
        assert!(info
            .version_definitions
            .contains(&"GLIBC_2.2.5".to_string()));
    }
}

/// A `Read + Seek` that counts the bytes read, to prove large libraries are not read whole.
struct CountingReader {
    inner: std::fs::File,
    bytes: std::rc::Rc<std::cell::Cell<u64>>,
}

impl std::io::Read for CountingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.set(self.bytes.get() + n as u64);
        Ok(n)
    }
}

impl std::io::Seek for CountingReader {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(pos)
    }
}

#[test]
fn large_libraries_are_not_read_whole() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    // 64 MiB of initialised data, like the device code in a CUDA library.
    let big = build(
        temp.path(),
        &Lib {
            file: "libbig.so.1",
            soname: Some("libbig.so.1"),
            runpath: Some("$ORIGIN"),
            source: "char payload[64 << 20] = {1};\nint first(void) { return payload[0]; }\n",
            ..Default::default()
        },
    );
    let size = std::fs::metadata(&big).unwrap().len();
    assert!(size > 64 << 20);
    let bytes = std::rc::Rc::new(std::cell::Cell::new(0));
    let reader = CountingReader {
        inner: std::fs::File::open(&big).unwrap(),
        bytes: bytes.clone(),
    };
    let info = cudastack::elf::read_elf_from(reader, &big)
        .unwrap()
        .into_elf()
        .unwrap();
    assert_eq!(info.soname.as_deref(), Some("libbig.so.1"));
    assert_eq!(info.runpath, vec!["$ORIGIN"]);
    eprintln!("read {} of {size} bytes", bytes.get());
    assert!(
        bytes.get() < 1 << 20,
        "read {} of {size} bytes",
        bytes.get()
    );
}
