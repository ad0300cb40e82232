//! The outputs, checked by the tools that consume them: skopeo and umoci read the OCI
//! layout, `docker load` reads the docker-archive (and a tar of the layout), and
//! `docker run` of a tiny image built here prints what its files say.

use crate::gate;
use crate::oci_support;

use std::path::Path;
use std::process::Command;

use cudastack::cache::BlobStore;
use cudastack::layer::{self, BuildOptions, Compression, Entry, Layer, LayerContents, LayerPath};
use cudastack::oci::{docker_archive, layout, Image};
use oci_support::{docker, have, run, static_show_binary, DockerCleanup};

const EPOCH: u64 = 1_714_521_600;

fn p(s: &str) -> LayerPath {
    LayerPath::parse(s).unwrap()
}

/// Layer 1: the `show` binary, a message, and a library-style symlink chain whose
/// final file holds text (so `docker run` proves the chain resolves); /tmp 1777.
fn base_layer(store: &BlobStore, show: &Path, compression: Compression) -> Layer {
    let contents = LayerContents::from_entries([
        Entry::file_bytes(p("bin/show"), 0o755, std::fs::read(show).unwrap()),
        Entry::file_bytes(
            p("etc/message"),
            0o644,
            &b"hello from a cudastack layer\n"[..],
        ),
        Entry::file_bytes(
            p("usr/lib/libmsg.so.1.2.3"),
            0o644,
            &b"chain resolved\n"[..],
        ),
        Entry::symlink(p("usr/lib/libmsg.so.1"), "libmsg.so.1.2.3"),
        Entry::symlink(p("usr/lib/libmsg.so"), "libmsg.so.1"),
        Entry::dir(p("tmp"), 0o1777),
    ])
    .unwrap();
    layer::build(store, &contents, &BuildOptions::new(EPOCH, compression)).unwrap()
}

/// Layer 2: deletes etc/message (whiteout) and adds etc/second.
fn top_layer(store: &BlobStore, compression: Compression) -> Layer {
    let contents = LayerContents::from_entries([
        Entry::whiteout(p("etc/message")),
        Entry::file_bytes(p("etc/second"), 0o644, &b"second layer here\n"[..]),
    ])
    .unwrap();
    layer::build(store, &contents, &BuildOptions::new(EPOCH, compression)).unwrap()
}

fn base_image(layer: Layer) -> Image {
    Image::new(EPOCH)
        .with_layer(layer, "cudastack test: show binary and files")
        .with_env("PATH", "/bin")
        .with_label("io.cudastack.test", "peers")
        .with_entrypoint(vec!["/bin/show".to_string()])
        .with_cmd(vec![
            "/etc/message".to_string(),
            "/usr/lib/libmsg.so".to_string(),
        ])
        .with_working_dir("/")
}

