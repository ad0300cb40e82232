//! Gzip layers whose files come from a wheel with their deflate data copied
//! (`layer::ZipMember`): a layer of 20,000+ files, large members among them, is read back
//! as the same tar by every reader a layer meets: gzip, Python's gzip module, umoci (Go's
//! compress/gzip) and skopeo (it checks every blob's digest), Docker 20.10 (`docker load`,
//! then `docker run` of a static binary that was a copied member) and containerd's `ctr`.

use crate::gate;
use crate::oci_support::{docker, have, run, static_show_binary, DockerCleanup};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudastack::cache::BlobStore;
use cudastack::layer::{
    self, BuildOptions, Compression, Entry, FileSource, LayerContents, LayerPath, ZipMember,
    COPY_DEFLATE_FROM,
};
use cudastack::oci::{layout, Image};

const EPOCH: u64 = 1_714_521_600;
const SMALL_FILES: usize = 20_000;

/// A wheel-like zip (deflated, as wheels are): `bin/show` (a static binary), large
/// libraries cut from this test binary, 20,000 small Python files and one stored member.
/// Returns the zip and the members with their bytes.
fn wheel(dir: &Path, show: &Path) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let mut members: Vec<(String, Vec<u8>)> = vec![
        ("bin/show".into(), std::fs::read(show).unwrap()),
        (
            "etc/message".into(),
            b"hello from a wheel member\n".to_vec(),
        ),
    ];
    for (i, size) in [(0, 6 << 20), (1, 300_000), (2, COPY_DEFLATE_FROM as usize)] {
        let start = (i * 1_000_003) % (exe.len() - size);
        members.push((
            format!("lib/libpart{i}.so"),
            exe[start..start + size].to_vec(),
        ));
    }
    for i in 0..SMALL_FILES {
        members.push((
            format!("site/pkg{}/mod{i}.py", i % 97),
            format!("VALUE = {i}\nNAME = 'module {i}'\n").into_bytes(),
        ));
    }
    let path = dir.join("members-1.0-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    for (name, bytes) in &members {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(0o755);
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("lib/stored.bin", stored).unwrap();
    zip.write_all(&exe[..200_000]).unwrap();
    members.push(("lib/stored.bin".into(), exe[..200_000].to_vec()));
    zip.finish().unwrap();
    (path, members)
}

/// The layer's entries with the members' bytes in memory (what a staged tree gives), and
/// the same entries taking their content from the wheel.
fn contents(wheel: &Path, members: &[(String, Vec<u8>)]) -> (LayerContents, LayerContents) {
    let entry = |name: &str, source: FileSource, size: usize| {
        let mode = if name.starts_with("bin/") {
            0o755
        } else {
            0o644
        };
        Entry::file(LayerPath::parse(name).unwrap(), mode, size as u64, source)
    };
    let in_memory =
        LayerContents::from_entries(members.iter().map(|(name, bytes)| {
            entry(name, FileSource::Bytes(bytes.clone().into()), bytes.len())
        }))
        .unwrap();
    let names: Vec<&str> = members.iter().map(|(name, _)| name.as_str()).collect();
    let located = ZipMember::locate(wheel, &names).unwrap();
    let copied = located.iter().filter(|m| m.copies_deflate()).count();
    assert_eq!(copied, 4, "bin/show and the three libraries");
    let mut from_wheel = in_memory.clone();
    from_wheel
        .take_from_zip_members(
            names
                .iter()
                .map(|name| LayerPath::parse(name).unwrap())
                .zip(located),
        )
        .unwrap();
    (in_memory, from_wheel)
}

