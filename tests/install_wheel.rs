//! The native wheel installer on real wheel archives: layout, modes, RECORD, launchers,
//! determinism, tamper and path-safety rejections, and a byte comparison against pip.

use crate::gate;
use crate::install_support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cudastack::digest::Digest;
use cudastack::install::record::parse_record;
use cudastack::install::{
    install_wheel, plan_wheel, EntryContent, InstallError, InstallOptions, PythonVersion, Scheme,
};
use install_support::{demo_members, member, write_wheel, RecordTweaks};

const WHEEL: &str = "demo_pkg-1.0-py3-none-any.whl";
const DIST_INFO: &str = "demo_pkg-1.0.dist-info";

fn options() -> InstallOptions {
    let python: PythonVersion = "3.11".parse().unwrap();
    InstallOptions::new(Scheme::posix_prefix(Path::new("/usr/local"), python))
}

/// Every file / symlink under `root`: relative path -> (mode, content digest or link target).
fn snapshot(root: &Path) -> BTreeMap<String, (u32, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, String)>) {
        let mut items: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        items.sort_by_key(|e| e.file_name());
        for item in items {
            let path = item.path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            let mode = metadata.permissions().mode() & 0o7777;
            if metadata.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(relative, (0o777, target.to_string_lossy().into_owned()));
            } else if metadata.is_dir() {
                out.insert(format!("{relative}/"), (mode, String::new()));
                walk(root, &path, out);
            } else {
                let digest = Digest::of_bytes(&std::fs::read(&path).unwrap());
                out.insert(relative, (mode, digest.to_string()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn installs_layout_modes_scripts_and_record() {
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks::default(),
    );
    let root = temp.path().join("root");
    let plan = install_wheel(&wheel, &options(), &root).unwrap();
    assert_eq!(plan.distribution, "demo_pkg");
    assert_eq!(plan.version, "1.0");
    let site = root.join("usr/local/lib/python3.11/site-packages");
    assert_eq!(
        plan.dist_info,
        PathBuf::from("/usr/local/lib/python3.11/site-packages").join(DIST_INFO)
    );

    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        std::fs::read_to_string(site.join("demo_pkg/__init__.py")).unwrap(),
        "VERSION = '1.0'\n"
    );
    assert_eq!(mode(&site.join("demo_pkg/__init__.py")), 0o644);
    assert_eq!(mode(&site.join("demo_pkg/bin/tool.sh")), 0o755);
    assert_eq!(mode(&site.join("demo_pkg")), 0o755);

    // .data mapping.
    let script = root.join("usr/local/bin/demo-script");
    assert_eq!(
        std::fs::read_to_string(&script).unwrap(),
        "#!/usr/bin/python3\nimport demo_pkg\nprint(demo_pkg.VERSION)\n"
    );
    assert_eq!(mode(&script), 0o755);
    assert_eq!(
        std::fs::read_to_string(root.join("usr/local/share/demo/readme.txt")).unwrap(),
        "data file\n"
    );
    assert!(root
        .join("usr/local/include/python3.11/demo-pkg/demo.h")
        .is_file());
    assert!(!site.join("demo_pkg-1.0.data").exists());

    // Launchers.
    let launcher = std::fs::read_to_string(root.join("usr/local/bin/demo")).unwrap();
    assert!(launcher.starts_with("#!/usr/bin/python3\n"), "{launcher}");
    assert!(launcher.contains("from demo_pkg.cli import main\n"));
    assert_eq!(mode(&root.join("usr/local/bin/demo")), 0o755);
    assert!(root.join("usr/local/bin/demo-gui").is_file());

    // INSTALLER and RECORD: every installed file listed once with its real hash and size.
    let dist_info = site.join(DIST_INFO);
    assert_eq!(
        std::fs::read_to_string(dist_info.join("INSTALLER")).unwrap(),
        "cudastack\n"
    );
    let record = std::fs::read_to_string(dist_info.join("RECORD")).unwrap();
    let rows = parse_record(&record).unwrap();
    let mut listed = Vec::new();
    for row in &rows {
        let on_disk = site.join(&row.path);
        listed.push(
            std::path::absolute(&on_disk)
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        );
        if row.path == format!("{DIST_INFO}/RECORD") {
            assert!(row.hash.is_none() && row.size.is_none());
            continue;
        }
        let bytes = std::fs::read(&on_disk).unwrap_or_else(|_| panic!("{} listed", row.path));
        assert_eq!(row.hash, Some(Digest::of_bytes(&bytes)), "{}", row.path);
        assert_eq!(row.size, Some(bytes.len() as u64), "{}", row.path);
    }
    assert!(record.contains("../../../bin/demo,sha256="), "{record}");
    let mut sorted = rows.iter().map(|r| r.path.clone()).collect::<Vec<_>>();
    sorted.sort();
    assert_eq!(
        sorted,
        rows.iter().map(|r| r.path.clone()).collect::<Vec<_>>()
    );
    // Files on disk == files in RECORD.
    let files_on_disk = snapshot(&root)
        .into_keys()
        .filter(|p| !p.ends_with('/'))
        .count();
    assert_eq!(files_on_disk, rows.len());
}

#[test]
fn output_is_independent_of_member_order() {
    let temp = tempfile::tempdir().unwrap();
    let a_dir = temp.path().join("a");
    let b_dir = temp.path().join("b");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let members = demo_members();
    let mut reversed = demo_members();
    reversed.reverse();
    let wheel_a = write_wheel(&a_dir, WHEEL, DIST_INFO, &members, &RecordTweaks::default());
    let wheel_b = write_wheel(
        &b_dir,
        WHEEL,
        DIST_INFO,
        &reversed,
        &RecordTweaks::default(),
    );
    assert_ne!(
        std::fs::read(&wheel_a).unwrap(),
        std::fs::read(&wheel_b).unwrap()
    );

    let plan_a = plan_wheel(&wheel_a, &options()).unwrap();
    let plan_b = plan_wheel(&wheel_b, &options()).unwrap();
    let shape = |plan: &cudastack::install::InstallPlan| {
        plan.entries
            .iter()
            .map(|e| {
                let content = match &e.content {
                    EntryContent::ZipMember { digest, size, .. } => format!("{digest}/{size}"),
                    EntryContent::Generated { digest, .. } => digest.to_string(),
                    EntryContent::Directory => "dir".into(),
                    EntryContent::Symlink { target } => target.display().to_string(),
                };
                (e.path.clone(), e.mode, content)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&plan_a), shape(&plan_b));
    let mut paths: Vec<_> = plan_a.entries.iter().map(|e| e.path.clone()).collect();
    paths.sort();
    assert_eq!(
        paths,
        plan_a
            .entries
            .iter()
            .map(|e| e.path.clone())
            .collect::<Vec<_>>()
    );

    install_wheel(&wheel_a, &options(), &temp.path().join("root_a")).unwrap();
    install_wheel(&wheel_b, &options(), &temp.path().join("root_b")).unwrap();
    assert_eq!(
        snapshot(&temp.path().join("root_a")),
        snapshot(&temp.path().join("root_b"))
    );
}

#[test]
fn tampered_member_fails_while_extracting() {
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks {
            recorded_as: vec![(
                "demo_pkg/cli.py",
                b"def main():\n    print('DEMO')\n    return 0\n".as_slice(),
            )],
            ..Default::default()
        },
    );
    let root = temp.path().join("root");
    let error = install_wheel(&wheel, &options(), &root).unwrap_err();
    assert!(
        matches!(&error, InstallError::HashMismatch { member, .. } if member == "demo_pkg/cli.py"),
        "{error}"
    );
    let message = error.to_string();
    let original = b"def main():\n    print('DEMO')\n    return 0\n";
    let tampered = b"def main():\n    print('demo')\n    return 0\n";
    assert!(
        message.contains(&format!(
            "Expected: {} ({} bytes)",
            Digest::of_bytes(original),
            original.len()
        )),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "Found:    {} ({} bytes)",
            Digest::of_bytes(tampered),
            tampered.len()
        )),
        "{message}"
    );
    // The bad file is not left behind.
    assert!(!root
        .join("usr/local/lib/python3.11/site-packages/demo_pkg/cli.py")
        .exists());
}

