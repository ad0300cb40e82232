//! Property tests for the archive readers of the assemblers (issue 16, "Trust"): the
//! toolkit stage unpacks nvidia-* wheels (zip archives whose member names and bytes come
//! from an index) into a staging directory, and the layer writer turns trees into tars.
//! Whatever the bytes: no panic, and nothing is written outside the target directory; a
//! layer built from any accepted entries holds only relative paths without `..`.
//! Bounded case counts keep these quick.

use std::io::Write;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use cudastack::cache::BlobStore;
use cudastack::layer::{
    self, BuildOptions, Compression, Entry, EntryKind, LayerContents, LayerPath,
};
use cudastack::platform::Platform;
use cudastack::recipe::Flavor;
use cudastack::stack::layers::toolkit::layout::ToolkitPaths;
use cudastack::stack::layers::toolkit::layout::{stage, NvidiaWheel};
use cudastack::version::CudaVersion;

/// Everything under `dir`, as paths relative to it (symlinks not followed).
fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path.clone());
            }
            out.push(path.strip_prefix(dir).unwrap().to_path_buf());
        }
    }
    out.sort();
    out
}

/// Member names that reach every branch of the toolkit's mapping, and hostile ones.
fn member_name() -> impl Strategy<Value = String> {
    let segment = prop_oneof![
        Just("..".to_string()),
        Just(".".to_string()),
        Just(String::new()),
        Just("libcudnn.so.9".to_string()),
        Just("etc".to_string()),
        "[a-z0-9._/\\\\-]{1,12}",
    ];
    let prefix = prop_oneof![
        Just("nvidia/cudnn/lib/"),
        Just("nvidia/cuda_runtime/include/"),
        Just("nvidia/cuda_nvcc/bin/"),
        Just("nvidia/x/nvvm/"),
        Just("/"),
        Just("../"),
        Just(""),
    ];
    (prefix, prop::collection::vec(segment, 0..4))
        .prop_map(|(prefix, parts)| format!("{prefix}{}", parts.join("/")))
}

fn zip_of(members: &[(String, Vec<u8>, u32)]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes, mode) in members {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .unix_permissions(*mode);
        if writer.start_file(name.as_str(), options).is_err() {
            continue;
        }
        writer.write_all(bytes).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

fn stage_bytes(wheel_bytes: &[u8], flavor: Flavor, cudnn: bool) {
    let work = tempfile::tempdir().unwrap();
    let wheel_path = work.path().join("wheel.whl");
    std::fs::write(&wheel_path, wheel_bytes).unwrap();
    let root = work.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let wheel = NvidiaWheel {
        path: wheel_path,
        project: if cudnn {
            "nvidia-cudnn-cu12"
        } else {
            "nvidia-cuda-runtime-cu12"
        }
        .into(),
        version: "12.1.105".into(),
    };
    let paths = ToolkitPaths::new(CudaVersion::new(12, 1, None), Platform::LinuxAmd64);
    // Ok or Err, both fine: what matters is no panic and nothing outside `root`.
    let mut members = cudastack::stack::layers::WheelMembers::default();
    let _ = stage(&[&wheel], &paths, flavor, true, &root, &mut members);
    let outside: Vec<PathBuf> = listing(work.path())
        .into_iter()
        .filter(|p| p != Path::new("wheel.whl") && !p.starts_with("root"))
        .collect();
    assert!(
        outside.is_empty(),
        "written outside the staging root: {outside:?}"
    );
    // No link inside points out of the root either (a later writer could follow it).
    for relative in listing(&root) {
        let path = root.join(&relative);
        if let Ok(target) = std::fs::read_link(&path) {
            assert!(
                !target.is_absolute() || target.starts_with("/usr/local"),
                "{relative:?} -> {target:?}"
            );
            let depth = relative.components().count() - 1;
            let ups = target
                .components()
                .filter(|c| matches!(c, std::path::Component::ParentDir))
                .count();
            assert!(
                ups <= depth,
                "{relative:?} -> {target:?} climbs out of the root"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_as_a_wheel_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        stage_bytes(&bytes, Flavor::Devel, false);
    }

    #[test]
    fn arbitrary_members_stay_inside_the_staging_root(
        members in prop::collection::vec(
            (member_name(), prop::collection::vec(any::<u8>(), 0..64), prop_oneof![Just(0o644u32), Just(0o755u32)]),
            0..8,
        ),
        devel in any::<bool>(),
        cudnn in any::<bool>(),
    ) {
        let flavor = if devel { Flavor::Devel } else { Flavor::Runtime };
        stage_bytes(&zip_of(&members), flavor, cudnn);
    }

    #[test]
    fn a_zip_with_flipped_bytes_never_panics(
        members in prop::collection::vec((member_name(), prop::collection::vec(any::<u8>(), 0..64), Just(0o644u32)), 1..4),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = zip_of(&members);
        for (at, value) in flips {
            let at = at.index(bytes.len());
            bytes[at] ^= value | 1;
        }
        stage_bytes(&bytes, Flavor::Devel, true);
    }

    #[test]
    fn layers_hold_only_relative_paths_without_parent_components(
        paths in prop::collection::vec("[a-z./]{1,16}", 1..6),
        targets in prop::collection::vec("[a-z./]{0,16}", 1..6),
    ) {
        let work = tempfile::tempdir().unwrap();
        let store = BlobStore::open(work.path()).unwrap();
        let mut entries = Vec::new();
        for (i, raw) in paths.iter().enumerate() {
            let Ok(path) = LayerPath::parse(raw) else { continue };
            let target = targets[i % targets.len()].clone();
            entries.push(match i % 3 {
                0 => Entry::file_bytes(path, 0o644, raw.as_bytes().to_vec()),
                1 => Entry::new(path, EntryKind::Symlink { target }, 0o777),
                _ => Entry::dir(path, 0o755),
            });
        }
        let Ok(contents) = LayerContents::from_entries(entries) else { return Ok(()) };
        let Ok(built) = layer::build(&store, &contents, &BuildOptions::new(0, Compression::None)) else { return Ok(()) };
        let bytes = std::fs::read(&built.blob).unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let path = entry.path().unwrap().into_owned();
            prop_assert!(path.is_relative(), "{path:?}");
            prop_assert!(!path.components().any(|c| matches!(c, std::path::Component::ParentDir)), "{path:?}");
        }
    }
}
