//! The fixture APT archive (tests/apt_support) is a real archive: apt run the way the lock
//! runs it (as the user, a throwaway root, `signed-by=` the fixture's keyring) accepts it,
//! checks its signature and its index hashes, and follows it when it moves on (issue 18).
//!
//! Needs gpg, gpgv, dpkg-deb and apt-get, and deb.debian.org once (the .debs are cached
//! under target/tmp/apt-fixture-debs); skipped otherwise, failed under CUDASTACK_REQUIRE=1.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;

use crate::apt_support::debs::{self, Resolve};
use crate::apt_support::server::percent_decode;
use crate::apt_support::{
    self, repack_with_version, AptRoot, Archive, DirServer, SigningKey, Suite,
};

const DIST: &str = "bookworm";

/// The .debs of `packages` for `arch` (no dependencies), or None after reporting a skip.
fn debs_or_skip(arch: &str, packages: &[&str]) -> Option<Vec<PathBuf>> {
    if let Some(skip) = apt_support::skip_reason() {
        skip.report();
        return None;
    }
    debs::fetch_or_skip(arch, packages, Resolve::Exact)
}

/// A published Debian-like archive with `debs` in `main`, served.
fn served_archive(arch: &str, debs: &[PathBuf]) -> (Archive, DirServer) {
    let mut archive = Archive::new(vec![Suite::debian(DIST, &[arch])]).unwrap();
    archive.add_all(DIST, "main", debs).unwrap();
    archive.publish().unwrap();
    let server = DirServer::serve(archive.root()).unwrap();
    (archive, server)
}