#[test]
fn tampered_script_fails_at_planning() {
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks {
            recorded_as: vec![(
                "demo_pkg-1.0.data/scripts/demo-script",
                b"#!python\n".as_slice(),
            )],
            ..Default::default()
        },
    );
    let error = plan_wheel(&wheel, &options()).unwrap_err();
    assert!(
        matches!(error, InstallError::HashMismatch { .. }),
        "{error}"
    );
}

fn plan_error(members: Vec<install_support::Member>, tweaks: RecordTweaks) -> InstallError {
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(temp.path(), WHEEL, DIST_INFO, &members, &tweaks);
    plan_wheel(&wheel, &options()).unwrap_err()
}

#[test]
fn unsafe_paths_are_rejected() {
    for (name, reason) in [
        ("../evil.py", "`..` path component"),
        ("demo_pkg/../../evil.py", "`..` path component"),
        (
            "demo_pkg-1.0.data/purelib/../../../evil.py",
            "`..` path component",
        ),
        ("/etc/evil.py", "absolute path"),
        ("demo_pkg\\..\\evil.py", "backslash in path"),
    ] {
        let mut members = demo_members();
        members.push(member(name, "x = 1\n"));
        let error = plan_error(members, RecordTweaks::default());
        assert!(
            matches!(&error, InstallError::UnsafePath { member, reason: r, .. } if member == name && *r == reason),
            "{name}: {error}"
        );
    }
}

