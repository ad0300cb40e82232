//! Issue 16: property tests of the wheel reader and installer. Wheels with arbitrary member
//! names (`..`, absolute paths, backslashes, drive letters, empty components, `.data`
//! schemes, duplicates) and arbitrary bytes are planned and installed into a temp root:
//! the installer errors or installs, never panics, and nothing lands outside the root.

use crate::install_support;

use std::io::Write;
use std::path::{Component, Path};

use cudastack::digest::Digest;
use cudastack::install::record::record_hash;
use cudastack::install::{install_wheel, plan_wheel, InstallOptions, PythonVersion, Scheme};
use proptest::prelude::*;

const WHEEL: &str = "demo_pkg-1.0-py3-none-any.whl";
const DIST_INFO: &str = "demo_pkg-1.0.dist-info";

fn options() -> InstallOptions {
    let python: PythonVersion = "3.11".parse().unwrap();
    InstallOptions::new(Scheme::posix_prefix(Path::new("/usr/local"), python))
}

fn member_name() -> impl Strategy<Value = String> {
    let part = prop::sample::select(vec![
        "demo_pkg",
        "..",
        ".",
        "",
        "a",
        "demo_pkg-1.0.data",
        "scripts",
        "purelib",
        "headers",
        "data",
        "nonsense",
        DIST_INFO,
        "C:",
        "x\\y",
        "entry_points.txt",
        "RECORD",
        "lib.so",
    ]);
    (any::<bool>(), prop::collection::vec(part, 1..5)).prop_map(|(absolute, parts)| {
        let name = parts.join("/");
        if absolute {
            format!("/{name}")
        } else {
            name
        }
    })
}

/// Write a wheel whose RECORD hashes every member truthfully (so planning gets past the
/// RECORD check to the path mapping). `None` when the zip writer refuses the names.
fn write_wheel(dir: &Path, members: &[(String, Vec<u8>)], record_all: bool) -> Option<()> {
    let mut all: Vec<(String, Vec<u8>)> = vec![
        (
            format!("{DIST_INFO}/WHEEL"),
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n".to_vec(),
        ),
        (
            format!("{DIST_INFO}/METADATA"),
            b"Name: demo-pkg\nVersion: 1.0\n".to_vec(),
        ),
    ];
    all.extend(members.iter().cloned());
    let mut record = String::new();
    for (name, bytes) in &all {
        if record_all || !name.contains("..") {
            record.push_str(&format!(
                "\"{}\",{},{}\n",
                name.replace('"', "\"\""),
                record_hash(&Digest::of_bytes(bytes)),
                bytes.len()
            ));
        }
    }
    record.push_str(&format!("{DIST_INFO}/RECORD,,\n"));
    all.push((format!("{DIST_INFO}/RECORD"), record.into_bytes()));
    let file = std::fs::File::create(dir.join(WHEEL)).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    for (name, bytes) in &all {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(0o755);
        zip.start_file(name.clone(), options).ok()?;
        zip.write_all(bytes).ok()?;
    }
    zip.finish().ok()?;
    Some(())
}

/// Every path under `dir`, relative, without following symlinks.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary member names and bytes: an error or an install whose every planned path is
    /// a normalised absolute path under the scheme's prefix, and whose files all land inside
    /// the root (the directory around the root holds nothing new).
    #[test]
    fn arbitrary_members_never_panic_or_escape(
        members in prop::collection::vec(
            (member_name(), prop::collection::vec(any::<u8>(), 0..64)),
            0..6,
        ),
        record_all in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let wheels = dir.path().join("wheels");
        let root = dir.path().join("root");
        std::fs::create_dir_all(&wheels).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        prop_assume!(write_wheel(&wheels, &members, record_all).is_some());
        let wheel = wheels.join(WHEEL);
        if let Ok(plan) = plan_wheel(&wheel, &options()) {
            for entry in &plan.entries {
                // Under the prefix, or one of its parent directories (planned as directories).
                prop_assert!(
                    entry.path.starts_with("/usr/local") || Path::new("/usr/local").starts_with(&entry.path),
                    "{}",
                    entry.path.display()
                );
                prop_assert!(
                    entry.path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
                    "{}",
                    entry.path.display()
                );
            }
        }
        let _ = install_wheel(&wheel, &options(), &root);
        let outside = tree(dir.path())
            .into_iter()
            .filter(|p| !p.starts_with("root") && !p.starts_with("wheels"))
            .collect::<Vec<_>>();
        prop_assert!(outside.is_empty(), "{outside:?}");
        for path in tree(&root) {
            prop_assert!(path.starts_with("usr/local") || path == "usr", "{path}");
        }
    }

    /// Arbitrary bytes as a wheel: an error, never a panic.
    #[test]
    fn arbitrary_archives_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048), eocd in any::<bool>()) {
        let mut bytes = bytes;
        if eocd && bytes.len() >= 22 {
            let at = bytes.len() - 22;
            bytes[at..at + 4].copy_from_slice(&[0x50, 0x4b, 0x05, 0x06]);
        }
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join(WHEEL);
        std::fs::write(&wheel, &bytes).unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        prop_assert!(install_wheel(&wheel, &options(), &root).is_err());
    }

    /// A valid wheel with bytes overwritten anywhere: an error or an install, never a panic
    /// or a file outside the root.
    #[test]
    fn mutated_wheels_never_panic_or_escape(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..10),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let wheels = dir.path().join("wheels");
        std::fs::create_dir_all(&wheels).unwrap();
        let path = install_support::write_wheel(
            &wheels,
            WHEEL,
            DIST_INFO,
            &install_support::demo_members(),
            &install_support::RecordTweaks::default(),
        );
        let mut bytes = std::fs::read(&path).unwrap();
        for (index, byte) in edits {
            let at = index.index(bytes.len());
            bytes[at] = byte;
        }
        std::fs::write(&path, &bytes).unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let _ = install_wheel(&path, &options(), &root);
        let outside = tree(dir.path())
            .into_iter()
            .filter(|p| !p.starts_with("root") && !p.starts_with("wheels"))
            .collect::<Vec<_>>();
        prop_assert!(outside.is_empty(), "{outside:?}");
    }
}