fn apt_root(arch: &str, sources: String) -> (tempfile::TempDir, AptRoot) {
    let dir = apt_support::temp_dir("apt-root-").unwrap();
    let root = AptRoot::create(dir.path(), arch, &[sources]).unwrap();
    (dir, root)
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn apt_accepts_the_signed_archive_and_fetches_from_it() {
    let Some(debs) = debs_or_skip("amd64", &["hello"]) else {
        return;
    };
    let (archive, server) = served_archive("amd64", &debs);
    let (_dir, root) = apt_root("amd64", archive.sources_line(&server.url(), DIST).unwrap());
    root.update().unwrap();
    let published = &archive.debs(DIST).unwrap()[0];
    assert_eq!(
        root.candidate("hello").unwrap().as_deref(),
        Some(published.info.version.as_str())
    );
    // apt reads InRelease, the .xz index, and fetches the file the index names.
    let fetched = apt_support::apt::parse_print_uris(&String::from_utf8_lossy(
        &root
            .command("apt-get")
            .args(["download", "--print-uris", "-qq", "hello"])
            .output()
            .unwrap()
            .stdout,
    ))
    .unwrap();
    assert_eq!(fetched.len(), 1);
    assert_eq!(
        fetched[0].url,
        format!("{}/{}", server.url(), published.filename)
    );
    assert_eq!(fetched[0].sha256(), Some(published.sha256.clone()));
    let dest = apt_support::temp_dir("apt-download-").unwrap();
    root.download(&["hello"], dest.path()).unwrap();
    assert!(!server.requests_for("/InRelease").is_empty());
    assert!(server
        .requests_for("/Packages.xz")
        .iter()
        .any(|r| r.status == 200));
    assert_eq!(server.requests_for(&published.filename)[0].status, 200);
}

#[test]
fn apt_rejects_the_archive_under_another_key() {
    let Some(debs) = debs_or_skip("amd64", &["hello"]) else {
        return;
    };
    let (archive, server) = served_archive("amd64", &debs);
    let stranger = SigningKey::generate("someone else <stranger@cudastack.invalid>").unwrap();
    let line = archive.sources_line(&server.url(), DIST).unwrap().replace(
        &archive.keyring().display().to_string(),
        &stranger.keyring().display().to_string(),
    );
    let (_dir, root) = apt_root("amd64", line);
    let output = root.try_update().unwrap();
    let message = stderr(&output);
    assert!(
        !output.status.success(),
        "apt-get update passed:\n{message}"
    );
    assert!(
        message.contains("NO_PUBKEY")
            && message.contains(archive.key().fingerprint().get(24..).unwrap()),
        "{message}"
    );
    assert_eq!(root.candidate("hello").unwrap(), None);
}

#[test]
fn apt_rejects_a_tampered_index() {
    let Some(debs) = debs_or_skip("amd64", &["hello"]) else {
        return;
    };
    let (archive, server) = served_archive("amd64", &debs);
    let index = archive.index_path(DIST, "main", "amd64");
    let mut text = fs_err::read_to_string(&index).unwrap();
    text = text.replace("Maintainer:", "Maintainer: Mallory,");
    archive
        .overwrite_index(DIST, "main", "amd64", text.as_bytes())
        .unwrap();
    let (_dir, root) = apt_root("amd64", archive.sources_line(&server.url(), DIST).unwrap());
    let output = root.try_update().unwrap();
    let message = stderr(&output);
    assert!(
        !output.status.success(),
        "apt-get update passed:\n{message}"
    );
    assert!(
        message.contains("Hash Sum mismatch") || message.contains("File has unexpected size"),
        "{message}"
    );
    assert_eq!(root.candidate("hello").unwrap(), None);
}

#[test]
fn a_newer_version_published_becomes_the_candidate() {
    let Some(debs) = debs_or_skip("amd64", &["hello"]) else {
        return;
    };
    let (mut archive, server) = served_archive("amd64", &debs);
    let old = archive.debs(DIST).unwrap()[0].clone();
    let (_dir, root) = apt_root("amd64", archive.sources_line(&server.url(), DIST).unwrap());
    root.update().unwrap();
    assert_eq!(
        root.candidate("hello").unwrap(),
        Some(old.info.version.clone())
    );

    let newer_version = format!("{}+fixture1", old.info.version);
    let work = apt_support::temp_dir("apt-newer-").unwrap();
    let newer = repack_with_version(&debs[0], &newer_version, work.path()).unwrap();
    archive.add(DIST, "main", &newer).unwrap();
    archive.unlist(DIST, "hello", &old.info.version).unwrap();
    archive.publish().unwrap();
    root.update().unwrap();
    assert_eq!(
        root.candidate("hello").unwrap(),
        Some(newer_version.clone())
    );
    // The index moved on; the file a lock recorded is still served.
    assert_eq!(http_status(&server, "GET", &old.filename), 200);

    archive.remove(DIST, "hello", &newer_version).unwrap();
    archive.publish().unwrap();
    root.update().unwrap();
    assert_eq!(root.candidate("hello").unwrap(), None);
    let newer_file = format!("pool/main/h/hello/hello_{newer_version}_amd64.deb");
    assert_eq!(http_status(&server, "GET", &newer_file), 404);
}

/// A locked file removed from the primary answers 404 there and is served by a
/// snapshot-like second server that the test fills from the archive beforehand.
#[test]
fn a_removed_file_is_still_served_by_a_snapshot_copy() {
    let Some(debs) = debs_or_skip("amd64", &["hello"]) else {
        return;
    };
    let (mut archive, server) = served_archive("amd64", &debs);
    let locked = archive.debs(DIST).unwrap()[0].clone();
    let snapshot_dir = apt_support::temp_dir("apt-snapshot-").unwrap();
    let prefix = "archive/debian/20250101T000000Z";
    let copied = archive
        .copy_pool_files(std::slice::from_ref(&locked), snapshot_dir.path(), prefix)
        .unwrap();
    assert_eq!(copied, vec![format!("{prefix}/{}", locked.filename)]);
    let snapshot = DirServer::serve(snapshot_dir.path()).unwrap();

    archive.remove(DIST, "hello", &locked.info.version).unwrap();
    archive.publish().unwrap();
    assert_eq!(http_status(&server, "GET", &locked.filename), 404);
    let (status, body) = http_get(&snapshot, "GET", &copied[0]);
    assert_eq!(status, 200);
    assert_eq!(body.len() as u64, locked.size);
    assert_eq!(snapshot.requests_for(&locked.filename).len(), 1);
}

/// An Ubuntu-ports-like `noble` for arm64 (carrying Debian's arm64 .debs: Ubuntu's are not
/// downloadable here) resolves with apt configured for arm64.
#[test]
fn a_ports_like_arm64_archive_resolves() {
    let Some(debs) = debs_or_skip("arm64", &["hello"]) else {
        return;
    };
    let mut archive = Archive::new(vec![Suite::ubuntu_ports("noble", &["arm64"])]).unwrap();
    archive.add_all("noble", "main", &debs).unwrap();
    archive.publish().unwrap();
    let server = DirServer::serve(archive.root()).unwrap();
    let line = archive.sources_line(&server.url(), "noble").unwrap();
    assert!(line.ends_with(" noble main universe"), "{line}");
    let (_dir, root) = apt_root("arm64", line);
    root.update().unwrap();
    assert!(root.candidate("hello").unwrap().is_some());
    let release = fs_err::read_to_string(archive.root().join("dists/noble/Release")).unwrap();
    assert!(
        release.contains("Suite: noble\nCodename: noble\n"),
        "{release}"
    );
    assert!(
        release.contains(" universe/binary-arm64/Packages.xz\n"),
        "{release}"
    );
}

/// The minbase set (what the base's lock resolves) published in a fixture archive: apt
/// resolves python3 + ca-certificates + apt + the required packages against the fixture
/// to exactly the files of the set, every one served from the fixture.
#[test]
fn the_minbase_set_resolves_against_the_fixture() {
    if let Some(skip) = apt_support::skip_reason() {
        skip.report();
        return;
    }
    let Some(set) = debs::minbase_or_skip("amd64") else {
        return;
    };
    let (archive, server) = served_archive("amd64", &set);
    let (_dir, root) = apt_root("amd64", archive.sources_line(&server.url(), DIST).unwrap());
    root.update().unwrap();
    let resolved = root.resolve(debs::MINBASE).unwrap();
    // apt 2.6 prints the index's MD5sum for `install --print-uris` (and nothing when the
    // index has none): the URL, size and that hash are the published file's.
    let mut fetched: Vec<(String, u64, String)> = resolved
        .iter()
        .map(|u| (percent_decode(&u.url).unwrap(), u.size, u.hash.clone()))
        .collect();
    let mut published: Vec<(String, u64, String)> = archive
        .debs(DIST)
        .unwrap()
        .iter()
        .map(|d| {
            let url = format!("{}/{}", server.url(), d.filename);
            (url, d.size, format!("MD5Sum:{}", d.md5))
        })
        .collect();
    fetched.sort();
    published.sort();
    assert_eq!(fetched, published);
    assert!(set.len() > 80, "minbase has {} packages", set.len());
}

#[test]
fn the_server_serves_the_directory_as_it_is_at_request_time() {
    let work = apt_support::temp_dir("apt-serve-").unwrap();
    let dir = work.path().join("served");
    fs_err::create_dir_all(dir.join("pool/main/a")).unwrap();
    fs_err::write(dir.join("pool/main/a/a_1:2.deb"), b"not a deb").unwrap();
    fs_err::write(dir.join("pool/main/a/a_1.deb"), b"twelve bytes").unwrap();
    fs_err::write(work.path().join("outside"), b"secret").unwrap();
    let server = DirServer::serve(&dir).unwrap();
    assert_eq!(
        http_get(&server, "GET", "pool/main/a/a_1.deb"),
        (200, b"twelve bytes".to_vec())
    );
    assert_eq!(http_get(&server, "HEAD", "pool/main/a/a_1.deb").0, 200);
    assert!(http_get(&server, "HEAD", "pool/main/a/a_1.deb")
        .1
        .is_empty());
    // Percent-escapes are decoded (an epoch's colon is `%3a` in a URL).
    assert_eq!(http_status(&server, "GET", "pool/main/a/a_1%3a2.deb"), 200);
    assert_eq!(http_status(&server, "GET", "pool/main/a"), 404);
    assert_eq!(http_status(&server, "GET", "../outside"), 404);
    assert_eq!(http_status(&server, "GET", "pool/../../outside"), 404);
    assert_eq!(http_status(&server, "POST", "pool/main/a/a_1.deb"), 405);
    fs_err::remove_file(dir.join("pool/main/a/a_1.deb")).unwrap();
    assert_eq!(http_status(&server, "GET", "pool/main/a/a_1.deb"), 404);
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses.last(), Some(&404));
    let url = server.url();
    drop(server);
    let address = url.trim_start_matches("http://");
    assert!(
        TcpStream::connect(address).is_err(),
        "still serving after drop"
    );
}