#[test]
fn record_must_match_the_archive() {
    let error = plan_error(
        demo_members(),
        RecordTweaks {
            omit: vec!["demo_pkg/cli.py"],
            ..Default::default()
        },
    );
    assert!(
        matches!(&error, InstallError::NotInRecord { member, .. } if member == "demo_pkg/cli.py"),
        "{error}"
    );
    let error = plan_error(
        demo_members(),
        RecordTweaks {
            phantom: vec!["demo_pkg/ghost.py"],
            ..Default::default()
        },
    );
    assert!(
        matches!(&error, InstallError::RecordedButMissing { member, .. } if member == "demo_pkg/ghost.py"),
        "{error}"
    );
}

#[test]
fn duplicates_are_rejected() {
    // Two members that land on the same file through the .data mapping.
    let mut members = demo_members();
    members.push(member(
        "demo_pkg-1.0.data/purelib/demo_pkg/cli.py",
        "other\n",
    ));
    let error = plan_error(members, RecordTweaks::default());
    assert!(
        matches!(error, InstallError::DuplicateDestination { .. }),
        "{error}"
    );

    // The same name twice in the archive: zip writers refuse this, so patch the name bytes
    // of a second member (local header and central directory) into the first's.
    let temp = tempfile::tempdir().unwrap();
    let mut members = demo_members();
    members.push(member("demo_pkg/dup_B.py", "b\n"));
    members.push(member("demo_pkg/dup_A.py", "a\n"));
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &members,
        &RecordTweaks::default(),
    );
    let bytes = std::fs::read(&wheel).unwrap();
    let patched = replace_all(&bytes, b"demo_pkg/dup_B.py", b"demo_pkg/dup_A.py");
    std::fs::write(&wheel, patched).unwrap();
    let error = plan_wheel(&wheel, &options()).unwrap_err();
    assert!(
        matches!(error, InstallError::DuplicateNames { .. }),
        "{error}"
    );
}

fn replace_all(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = haystack.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn symlink_members_and_bad_wheel_versions_are_rejected() {
    use std::io::Write;
    let temp = tempfile::tempdir().unwrap();
    let path = temp.path().join(WHEEL);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    zip.add_symlink(
        "demo_pkg/link",
        "/etc/passwd",
        zip::write::SimpleFileOptions::default(),
    )
    .unwrap();
    zip.start_file(
        format!("{DIST_INFO}/WHEEL"),
        zip::write::SimpleFileOptions::default(),
    )
    .unwrap();
    zip.write_all(b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n")
        .unwrap();
    zip.finish().unwrap();
    let error = plan_wheel(&path, &options()).unwrap_err();
    assert!(
        matches!(error, InstallError::SymlinkMember { .. }),
        "{error}"
    );

    let mut members = demo_members();
    for m in members.iter_mut() {
        if m.name.ends_with("/WHEEL") {
            m.bytes = b"Wheel-Version: 2.0\nRoot-Is-Purelib: true\n".to_vec();
        }
    }
    let error = plan_error(members, RecordTweaks::default());
    assert!(
        matches!(error, InstallError::UnsupportedWheelVersion { .. }),
        "{error}"
    );
}

/// Install the same wheel with pip into a fresh virtual environment and with cudastack into
/// a root at the same prefix, using the venv's interpreter in our launchers: the files pip's
/// RECORD lists (except its own bookkeeping: INSTALLER, RECORD, REQUESTED, direct_url.json)
/// must be exactly the files ours lists, byte for byte. A venv keeps the comparison free of
/// distribution patches to pip's `--prefix` schemes (Debian's `posix_local`).
#[test]
fn matches_pip_byte_for_byte() {
    let temp = tempfile::tempdir().unwrap();
    let venv = temp.path().join("venv");
    let created = std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output();
    if !created.as_ref().is_ok_and(|o| o.status.success()) {
        gate::skip(
            "python3-venv",
            "`python3 -m venv` is not available; cannot compare against pip",
        );
        return;
    }
    let python = venv.join("bin/python");
    let version = std::process::Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_python_version())",
        ])
        .output()
        .unwrap();
    let version: PythonVersion = String::from_utf8(version.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks::default(),
    );
    let status = std::process::Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "--no-index",
            "--disable-pip-version-check",
            "--quiet",
        ])
        .arg(&wheel)
        .status()
        .unwrap();
    assert!(status.success());

    let ours_root = temp.path().join("ours");
    let mut options = InstallOptions::new(Scheme::venv(&venv, version));
    options.python = python.to_string_lossy().into_owned();
    let plan = install_wheel(&wheel, &options, &ours_root).unwrap();

    let site = venv.join(format!("lib/python{version}/site-packages"));
    let bookkeeping = ["INSTALLER", "RECORD", "REQUESTED", "direct_url.json"];
    let listed = |record: &Path| {
        let text = std::fs::read_to_string(record).unwrap();
        let mut paths: Vec<PathBuf> = parse_record(&text)
            .unwrap()
            .into_iter()
            .filter(|row| {
                !bookkeeping
                    .iter()
                    .any(|b| row.path == format!("{DIST_INFO}/{b}"))
            })
            .map(|row| cudastack::elf::normalize_lexically(&site.join(&row.path)))
            .collect();
        paths.sort();
        paths
    };
    let pip_files = listed(&site.join(DIST_INFO).join("RECORD"));
    let ours_files = listed(
        &ours_root
            .join(plan.dist_info.strip_prefix("/").unwrap())
            .join("RECORD"),
    );
    assert_eq!(pip_files, ours_files, "same files");
    // 9 wheel files (RECORD aside) and 2 launchers.
    assert_eq!(pip_files.len(), 11, "{pip_files:?}");
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode();
    for path in &pip_files {
        let ours = ours_root.join(path.strip_prefix("/").unwrap());
        assert_eq!(
            std::fs::read(path).unwrap(),
            std::fs::read(&ours).unwrap(),
            "content of {}",
            path.display()
        );
        // pip's regular files follow the umask; compare the owner's x bit.
        assert_eq!(
            mode(path) & 0o100,
            mode(&ours) & 0o100,
            "x bit of {}",
            path.display()
        );
    }
}

