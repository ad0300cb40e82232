//! Issue 16 ("Trust"), recipe part: what `validate` must refuse where the recipe is parsed,
//! so that `build` never starts (or downloads) what `load` would then refuse. Runs the real
//! binary on the fixtures in tests/fixtures/recipes/invalid/ and on files made here, and
//! `build` against a wheel server on 127.0.0.1 whose request log proves nothing was fetched.

use crate::fetch_support;

use fetch_support::gate;

use std::path::{Path, PathBuf};
use std::process::Command;

use cudastack::recipe::Recipe;
use fetch_support::FixtureServer;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `cudastack ARGS` from the repository root: (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .current_dir(manifest_dir())
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn invalid_fixture(name: &str) -> String {
    format!("tests/fixtures/recipes/invalid/{name}.yaml")
}

/// Each of these passed `validate` before issue 16 and failed later (in `load`, in `build`
/// after the downloads, or with a message meant for programmers).
#[test]
fn validate_refuses_what_later_stages_would() {
    let cases: &[(&str, &[&str])] = &[
        (
            "tag-newline",
            &[
                "tag-newline.yaml: tag `{registry}/torch:{cuda}\\nlatest`",
                "the tag `12.4\\nlatest`",
                "hint: ",
            ],
        ),
        (
            "tag-uppercase",
            &[
                "rendered `localhost/Torch:12.4`",
                "repository names must be lowercase",
                "hint: write the image name in lowercase",
            ],
        ),
        (
            "tag-empty",
            &[
                "tag `` is not a valid image reference: it is empty",
                "hint: remove the empty tag",
            ],
        ),
        (
            "tag-parent",
            &[
                "the registry `..` is not a host name",
                "hint: give the registry as `host[:port]`",
            ],
        ),
        (
            "source-date-epoch-year-10000",
            &[
                "source-date-epoch-year-10000.yaml:6:",
                "253402300800 is after the year 9999",
                "date -d",
            ],
        ),
        (
            "duplicate-key",
            &[
                "duplicate-key.yaml:6:1: the key `cuda` is given twice in the same mapping",
                "hint: keep one `cuda:`",
            ],
        ),
    ];
    for (name, fragments) in cases {
        let (code, stdout, stderr) = run(&["validate", &invalid_fixture(name)]);
        assert_eq!(code, 1, "{name} should be invalid:\n{stdout}\n{stderr}");
        assert!(stdout.contains(": invalid\n  error: "), "{name}:\n{stdout}");
        for fragment in *fragments {
            assert!(
                stdout.contains(fragment),
                "{name}: expected `{fragment}` in:\n{stdout}"
            );
        }
        assert!(
            !stdout.contains("DuplicateKeyPolicy") && !stdout.contains("Options"),
            "{name}: advice to programmers reached the user:\n{stdout}"
        );
    }
}

#[test]
fn image_and_oci_bases_are_refused_with_the_supported_ones() {
    for name in ["base-image", "base-oci"] {
        let (code, stdout, _) = run(&["validate", &invalid_fixture(name)]);
        assert_eq!(code, 1, "{name}:\n{stdout}");
        assert!(
            stdout.contains("error[unsupported-base]"),
            "{name}:\n{stdout}"
        );
        assert!(stdout.contains("is not supported"), "{name}:\n{stdout}");
        assert!(
            stdout.contains("hint: use `base:` with one of { debian: bookworm }"),
            "{name}:\n{stdout}"
        );
        assert!(stdout.contains("{ ubuntu: noble }"), "{name}:\n{stdout}");
    }
}

/// Write `recipe_text` and a lock for it (the shipped torch 2.4.1 lock with its recipe
/// digest replaced and every wheel URL pointing at `server`), as `build` would find them.
fn recipe_with_lock(dir: &Path, recipe_text: &str, server: &FixtureServer) -> PathBuf {
    let recipe_path = dir.join("r.yaml");
    std::fs::write(&recipe_path, recipe_text).unwrap();
    let recipe = Recipe::load(&recipe_path).unwrap();
    let shipped =
        std::fs::read_to_string(manifest_dir().join("recipes/torch2.4.1-cu121-py3.11.lock"))
            .unwrap();
    let mut lock: serde_json::Value = serde_json::from_str(&shipped).unwrap();
    lock["recipe_digest"] = recipe.digest().to_string().into();
    for artifact in lock["artifacts"].as_array_mut().unwrap() {
        let url = artifact["url"].as_str().unwrap().to_string();
        artifact["url"] = url
            .replace("https://files.pythonhosted.org", &server.base)
            .into();
    }
    std::fs::write(
        dir.join("r.lock"),
        serde_json::to_string_pretty(&lock).unwrap(),
    )
    .unwrap();
    recipe_path
}

/// `build` of a recipe whose build would fail: it must fail before any download (the
/// server sees no request) and say why.
fn build_fails_before_fetching(recipe_text: &str, extra: &[&str], expected: &str) {
    let server = FixtureServer::start();
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_with_lock(dir.path(), recipe_text, &server);
    let cache = dir.path().join("cache");
    let layout = dir.path().join("layout");
    let mut args = vec![
        "build",
        recipe.to_str().unwrap(),
        "--no-verify",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--layout",
        layout.to_str().unwrap(),
    ];
    args.extend(extra);
    let (code, stdout, stderr) = run(&args);
    assert_ne!(code, 0, "build should fail:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains(expected),
        "expected `{expected}` in:\n{stderr}"
    );
    assert_eq!(
        server.log().len(),
        0,
        "build fetched before refusing: {:?}",
        server.log().iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    assert!(!layout.exists(), "build wrote a layout");
}

const TORCH_241: &str = "name: r\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: { version: \"12.1\" }\ncudnn: { version: \"9.1.0.70\" }\ntorch: { version: \"2.4.1\" }\npackages: [\"numpy==1.26.4\"]\ntags: [\"{registry}/torch:{torch}\"]\n";

/// Before issue 16, an `image:` base passed validation, the lock was read and every wheel
/// (2.7 GB for torch 2.4.1) was downloaded before `build` said it cannot build that base.
#[test]
fn build_refuses_an_image_base_before_any_fetch() {
    let digest = "a".repeat(64);
    let text = TORCH_241.replace(
        "{ debian: bookworm }",
        &format!("{{ image: \"docker.io/library/debian:bookworm@sha256:{digest}\" }}"),
    );
    build_fails_before_fetching(&text, &[], "error[unsupported-base]");
    let text = TORCH_241.replace("{ debian: bookworm }", "{ oci: \"layouts/debian\" }");
    build_fails_before_fetching(&text, &[], "error[unsupported-base]");
}

/// A `--registry` that makes the tags invalid fails before the build, not at `load`.
#[test]
fn build_refuses_a_registry_that_breaks_the_tags_before_any_fetch() {
    build_fails_before_fetching(
        TORCH_241,
        &["--registry", "Bad Registry"],
        "tag `{registry}/torch:{torch}` (rendered `Bad Registry/torch:2.4.1`) is not a valid image reference",
    );
}

/// Tags the Docker daemon refuses (measured on Docker 20.10 with `POST /images/ID/tag`)
/// that the reference grammar accepted before it was made the same as the daemon's: a
/// name longer than 255 characters once normalised (`docker.io/library/` + 238), a bare
/// 64-digit hexadecimal name (an image ID to Docker), a registry host part starting with
/// `-`, and a registry `--registry` renders as `..`.
#[test]
fn validate_refuses_tags_the_docker_daemon_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let long_name = "n".repeat(238);
    let hex = "0123456789abcdef".repeat(4);
    for (tag, fragment) in [
        (format!("{long_name}:1"), "at most 255"),
        (format!("{hex}:1"), "read as an image ID"),
        ("-mirror.example/torch:1".to_string(), "`-mirror`"),
        ("mirror..example:5000/torch:1".to_string(), "empty part"),
        ("[::ffff:127.0.0.1]:5000/torch:1".to_string(), "IPv6"),
    ] {
        let text = TORCH_241.replace("{registry}/torch:{torch}", &tag);
        let path = dir.path().join("r.yaml");
        std::fs::write(&path, &text).unwrap();
        let (code, stdout, stderr) = run(&["validate", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{tag} should be invalid:\n{stdout}\n{stderr}");
        assert!(
            stdout.contains(fragment),
            "{tag}: `{fragment}` in:\n{stdout}"
        );
        assert!(stdout.contains("hint: "), "{tag}:\n{stdout}");
    }
    // The longest name Docker takes passes.
    let text = TORCH_241.replace("{registry}/torch:{torch}", &"n".repeat(237));
    let path = dir.path().join("r.yaml");
    std::fs::write(&path, &text).unwrap();
    let (code, stdout, _) = run(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}");
}

/// The cause of a failed read reaches the user, under the error that names the file.
#[test]
fn unreadable_and_binary_files_keep_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    // A directory: EISDIR, whoever runs the test.
    let (code, stdout, _) = run(&["validate", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("error: failed to read recipe"), "{stdout}");
    assert!(
        stdout.contains("Caused by: Is a directory (os error 21)"),
        "{stdout}"
    );
    // Binary: the first bytes of a gzip file.
    let binary = dir.path().join("image.tar.gz.yaml");
    std::fs::write(&binary, b"name: x\n\x1f\x8b\x08\x00\x00\x00").unwrap();
    let (code, stdout, _) = run(&["--json", "validate", binary.to_str().unwrap()]);
    assert_eq!(code, 1, "{stdout}");
    let results: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let result = &results[0];
    assert!(
        result["parse_error"]
            .as_str()
            .unwrap()
            .contains("is not UTF-8 text: invalid UTF-8 at byte 9 (line 2)"),
        "{result}"
    );
    assert!(
        result["caused_by"][0]
            .as_str()
            .unwrap()
            .contains("from index 9"),
        "{result}"
    );
    // Permission denied: only meaningful when not root (root reads any file).
    let locked = dir.path().join("locked.yaml");
    std::fs::write(&locked, "name: x\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&locked).is_ok() {
        gate::not_applicable("the permission-denied case: this user reads mode 0000 files (root)");
        return;
    }
    let (code, stdout, _) = run(&["validate", locked.to_str().unwrap()]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("Caused by: Permission denied"), "{stdout}");
}

/// Issue 18: `apt:` entries are refused where the recipe is read, with the file, the line,
/// the entry and what is allowed; a valid list validates.
#[test]
fn validate_reads_apt_packages_strictly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.yaml");
    let path_arg = path.to_str().unwrap();
    for (list, fragments) in [
        (
            "[git, libc6:amd64]",
            &[
                "r.yaml:10:",
                "apt package `libc6:amd64`: the architecture qualifier `:amd64` is not accepted",
                "write `libc6`",
            ][..],
        ),
        (
            "[OpenSSH-Client]",
            &["the package name `OpenSSH-Client` has capital letters", "write `openssh-client`"][..],
        ),
        (
            "[\"git=latest\"]",
            &["`latest` is not a Debian version", "Debian Policy 5.6.12"][..],
        ),
        (
            "[x]",
            &["`x` is not a Debian package name", "at least 2 characters", "Debian Policy 5.6.1"][..],
        ),
        (
            "[git, openssh-client, git=1:2.39.5-0+deb12u2]",
            &["apt package `git` is listed as `git` and as `git=1:2.39.5-0+deb12u2`; keep one entry"][..],
        ),
    ] {
        std::fs::write(&path, format!("{TORCH_241}apt: {list}\n")).unwrap();
        let (code, stdout, stderr) = run(&["validate", path_arg]);
        assert_eq!(code, 1, "{list} should be invalid:\n{stdout}\n{stderr}");
        for fragment in fragments {
            assert!(stdout.contains(fragment), "{list}: `{fragment}` in:\n{stdout}");
        }
    }
    std::fs::write(
        &path,
        format!("{TORCH_241}apt:\n  - git=1:2.39.5-0+deb12u2\n  - openssh-client\n  - libgl1\n"),
    )
    .unwrap();
    let (code, stdout, _) = run(&["validate", path_arg]);
    assert_eq!(code, 0, "{stdout}");
    let recipe = Recipe::load(&path).unwrap();
    let args: Vec<String> = recipe.apt.iter().map(ToString::to_string).collect();
    assert_eq!(args, ["git=1:2.39.5-0+deb12u2", "libgl1", "openssh-client"]);
}

/// `ca_certificates:` files are checked where the recipe is resolved: `validate` refuses a
/// server's own certificate, a file with a private key and a path leaving the recipe's
/// directory, each saying what to do, and accepts a CA root.
#[test]
fn validate_checks_the_ca_certificates_a_recipe_adds() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = manifest_dir().join("tests/fixtures/ca");
    for name in ["corp-root.pem", "server.pem", "root-and-key.pem"] {
        std::fs::copy(fixtures.join(name), dir.path().join(name)).unwrap();
    }
    let shipped =
        std::fs::read_to_string(manifest_dir().join("recipes/torch2.4.1-cu121-py3.11.yaml"))
            .unwrap();
    let validate = |file: &str| {
        let recipe = dir.path().join("recipe.yaml");
        std::fs::write(&recipe, format!("{shipped}\nca_certificates: [{file}]\n")).unwrap();
        run(&["validate", recipe.to_str().unwrap()])
    };
    let (code, stdout, stderr) = validate("corp-root.pem");
    assert_eq!(code, 0, "{stdout}{stderr}");
    for (file, expected) in [
        (
            "server.pem",
            "`CN=localhost` is not a certificate authority",
        ),
        ("root-and-key.pem", "a key must never go into an image"),
        ("absent.pem", "does not exist"),
        ("../corp-root.pem", "leaves the recipe's directory"),
    ] {
        let (code, stdout, stderr) = validate(file);
        assert_eq!(code, 1, "{file}: {stdout}{stderr}");
        assert!(
            format!("{stdout}{stderr}").contains(expected),
            "{file}: {stdout}{stderr}"
        );
    }
}
