//! One entry point per parser that reads what a pull request controls (issue 32): the
//! recipe, the lock, requirements files, pyproject.toml, pylock.toml, uv.lock,
//! `.dockerignore`, an OCI layout, and the referrers and attestations stored in one.
//!
//! Each entry takes the bytes of the file as a pull request could write them, runs the
//! real reader on them (from a real file where the reader takes a path) and panics only
//! when a property fails: a panic inside cudastack, an error that cannot be rendered, a
//! lock that does not read back as itself. Two drivers share them: the bounded properties
//! of `tests/parsers_fuzz.rs` (CI) and the libFuzzer targets of `fuzz/` (longer runs,
//! docs/fuzzing.md). This file uses only `cudastack`, `serde_json`, `tempfile` and std, so
//! both can include it.

#![allow(dead_code)] // each driver uses some of the entries

use std::path::{Path, PathBuf};

use cudastack::attest::statement::Statement;
use cudastack::attest::verification::VerificationPredicate;
use cudastack::digest::Digest;
use cudastack::lock::pylock::to_pylock;
use cudastack::lock::python_inputs::PythonInputs;
use cudastack::lock::{Lockfile, Target};
use cudastack::oci::layout::{self, Layout};
use cudastack::recipe::{Platform, Recipe};
use cudastack::sbom::summary::Summary;
use cudastack::sign::{Bundle, Envelope, PublicKey};
use cudastack::stack::layers::copy::dockerignore::IgnorePatterns;

/// Inputs past this size are not run: the readers' own caps (which refuse far larger
/// files before reading them) are tested on their own; a fuzzer learns nothing from
/// megabytes of one input but slowness.
pub const MAX_INPUT: usize = 64 * 1024;