#[test]
fn recorded_size_mismatch_fails_at_planning() {
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks {
            recorded_as: vec![("demo_pkg/__init__.py", b"VERSION = '1.0.0'\n".as_slice())],
            ..Default::default()
        },
    );
    let error = plan_wheel(&wheel, &options()).unwrap_err();
    assert!(
        matches!(&error, InstallError::HashMismatch { member, expected, found, .. }
            if member == "demo_pkg/__init__.py" && expected == "18 bytes" && found == "16 bytes"),
        "{error}"
    );
}

/// A layer writer's view: stream every file entry of a plan straight from the wheel, without
/// staging on disk, and get the same bytes install_to_dir writes.
#[test]
fn plan_entries_stream_without_extraction() {
    use std::io::Read;
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks::default(),
    );
    let root = temp.path().join("root");
    let plan = install_wheel(&wheel, &options(), &root).unwrap();
    let mut reader = cudastack::install::WheelReader::open(&wheel).unwrap();
    let mut files = 0;
    for entry in &plan.entries {
        let Some(mut stream) = reader.open_content(&entry.content).unwrap() else {
            continue;
        };
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).unwrap();
        assert_eq!(Some(bytes.len() as u64), entry.content.size());
        let on_disk = std::fs::read(root.join(entry.path.strip_prefix("/").unwrap())).unwrap();
        assert_eq!(bytes, on_disk, "{}", entry.path.display());
        files += 1;
    }
    // 9 wheel files, 2 launchers, INSTALLER and RECORD.
    assert_eq!(files, 13);
}

/// A symlinked directory in the target root (e.g. a base image's `/usr/local/lib -> ...`)
/// could redirect writes outside the root: the installer refuses and writes nothing there.
#[test]
fn refuses_to_write_through_symlinks_in_the_root() {
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks::default(),
    );
    let outside = temp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let root = temp.path().join("root");
    std::fs::create_dir_all(root.join("usr/local")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("usr/local/lib")).unwrap();
    let error = install_wheel(&wheel, &options(), &root).unwrap_err();
    assert!(
        matches!(&error, InstallError::SymlinkInRoot { symlink, .. } if symlink == Path::new("/usr/local/lib")),
        "{error}"
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}

#[test]
fn interpreter_must_fit_a_shebang() {
    let temp = tempfile::tempdir().unwrap();
    let wheel = write_wheel(
        temp.path(),
        WHEEL,
        DIST_INFO,
        &demo_members(),
        &RecordTweaks::default(),
    );
    for python in [
        "python3",
        "/opt/my python/bin/python3",
        &format!("/{}", "p".repeat(130)),
    ] {
        let mut options = options();
        options.python = python.to_string();
        let error = plan_wheel(&wheel, &options).unwrap_err();
        assert!(
            matches!(error, InstallError::BadInterpreter { .. }),
            "{python}: {error}"
        );
    }
}
