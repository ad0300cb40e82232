//! Real ELF fixtures for the elf, audit and install tests: small C libraries and
//! executables compiled with the system gcc, with the SONAME / NEEDED / RPATH / RUNPATH
//! each test asks for. Nothing is faked: the bytes come from gcc and ld.
#![allow(dead_code)]

pub(crate) use crate::gate;

use std::path::{Path, PathBuf};
use std::process::Command;

/// What to build.
#[derive(Default, Clone)]
pub struct Lib<'a> {
    /// Output file name, e.g. `libfoo.so.1.2.3`.
    pub file: &'a str,
    pub soname: Option<&'a str>,
    /// Libraries to link against, as full paths to existing .so files (each becomes a
    /// DT_NEEDED of its SONAME).
    pub link: Vec<PathBuf>,
    /// DT_RUNPATH entries (new dtags).
    pub runpath: Option<&'a str>,
    /// DT_RPATH entries (old dtags). Only one of runpath/rpath may be set.
    pub rpath: Option<&'a str>,
    /// C source; a default function is used when empty.
    pub source: &'a str,
    /// Build an executable instead of a shared library.
    pub executable: bool,
    /// Link without the C library (no `libc.so.6` NEEDED), so an image root needs no libc.
    pub nostdlib: bool,
    /// A GNU ld version script (its text), to define versioned symbols.
    pub version_script: Option<&'a str>,
}

pub fn gcc_available() -> bool {
    Command::new("gcc")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Skip (return true after reporting it through the gate) when gcc is missing.
pub fn skip_without_gcc() -> bool {
    if gcc_available() {
        false
    } else {
        gate::skip(
            "gcc",
            "gcc is not installed; these tests compile real ELF fixtures with it",
        );
        true
    }
}

/// Compile `lib` into `dir`, returning the output path.
pub fn build(dir: &Path, lib: &Lib) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let output = dir.join(lib.file);
    let unique = output.to_string_lossy().replace(['/', '.'], "_");
    let source_path = std::env::temp_dir().join(format!("cudastack_fixture_{unique}.c"));
    let default_source = if lib.executable && lib.nostdlib {
        "void _start(void) { for (;;) {} }\n"
    } else if lib.executable {
        "#include <stdio.h>\nint main(void) { puts(\"fixture\"); return 0; }\n"
    } else {
        "int cudastack_fixture(int x) { return x + 1; }\n"
    };
    let source = if lib.source.is_empty() {
        default_source
    } else {
        lib.source
    };
    std::fs::write(&source_path, source).unwrap();
    let mut command = Command::new("gcc");
    if !lib.executable {
        command.args(["-shared", "-fPIC"]);
    }
    if lib.nostdlib {
        command.arg("-nostdlib");
    }
    let script_path = source_path.with_extension("map");
    if let Some(script) = lib.version_script {
        std::fs::write(&script_path, script).unwrap();
        command.arg(format!("-Wl,--version-script={}", script_path.display()));
    }
    command.arg("-o").arg(&output).arg(&source_path);
    if let Some(soname) = lib.soname {
        command.arg(format!("-Wl,-soname,{soname}"));
    }
    // Link against each dependency by path so its SONAME becomes the DT_NEEDED, and keep
    // the NEEDED even though the fixture calls nothing from it.
    command.arg("-Wl,--no-as-needed");
    for dependency in &lib.link {
        command.arg(dependency);
    }
    if let Some(runpath) = lib.runpath {
        command
            .arg("-Wl,--enable-new-dtags")
            .arg(format!("-Wl,-rpath,{runpath}"));
    }
    if let Some(rpath) = lib.rpath {
        command
            .arg("-Wl,--disable-new-dtags")
            .arg(format!("-Wl,-rpath,{rpath}"));
    }
    let result = command.output().expect("run gcc");
    assert!(
        result.status.success(),
        "gcc failed for {}: {}",
        lib.file,
        String::from_utf8_lossy(&result.stderr)
    );
    let _ = std::fs::remove_file(&source_path);
    let _ = std::fs::remove_file(&script_path);
    output
}

/// Build a library with no libc dependency (the audit fixtures' default).
pub fn bare_lib(
    dir: &Path,
    file: &str,
    soname: &str,
    link: Vec<PathBuf>,
    runpath: Option<&str>,
) -> PathBuf {
    build(
        dir,
        &Lib {
            file,
            soname: Some(soname),
            link,
            runpath,
            nostdlib: true,
            ..Default::default()
        },
    )
}

/// The audit of the tree at `root`, read twice: from the tree, and from the facts recorded
/// of it (through their JSON, as the build keeps a stack layer's facts). The two reports
/// must be the same, so every audit test also proves the recorded facts answer as the tree.
pub fn audit(
    root: &Path,
    options: &cudastack::audit::AuditOptions,
) -> Result<cudastack::audit::AuditReport, cudastack::audit::AuditError> {
    use cudastack::audit::{audit_image, DirFs, FactsFs, LayerFacts};
    let report = cudastack::audit::audit(root, options)?;
    let facts = LayerFacts::read(&DirFs::new(root)).expect("facts of the tree");
    let facts = LayerFacts::from_json(&facts.to_json()).expect("facts read back");
    let from_facts = audit_image(&FactsFs::new(facts), options).expect("audit of the facts");
    assert_eq!(
        from_facts, report,
        "the facts answer otherwise than the tree"
    );
    Ok(report)
}