#[test]
fn skopeo_and_umoci_accept_the_layout_and_a_base_read_back_from_it() {
    let work = tempfile::tempdir().unwrap();
    let Ok(show) = static_show_binary(work.path()) else {
        gate::skip("gcc", "cannot build a static test binary with gcc");
        return;
    };
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let dir = work.path().join("layout");
    let base = base_image(base_layer(&store, &show, Compression::Gzip { level: 6 }));
    let base_digest = layout::write(&base, &dir, "base").unwrap();

    // Read it back as a base image and add a layer; both images live in one layout.
    let read_back = layout::read(&dir, "base").unwrap();
    assert_eq!(read_back.layers().len(), 1);
    assert_eq!(
        read_back.clone().with_created(EPOCH).digest().unwrap(),
        base_digest
    );
    let derived = read_back
        .with_created(EPOCH)
        .with_layer(top_layer(&store, Compression::Gzip { level: 6 }), "second")
        .with_cmd(vec!["/etc/second".to_string()]);
    // umoci 0.4 cannot unpack zstd layers; skopeo still inspects this one.
    let zstd = Image::new(EPOCH).with_layer(top_layer(&store, Compression::Zstd { level: 3 }), "z");
    let zstd_digest = layout::write(&zstd, &dir, "zstd").unwrap();
    let derived_digest = layout::write(&derived, &dir, "derived").unwrap();
    let index = std::fs::read_to_string(dir.join("index.json")).unwrap();
    assert!(
        index.contains(r#""org.opencontainers.image.ref.name":"base""#),
        "{index}"
    );
    assert!(
        index.contains(r#""org.opencontainers.image.ref.name":"derived""#),
        "{index}"
    );
    let err = layout::read(&dir, "nope").unwrap_err().to_string();
    assert!(err.contains("base, derived, zstd"), "{err}");

    // Layer blobs were hardlinked from the store (same filesystem), not copied.
    use std::os::unix::fs::MetadataExt;
    let layer = &base.layers()[0];
    let in_layout = layout::blob_path(&dir, &layer.digest);
    assert_eq!(
        std::fs::metadata(&layer.blob).unwrap().ino(),
        std::fs::metadata(&in_layout).unwrap().ino()
    );

    if have("skopeo") {
        let output = run(Command::new("skopeo")
            .arg("inspect")
            .arg(format!("oci:{}:zstd", dir.display())));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(json["Digest"], zstd_digest.to_string(), "{json}");
        let raw = run(Command::new("skopeo")
            .args(["inspect", "--raw"])
            .arg(format!("oci:{}:zstd", dir.display())));
        let manifest: serde_json::Value = serde_json::from_slice(&raw.stdout).unwrap();
        assert_eq!(
            manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar+zstd",
            "{manifest}"
        );
        for (reference, digest, layers) in
            [("base", base_digest, 1), ("derived", derived_digest, 2)]
        {
            let output = run(Command::new("skopeo")
                .arg("inspect")
                .arg(format!("oci:{}:{reference}", dir.display())));
            let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(json["Digest"], digest.to_string(), "{json}");
            assert_eq!(json["Layers"].as_array().unwrap().len(), layers);
            assert_eq!(json["Labels"]["io.cudastack.test"], "peers");
            assert_eq!(json["Created"], "2024-05-01T00:00:00Z");
        }
        // skopeo also validates the config and every blob digest when copying.
        run(Command::new("skopeo")
            .arg("copy")
            .arg(format!("oci:{}:derived", dir.display()))
            .arg(format!("oci:{}:copied", work.path().join("copy").display())));
    } else {
        gate::skip("skopeo", "skopeo part: skopeo is not installed");
    }

    if have("umoci") {
        let bundle = work.path().join("bundle");
        run(Command::new("umoci")
            .arg("unpack")
            .arg("--image")
            .arg(format!("{}:derived", dir.display()))
            .arg(&bundle));
        let rootfs = bundle.join("rootfs");
        assert_eq!(
            std::fs::read_to_string(rootfs.join("usr/lib/libmsg.so")).unwrap(),
            "chain resolved\n"
        );
        assert_eq!(
            std::fs::read_link(rootfs.join("usr/lib/libmsg.so")).unwrap(),
            Path::new("libmsg.so.1")
        );
        assert_eq!(
            std::fs::read_to_string(rootfs.join("etc/second")).unwrap(),
            "second layer here\n"
        );
        assert!(!rootfs.join("etc/message").exists(), "whiteout not applied");
        assert_eq!(
            std::fs::metadata(rootfs.join("tmp")).unwrap().mode() & 0o7777,
            0o1777
        );
        let config = std::fs::read_to_string(bundle.join("config.json")).unwrap();
        assert!(config.contains("/etc/second"), "{config}");
    } else {
        gate::skip("umoci", "umoci part: umoci is not installed");
    }
}

fn docker_load(archive: &Path) -> String {
    let output = run(Command::new("docker").arg("load").arg("-i").arg(archive));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.lines()
        .rev()
        .find_map(|line| {
            line.strip_prefix("Loaded image: ")
                .or_else(|| line.strip_prefix("Loaded image ID: "))
        })
        .unwrap_or_else(|| panic!("unexpected docker load output: {text}"))
        .trim()
        .to_string()
}

fn docker_run(image: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new("docker")
        .args(["run", "--rm", "--network", "none", image])
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[test]
fn docker_loads_and_runs_the_archive_and_the_layout_tar() {
    if let Err(reason) = docker() {
        gate::skip("docker", reason);
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let show = match static_show_binary(work.path()) {
        Ok(show) => show,
        Err(reason) => {
            gate::skip("gcc", reason);
            return;
        }
    };
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let tag = format!("cudastack-test/peers:{}", std::process::id());
    let mut cleanup = DockerCleanup(vec![tag.clone()]);

    // Uncompressed layers: the fast path for a local daemon.
    let base = base_image(base_layer(&store, &show, Compression::None));
    let image = base
        .clone()
        .with_layer(top_layer(&store, Compression::None), "second");
    let archive = work.path().join("image.tar");
    let file = std::fs::File::create(&archive).unwrap();
    docker_archive::write(
        &image,
        std::slice::from_ref(&tag),
        std::io::BufWriter::new(file),
    )
    .unwrap();
    let loaded = docker_load(&archive);
    assert_eq!(loaded, tag);
    let (ok, stdout) = docker_run(&tag, &["/etc/second", "/usr/lib/libmsg.so"]);
    assert!(ok, "{stdout}");
    assert_eq!(stdout, "second layer here\nchain resolved\n");
    let (ok, stdout) = docker_run(&tag, &["/etc/message"]);
    assert!(!ok, "whiteout not applied: {stdout}");
    assert_eq!(stdout, "missing /etc/message\n");
    // The image ID Docker computed is our config digest.
    let inspect =
        run(Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", &tag]));
    let id = String::from_utf8_lossy(&inspect.stdout).trim().to_string();
    let documents = image.documents().unwrap();
    assert!(
        id == documents.config.digest.to_string() || id == documents.manifest.digest.to_string(),
        "docker image id {id} is neither our config nor manifest digest"
    );

    // gzip and zstd layers through a plain tar of an OCI layout directory.
    let gz_image = base_image(base_layer(&store, &show, Compression::Gzip { level: 6 }))
        .with_layer(top_layer(&store, Compression::Zstd { level: 3 }), "second");
    let dir = work.path().join("layout");
    layout::write(&gz_image, &dir, "peers").unwrap();
    let layout_tar = work.path().join("layout.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&layout_tar)
        .arg("-C")
        .arg(&dir)
        .arg("."));
    cleanup.0.push("peers:latest".to_string());
    let loaded = docker_load(&layout_tar);
    cleanup.0.push(loaded.clone());
    assert_eq!(loaded, "peers:latest");
    let (ok, stdout) = docker_run(&loaded, &["/etc/second", "/usr/lib/libmsg.so"]);
    assert!(ok, "{stdout}");
    assert_eq!(stdout, "second layer here\nchain resolved\n");

    // The default command of the base image (entrypoint + cmd) through a gzip archive.
    let base_tag = format!("cudastack-test/peers-base:{}", std::process::id());
    cleanup.0.push(base_tag.clone());
    // Streamed straight into `docker load` through a pipe: no archive on disk.
    let gz_base = base_image(base_layer(&store, &show, Compression::Gzip { level: 6 }));
    let mut child = Command::new("docker")
        .arg("load")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    drop(docker_archive::write(&gz_base, std::slice::from_ref(&base_tag), stdin).unwrap());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!("Loaded image: {base_tag}")),
        "{text}"
    );
    let (ok, stdout) = docker_run(&base_tag, &[]);
    assert!(ok, "{stdout}");
    assert_eq!(stdout, "hello from a cudastack layer\nchain resolved\n");
}

#[test]
fn docker_archive_is_deterministic_and_streams_through_a_pipe() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let layer = top_layer(&store, Compression::Gzip { level: 6 });
    let image = Image::new(EPOCH).with_layer(layer, "x");
    let tags = ["cudastack-test/x:1".to_string()];
    let first = docker_archive::write(&image, &tags, Vec::new()).unwrap();
    let second = docker_archive::write(&image, &tags, Vec::new()).unwrap();
    assert_eq!(first, second);
    // GNU tar lists it, with manifest.json for Docker < 25 and index.json for OCI tools.
    let path = work.path().join("x.tar");
    std::fs::write(&path, &first).unwrap();
    let listing = run(Command::new("tar").arg("-tf").arg(&path));
    let listing = String::from_utf8_lossy(&listing.stdout);
    for name in ["manifest.json", "index.json", "oci-layout", "blobs/sha256/"] {
        assert!(
            listing.lines().any(|l| l == name),
            "{name} missing:\n{listing}"
        );
    }
    let err = docker_archive::write(&image, &["Bad Tag".to_string()], Vec::new()).unwrap_err();
    assert!(err.to_string().contains("Bad Tag"), "{err}");
}