#[test]
fn pool_paths_and_print_uris_lines_parse_as_debian_writes_them() {
    use crate::apt_support::apt::parse_print_uris;
    use crate::apt_support::archive::pool_prefix;
    assert_eq!(pool_prefix("hello"), "h");
    assert_eq!(pool_prefix("libxcrypt"), "libx");
    assert_eq!(pool_prefix("lib"), "lib");
    assert_eq!(pool_prefix("é"), "é");
    assert_eq!(pool_prefix(""), "");
    let text = "'http://h/pool/main/g/gcc-12/gcc-12-base_12.2.0-14%2bdeb12u1_amd64.deb' \
                gcc-12-base_12.2.0-14+deb12u1_amd64.deb 37596 MD5Sum:8e7e741807b1e1939df8f58323affdcb\n\
                'http://h/pool/main/h/hello/hello_2.10-3_amd64.deb' hello_2.10-3_amd64.deb 53100 \n\
                Reading package lists...\n";
    let uris = parse_print_uris(text).unwrap();
    assert_eq!(uris.len(), 2);
    assert_eq!(uris[0].size, 37596);
    assert_eq!(uris[0].hash, "MD5Sum:8e7e741807b1e1939df8f58323affdcb");
    assert_eq!(uris[0].sha256(), None);
    assert_eq!(uris[1].hash, "");
    assert!(parse_print_uris("'http://h/x.deb' x.deb not-a-size\n").is_err());
    assert!(parse_print_uris("'http://h/x.deb'\n").is_err());
    assert_eq!(percent_decode("a%3a1%2B2").as_deref(), Some("a:1+2"));
    assert_eq!(percent_decode("broken%2"), None);
    assert_eq!(percent_decode("%ff"), None);
}

fn http_status(server: &DirServer, method: &str, path: &str) -> u16 {
    http_get(server, method, path).0
}

/// One request on its own connection: the status and the body.
fn http_get(server: &DirServer, method: &str, path: &str) -> (u16, Vec<u8>) {
    let address = server.url().trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "{method} /{path} HTTP/1.1\r\nHost: fixture\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, response[split + 4..].to_vec())
}