#[test]
fn a_layer_with_copied_wheel_members_reads_back_in_every_tool() {
    let work = tempfile::tempdir().unwrap();
    let Ok(show) = static_show_binary(work.path()) else {
        return gate::skip("gcc", "cannot build a static test binary with gcc");
    };
    let (wheel, members) = wheel(work.path(), &show);
    let (in_memory, from_wheel) = contents(&wheel, &members);
    assert!(in_memory.entries().len() > SMALL_FILES);

    let store = BlobStore::open(work.path().join("store")).unwrap();
    let gzip = BuildOptions::new(EPOCH, Compression::Gzip { level: 1 });
    let copied = layer::build(&store, &from_wheel, &gzip).unwrap();
    let compressed = layer::build(&store, &in_memory, &gzip).unwrap();
    let tar = layer::write_layer_tar(&in_memory, EPOCH, Vec::new()).unwrap();
    let tar_digest = cudastack::digest::Digest::of_bytes(&tar);
    assert_eq!(copied.diff_id, tar_digest, "the diff_id is the tar's");
    assert_eq!(compressed.diff_id, tar_digest);
    eprintln!(
        "layer of {} files, {} bytes of tar: {} bytes with the wheel's deflate data copied, {} compressed again at level 1",
        in_memory.entries().len(),
        tar.len(),
        copied.size,
        compressed.size
    );

    // gzip and Python's gzip module read every member.
    let blob = copied.blob_path().to_path_buf();
    run(Command::new("gzip").arg("-t").arg(&blob));
    let python = run(Command::new("python3").arg("-c").arg(
        "import gzip, hashlib, sys\nprint(hashlib.sha256(gzip.open(sys.argv[1]).read()).hexdigest())",
    ).arg(&blob));
    assert_eq!(
        String::from_utf8_lossy(&python.stdout).trim(),
        tar_digest.hex(),
        "Python's gzip"
    );

    let image = Image::new(EPOCH)
        .with_layer(copied, "cudastack test: wheel members")
        .with_entrypoint(vec!["/bin/show".to_string()])
        .with_cmd(vec![
            "/etc/message".to_string(),
            "/site/pkg5/mod5.py".to_string(),
        ]);
    let dir = work.path().join("layout");
    layout::write(&image, &dir, "latest").unwrap();

    // umoci unpacks with Go's gzip reader; the files are the members' bytes.
    if !have("umoci") {
        return gate::skip("umoci", "umoci is not installed (apt-get install umoci)");
    }
    let bundle = work.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:latest", dir.display()))
        .arg(&bundle));
    for (name, bytes) in members.iter().step_by(997).chain(&members[..6]) {
        let unpacked = std::fs::read(bundle.join("rootfs").join(name)).unwrap();
        assert!(&unpacked == bytes, "{name} differs after umoci unpack");
    }

    // skopeo checks every blob against its digest while copying to a docker-archive.
    if !have("skopeo") {
        return gate::skip("skopeo", "skopeo is not installed (apt-get install skopeo)");
    }
    let archive = work.path().join("docker-archive.tar");
    run(Command::new("skopeo")
        .arg("copy")
        .arg(format!("oci:{}:latest", dir.display()))
        .arg(format!(
            "docker-archive:{}:cudastack-test/wheel-members:latest",
            archive.display()
        )));

    if let Err(reason) = docker() {
        return gate::skip("docker", reason);
    }
    let _cleanup = DockerCleanup(vec!["cudastack-test/wheel-members:latest".to_string()]);
    run(Command::new("docker").arg("load").arg("-i").arg(&archive));
    let out = run(Command::new("docker").args([
        "run",
        "--rm",
        "--network",
        "none",
        "cudastack-test/wheel-members:latest",
    ]));
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains("hello from a wheel member") && out.contains("NAME = 'module 5'"),
        "{out}"
    );

    // containerd's importer (`ctr`, from Docker's packages) reads the same layer.
    if !have("ctr") {
        return gate::skip(
            "ctr",
            "containerd's ctr is not installed (apt-get install containerd)",
        );
    }
    let oci_tar = work.path().join("oci.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&oci_tar)
        .arg("-C")
        .arg(&dir)
        .arg("."));
    // dockerd runs its own containerd unless the host runs one for it.
    let address = [
        "/run/containerd/containerd.sock",
        "/var/run/docker/containerd/containerd.sock",
    ]
    .into_iter()
    .find(|socket| std::os::unix::net::UnixStream::connect(socket).is_ok())
    .expect("dockerd answers, so its containerd does");
    let ctr = |args: &[&str]| {
        let mut command = Command::new("ctr");
        command
            .args(["--address", address, "--namespace", "cudastack-test"])
            .args(args);
        command
    };
    let imported = ctr(&["images", "import", "--all-platforms", "--index-name"])
        .arg("cudastack-test/wheel-members:ctr")
        .arg(&oci_tar)
        .output()
        .unwrap();
    let _ = ctr(&["images", "rm", "cudastack-test/wheel-members:ctr"]).output();
    assert!(
        imported.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&imported.stderr)
    );
}
