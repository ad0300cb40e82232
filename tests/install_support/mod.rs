//! Build real wheel archives (zip files with a RECORD computed like `bdist_wheel` does)
//! for the installer and audit tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use cudastack::digest::Digest;
use cudastack::install::record::record_hash;

pub struct Member {
    pub name: String,
    pub bytes: Vec<u8>,
    pub mode: u32,
}

pub fn member(name: &str, bytes: impl AsRef<[u8]>) -> Member {
    Member {
        name: name.to_string(),
        bytes: bytes.as_ref().to_vec(),
        mode: 0o644,
    }
}

pub fn executable(name: &str, bytes: impl AsRef<[u8]>) -> Member {
    Member {
        mode: 0o755,
        ..member(name, bytes)
    }
}

/// How to write RECORD.
#[derive(Default)]
pub struct RecordTweaks<'a> {
    /// Members left out of RECORD.
    pub omit: Vec<&'a str>,
    /// Rows added to RECORD for files the archive does not hold.
    pub phantom: Vec<&'a str>,
    /// (member, bytes) recorded instead of the member's real bytes (a tampered member).
    pub recorded_as: Vec<(&'a str, &'a [u8])>,
}

/// Write `dir/file_name` holding `members` (in the given order) plus
/// `<dist_info>/RECORD`, and return its path.
pub fn write_wheel(
    dir: &Path,
    file_name: &str,
    dist_info: &str,
    members: &[Member],
    tweaks: &RecordTweaks,
) -> PathBuf {
    let path = dir.join(file_name);
    let mut record = String::new();
    for m in members {
        if tweaks.omit.contains(&m.name.as_str()) {
            continue;
        }
        let bytes = tweaks
            .recorded_as
            .iter()
            .find(|(name, _)| *name == m.name)
            .map(|(_, bytes)| bytes.to_vec())
            .unwrap_or_else(|| m.bytes.clone());
        record.push_str(&format!(
            "{},{},{}\n",
            m.name,
            record_hash(&Digest::of_bytes(&bytes)),
            bytes.len()
        ));
    }
    for phantom in &tweaks.phantom {
        record.push_str(&format!(
            "{phantom},{},0\n",
            record_hash(&Digest::of_bytes(b""))
        ));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));

    let file = std::fs::File::create(&path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    for m in members {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(m.mode);
        zip.start_file(m.name.clone(), options).unwrap();
        zip.write_all(&m.bytes).unwrap();
    }
    zip.start_file(
        format!("{dist_info}/RECORD"),
        zip::write::SimpleFileOptions::default(),
    )
    .unwrap();
    zip.write_all(record.as_bytes()).unwrap();
    zip.finish().unwrap();
    path
}

/// The members of a small but complete wheel `demo_pkg-1.0`.
pub fn demo_members() -> Vec<Member> {
    vec![
        member("demo_pkg/__init__.py", "VERSION = '1.0'\n"),
        member(
            "demo_pkg/cli.py",
            "def main():\n    print('demo')\n    return 0\n",
        ),
        executable("demo_pkg/bin/tool.sh", "#!/bin/sh\necho tool\n"),
        executable(
            "demo_pkg-1.0.data/scripts/demo-script",
            "#!python\nimport demo_pkg\nprint(demo_pkg.VERSION)\n",
        ),
        member(
            "demo_pkg-1.0.data/data/share/demo/readme.txt",
            "data file\n",
        ),
        member("demo_pkg-1.0.data/headers/demo.h", "#define DEMO 1\n"),
        member(
            "demo_pkg-1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        ),
        member(
            "demo_pkg-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: cudastack-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        ),
        member(
            "demo_pkg-1.0.dist-info/entry_points.txt",
            "[console_scripts]\ndemo = demo_pkg.cli:main\n\n[gui_scripts]\ndemo-gui = demo_pkg.cli:main\n",
        ),
    ]
}
