//! One copy of every library, on gcc-built libraries: identical copies merge in either
//! direction, differing copies are reported and left alone.

use crate::elf_support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use cudastack::audit::rootfs::{resolve_in_root, Resolution};
use cudastack::audit::{audit, AuditOptions};
use cudastack::install::dedup::{plan_one_copy, Keep};
use cudastack::install::{apply_entries, EntryContent};
use elf_support::{bare_lib, skip_without_gcc};

const WHEEL_LIB: &str = "/usr/local/lib/python3.11/site-packages/nvidia/cudnn/lib";
const TOOLKIT_LIB: &str = "/usr/local/cuda-12.1/targets/x86_64-linux/lib";

fn host(root: &Path, image: &str) -> PathBuf {
    root.join(image.trim_start_matches('/'))
}

/// Wheel: libcudnn.so.9 and libcudnn_ops.so.9 (regular files). Toolkit: the same cudnn as
/// libcudnn.so.9.1.0 with its chain, and a *different* libcudnn_ops.so.9.
fn root_with_two_copies(temp: &Path) -> PathBuf {
    let root = temp.join("root");
    let wheel = host(&root, WHEEL_LIB);
    let toolkit = host(&root, TOOLKIT_LIB);
    bare_lib(&wheel, "libcudnn.so.9", "libcudnn.so.9", vec![], None);
    bare_lib(
        &wheel,
        "libcudnn_ops.so.9",
        "libcudnn_ops.so.9",
        vec![],
        None,
    );
    std::fs::create_dir_all(&toolkit).unwrap();
    std::fs::copy(
        wheel.join("libcudnn.so.9"),
        toolkit.join("libcudnn.so.9.1.0"),
    )
    .unwrap();
    symlink("libcudnn.so.9.1.0", toolkit.join("libcudnn.so.9")).unwrap();
    symlink("libcudnn.so.9", toolkit.join("libcudnn.so")).unwrap();
    elf_support::build(
        &toolkit,
        &elf_support::Lib {
            file: "libcudnn_ops.so.9",
            soname: Some("libcudnn_ops.so.9"),
            source: "int other_build(void) { return 42; }\n",
            nostdlib: true,
            ..Default::default()
        },
    );
    root
}

#[test]
fn identical_copies_become_links_into_the_toolkit() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = root_with_two_copies(temp.path());
    let plan = plan_one_copy(
        &root,
        &[PathBuf::from(WHEEL_LIB)],
        Path::new(TOOLKIT_LIB),
        Keep::Toolkit,
    )
    .unwrap();
    assert_eq!(plan.entries.len(), 1, "{plan:?}");
    assert_eq!(
        plan.entries[0].path,
        PathBuf::from(format!("{WHEEL_LIB}/libcudnn.so.9"))
    );
    assert_eq!(
        plan.entries[0].content,
        EntryContent::Symlink {
            target: PathBuf::from(format!("{TOOLKIT_LIB}/libcudnn.so.9"))
        }
    );
    assert_eq!(
        plan.merged[0].toolkit_file,
        PathBuf::from(format!("{TOOLKIT_LIB}/libcudnn.so.9.1.0"))
    );
    assert_eq!(plan.differing.len(), 1);
    assert_eq!(
        plan.differing[0].wheel_file,
        PathBuf::from(format!("{WHEEL_LIB}/libcudnn_ops.so.9"))
    );

    let before = audit(&root, &AuditOptions::default()).unwrap();
    assert_eq!(before.findings.len(), 2, "{}", before.render());
    apply_entries(&plan.entries, None, &root).unwrap();
    assert_eq!(
        resolve_in_root(&root, Path::new(&format!("{WHEEL_LIB}/libcudnn.so.9"))).unwrap(),
        Resolution::Found(PathBuf::from(format!("{TOOLKIT_LIB}/libcudnn.so.9.1.0")))
    );
    // The differing libcudnn_ops copy is still a duplicate for the audit to explain.
    let after = audit(&root, &AuditOptions::default()).unwrap();
    assert_eq!(after.findings.len(), 1, "{}", after.render());
    assert!(after.findings[0].evidence.contains("the copies differ"));
    // Planning again finds nothing left to merge.
    let again = plan_one_copy(
        &root,
        &[PathBuf::from(WHEEL_LIB)],
        Path::new(TOOLKIT_LIB),
        Keep::Toolkit,
    )
    .unwrap();
    assert!(again.entries.is_empty());
}

#[test]
fn or_the_toolkit_points_at_the_wheel() {
    if skip_without_gcc() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let root = root_with_two_copies(temp.path());
    let plan = plan_one_copy(
        &root,
        &[PathBuf::from(WHEEL_LIB)],
        Path::new(TOOLKIT_LIB),
        Keep::Wheel,
    )
    .unwrap();
    assert_eq!(plan.entries.len(), 1);
    assert_eq!(
        plan.entries[0].path,
        PathBuf::from(format!("{TOOLKIT_LIB}/libcudnn.so.9.1.0"))
    );
    apply_entries(&plan.entries, None, &root).unwrap();
    // The toolkit chain now ends in the wheel's file.
    assert_eq!(
        resolve_in_root(&root, Path::new(&format!("{TOOLKIT_LIB}/libcudnn.so"))).unwrap(),
        Resolution::Found(PathBuf::from(format!("{WHEEL_LIB}/libcudnn.so.9")))
    );
}