/// Render an error and its causes the way the printer does; a `Display` that panics
/// (a byte slice off a char boundary, say) is a defect like any other.
pub fn render(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str("\nCaused by: ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    assert!(!text.is_empty(), "an error with no message: {error:?}");
    text
}

/// A recipe file: parsed as `cudastack lock` reads it; what parses survives its canonical
/// JSON (what lock digests hash) unchanged, and its tags render or say why not.
pub fn recipe(bytes: &[u8]) {
    if bytes.len() > MAX_INPUT {
        return;
    }
    let recipe = match Recipe::parse_bytes(bytes, Path::new("fuzz.yaml")) {
        Ok(recipe) => recipe,
        Err(error) => {
            render(&error);
            return;
        }
    };
    let again: Recipe = serde_json::from_str(&recipe.canonical_json())
        .expect("a parsed recipe's canonical JSON reads back");
    assert_eq!(again, recipe, "the canonical JSON changed the recipe");
    assert_eq!(again.digest(), recipe.digest());
    let values = recipe.tag_values("localhost:5000", None, None);
    let _ = recipe.render_tags(&values);
}

/// A lock file: a lock that reads is written and read back as the same lock
/// (parse(write(x)) == x, issue 32), byte for byte on the second write; its pylock export
/// and its downloads are made without a panic.
pub fn lock(bytes: &[u8]) {
    if bytes.len() > MAX_INPUT {
        return;
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let lock = match Lockfile::from_json(text, Path::new("fuzz.lock")) {
        Ok(lock) => lock,
        Err(error) => {
            render(&error);
            return;
        }
    };
    let written = lock.to_json();
    let read = match Lockfile::from_json(&written, Path::new("fuzz.lock")) {
        Ok(read) => read,
        Err(error) => panic!(
            "a lock that read does not read back once written: {}\n{written}",
            render(&error)
        ),
    };
    let mut canonical = lock.clone();
    canonical.canonicalize();
    assert_eq!(read, canonical, "the lock changed in a write and read");
    assert_eq!(read.to_json(), written, "the second write differs");
    let _ = to_pylock(&lock);
    let _ = lock.fetch_items(std::path::Path::new(""));
}

/// The Python input formats a recipe reads (issue 19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonInput {
    Requirements,
    Pyproject,
    Pylock,
    UvLock,
}

impl PythonInput {
    pub const ALL: [PythonInput; 4] = [
        PythonInput::Requirements,
        PythonInput::Pyproject,
        PythonInput::Pylock,
        PythonInput::UvLock,
    ];

    /// The file's name, and the recipe line that names it.
    fn file_and_key(self) -> (&'static str, &'static str) {
        match self {
            PythonInput::Requirements => ("requirements.txt", "requirements: [requirements.txt]"),
            PythonInput::Pyproject => (
                "pyproject.toml",
                "pyproject: { path: pyproject.toml, extras: [train, all], groups: [test] }",
            ),
            PythonInput::Pylock => ("pylock.toml", "python_lock: pylock.toml"),
            PythonInput::UvLock => ("uv.lock", "python_lock: uv.lock"),
        }
    }
}

/// A requirements file, pyproject.toml, pylock.toml or uv.lock: written into a recipe's
/// directory and read by [`PythonInputs::load`] for a CPython 3.11 amd64 target, as
/// `cudastack lock` reads it. `included` is written as `shared/base.txt` and
/// `shared/constraints.txt`, which the seed's `-r` and `-c` lines include.
pub fn python_input(kind: PythonInput, bytes: &[u8], included: &[u8]) {
    if bytes.len() > MAX_INPUT || included.len() > MAX_INPUT {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (file, key) = kind.file_and_key();
    std::fs::write(dir.path().join(file), bytes).expect("write the input");
    std::fs::create_dir(dir.path().join("shared")).expect("create shared/");
    for name in ["shared/base.txt", "shared/constraints.txt"] {
        std::fs::write(dir.path().join(name), included).expect("write an include");
    }
    let recipe_path = dir.path().join("recipe.yaml");
    let text = format!(
        "name: job\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\n{key}\n"
    );
    let recipe = Recipe::parse(&text, &recipe_path).expect("the driver's recipe parses");
    let target = Target::new(
        "3.11".parse().unwrap(),
        Platform::LinuxAmd64,
        "2.28".parse().unwrap(),
    )
    .unwrap();
    match PythonInputs::load(&recipe, &recipe_path, &target) {
        Ok(inputs) => {
            // Every file read is hashed into the lock's digest.
            assert!(!inputs.files.is_empty(), "a file was read but not recorded");
            let _ = inputs.lock_digest(&recipe);
            for sourced in inputs.roots.iter().chain(&inputs.constraints.versions) {
                let _ = (sourced.requirement.to_string(), sourced.origin.to_string());
            }
        }
        Err(error) => {
            render(&error);
        }
    }
}

/// A `.dockerignore` in a build context: loaded as a build loads it, then asked about
/// paths made of its own lines and a few fixed ones.
pub fn dockerignore(bytes: &[u8]) {
    if bytes.len() > MAX_INPUT {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join(".dockerignore"), bytes).expect("write .dockerignore");
    let patterns = match IgnorePatterns::load(dir.path()) {
        Ok(patterns) => patterns,
        Err(message) => {
            assert!(!message.is_empty());
            return;
        }
    };
    let text = String::from_utf8_lossy(bytes);
    let fixed = ["a", "a/b", "a/b/c.py", ".git/config", "src/main.rs", ""];
    for path in text.lines().take(64).chain(fixed) {
        let path = path.trim().trim_start_matches(['!', '/']);
        let _ = patterns.excludes(path);
    }
    let _ = patterns.has_exceptions();
}

/// An OCI layout a pull request could check in (a `base: { oci: ... }`, or a layout
/// `load`, `push` and `verify` read): `index` is its `index.json`, each of `blobs` is
/// stored under its own digest. Every image, image index, artifact and referrer the index
/// names is read the ways cudastack reads them.
pub fn layout(index: &[u8], blobs: &[&[u8]]) {
    if index.len() + blobs.iter().map(|b| b.len()).sum::<usize>() > MAX_INPUT {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    write_layout(root, index, blobs);
    let mut names: Vec<String> = layout::list_refs(root).unwrap_or_default();
    names.truncate(16);
    names.push("latest".into());
    for name in &names {
        let _ = layout::read(root, name).map_err(|e| render(&e));
        let _ = layout::resolve(root, name).map_err(|e| render(&e));
        let _ = layout::index_images(root, name).map_err(|e| render(&e));
        let _ = layout::read_artifact_blob(root, name).map_err(|e| render(&e));
        if let Ok(opened) = Layout::open(root) {
            let _ = opened.complete_image(name, None).map_err(|e| render(&e));
        }
    }
    // The referrers of every digest the blobs have, and each referrer's blob read as the
    // attestation kinds it could be.
    for blob in blobs.iter().take(8) {
        let subject = Digest::of_bytes(blob);
        match cudastack::attest::store::referrers_of(root, &subject) {
            Ok(referrers) => {
                for referrer in referrers {
                    attestation(&referrer.blob);
                }
            }
            Err(error) => {
                render(&error);
            }
        }
    }
    let _ = cudastack::attest::store::prune(root).map_err(|e| render(&e));
}

/// Write `index` and `blobs` as an OCI layout at `root`.
pub fn write_layout(root: &Path, index: &[u8], blobs: &[&[u8]]) -> Vec<PathBuf> {
    std::fs::write(
        root.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("write oci-layout");
    std::fs::write(root.join("index.json"), index).expect("write index.json");
    let dir = root.join("blobs/sha256");
    std::fs::create_dir_all(&dir).expect("create blobs/sha256");
    blobs
        .iter()
        .map(|blob| {
            let path = dir.join(Digest::of_bytes(blob).hex());
            std::fs::write(&path, blob).expect("write a blob");
            path
        })
        .collect()
}

/// The public key of the bundle cosign wrote for src/sign/bundle.rs's tests: a real key,
/// so a forged bundle meets a real verification.
pub const COSIGN_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEXDwJ36gQijkSavM0p3CQ4WoFL+4L
fptyMRSdtXCiohReM4QUzHIgPbgfTzTfalBjoOGqFE3HG6hMIvi86NGpGA==
-----END PUBLIC KEY-----
";

/// A referrer's blob, read as each kind of attestation cudastack reads from a layout or a
/// registry: a sigstore bundle (then verified and opened with a real key), a bare DSSE
/// envelope, an in-toto statement (then as a verification predicate), an SPDX SBOM.
pub fn attestation(bytes: &[u8]) {
    if bytes.len() > MAX_INPUT {
        return;
    }
    let key = PublicKey::from_pem(COSIGN_PUB).expect("the fixed public key parses");
    match Bundle::from_json(bytes, "fuzz.bundle") {
        Ok(bundle) => {
            let _ = bundle.verify(&key).map_err(|e| render(&e));
            let _ = cudastack::attest::open(&bundle, &key).map_err(|e| render(&e));
        }
        Err(error) => {
            render(&error);
        }
    }
    if let Ok(envelope) = Envelope::from_json(bytes).map_err(|e| render(&e)) {
        let _ = envelope.verify(&key).map_err(|e| render(&e));
        let _ = envelope.verified_by(std::slice::from_ref(&key));
    }
    match Statement::from_bytes(bytes) {
        Ok(statement) => {
            // What is stored and signed is the canonical form: it reads back the same.
            let again = Statement::from_bytes(&statement.to_bytes())
                .expect("a statement's canonical bytes read back");
            assert_eq!(again.to_bytes(), statement.to_bytes());
            let _ = VerificationPredicate::of(&statement).map_err(|e| render(&e));
        }
        Err(error) => {
            render(&error);
        }
    }
    let _ = Summary::of_spdx(bytes).map_err(|e| render(&e));
}
