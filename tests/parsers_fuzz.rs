//! Fuzzing, bounded for CI (issue 32): every parser that reads what a pull request controls
//! (recipe, lock, requirements files, pyproject.toml, pylock.toml, uv.lock, `.dockerignore`,
//! an OCI layout, referrers and attestations) is run on arbitrary bytes and on real inputs
//! mutated as a fuzzer would (bytes inserted, spans dropped or repeated; for JSON, a value
//! replaced by a hostile one, a key dropped, an element repeated; for line formats, lines
//! replaced, repeated, dropped). The properties are in `parsers_fuzz/entries.rs`, shared
//! with the libFuzzer targets of `fuzz/`: no panic, every error renders, a lock reads back
//! as itself. The readers' size caps (no unbounded allocation) are tested here with real
//! oversized files and devices.
//!
//! Coverage-free, so bounded by a case count rather than a time: CUDASTACK_FUZZ_CASES per
//! property (default [`DEFAULT_CASES`]), seeds random per run; a failure is shrunk and its
//! seed kept in `tests/parsers_fuzz.proptest-regressions` (committed), which every later
//! run tries first. docs/fuzzing.md says how to run longer and what was found.

mod entries;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use entries::PythonInput;
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;

/// Cases per property in CI; each takes well under a millisecond to a few (the Python
/// inputs and layouts are real files), so the whole file runs in seconds at this count.
const DEFAULT_CASES: u32 = 1024;

fn config() -> Config {
    let cases = std::env::var("CUDASTACK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    Config {
        cases,
        // Shrinking a slow case must not stall CI: a failure is reported as found after
        // this long, shrunk or not.
        max_shrink_time: 30_000,
        ..Config::default()
    }
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---------------------------------------------------------------------------------------
// Seeds: real inputs of each format, as the repository and cudastack itself write them.
// ---------------------------------------------------------------------------------------

fn recipe_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(repo("recipes"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        paths.sort();
        paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
    })
}

/// A real lock of the repository cut to a few artifacts of each kind (a whole one is
/// ~90 kB, past what a fuzz input should be).
fn lock_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut lock: Value =
            serde_json::from_slice(&read("recipes/torch2.4.1-cu121-py3.11.lock")).unwrap();
        let artifacts = lock["artifacts"].as_array().unwrap();
        let mut kept: Vec<Value> = Vec::new();
        for kind in ["wheel", "deb", "redist-archive"] {
            kept.extend(
                artifacts
                    .iter()
                    .filter(|a| a["kind"] == kind)
                    .take(3)
                    .cloned(),
            );
        }
        lock["artifacts"] = Value::Array(kept);
        let text = serde_json::to_vec_pretty(&lock).unwrap();
        assert!(
            cudastack::lock::Lockfile::from_json(
                std::str::from_utf8(&text).unwrap(),
                Path::new("seed")
            )
            .is_ok(),
            "the seed lock reads"
        );
        vec![text]
    })
}

fn python_seeds(kind: PythonInput) -> Vec<Vec<u8>> {
    match kind {
        PythonInput::Requirements => vec![
            read("tests/fixtures/python-inputs/requirements/requirements.txt"),
            read("tests/fixtures/python-inputs/requirements/shared/constraints.txt"),
        ],
        PythonInput::Pyproject => vec![
            read("tests/fixtures/python-inputs/pyproject/pyproject.toml"),
            read("tests/fixtures/python-inputs/uv-project/pyproject.toml"),
        ],
        PythonInput::Pylock => vec![read("tests/fixtures/python-inputs/uv-project/pylock.toml")],
        PythonInput::UvLock => vec![read("tests/fixtures/python-inputs/uv-project/uv.lock")],
    }
}

fn included_seed() -> Vec<u8> {
    read("tests/fixtures/python-inputs/requirements/shared/base.txt")
}

fn dockerignore_seeds() -> Vec<Vec<u8>> {
    vec![
        read("tests/fixtures/training/.dockerignore"),
        b"# comment\n*.md\n!README.md\n/build\n./dist/**\n**/.git\nsrc/**/test_*.py\n!src/keep/\n[a-c]?.txt\n\\#literal\n"
            .to_vec(),
    ]
}

/// A real layout: an image of one layer, and beside it a signed bundle and an unsigned
/// statement about it, stored as referrers (what `build --sign` leaves). Its files are the
/// seed: `index.json`, then every blob.
fn layout_seed() -> &'static (Vec<u8>, Vec<Vec<u8>>) {
    static SEED: OnceLock<(Vec<u8>, Vec<Vec<u8>>)> = OnceLock::new();
    SEED.get_or_init(|| {
        use cudastack::attest::statement::{Statement, Subject};
        use cudastack::layer::Layer;
        use cudastack::oci::{self, layout};
        let work = tempfile::tempdir().unwrap();
        let bytes = b"a layer, hashed like one".to_vec();
        let blob = work.path().join("layer");
        std::fs::write(&blob, &bytes).unwrap();
        let layer = Layer {
            digest: cudastack::digest::Digest::of_bytes(&bytes),
            diff_id: cudastack::digest::Digest::of_bytes(b"diff"),
            size: bytes.len() as u64,
            uncompressed_size: None,
            media_type: oci_spec::image::MediaType::ImageLayer,
            blob,
        };
        let image = oci::Image::new(1_700_000_000)
            .with_layer(layer, "one layer")
            .with_label("io.cudastack.test", "fuzz");
        let dir = work.path().join("layout");
        let digest = layout::write(&image, &dir, "latest").unwrap();
        let statement = Statement::new(
            vec![Subject::image("fuzz", &digest)],
            cudastack::attest::verification::PREDICATE_TYPE,
            serde_json::json!({"verdict": "pass"}),
        );
        let key = cudastack::sign::SigningKey::generate().unwrap();
        let bundle = cudastack::attest::sign(&statement, &key);
        cudastack::attest::store::attach(
            &dir,
            &image_descriptor(&dir),
            "verification",
            cudastack::sign::bundle::MEDIA_TYPE,
            bundle.to_json(),
            Default::default(),
        )
        .unwrap();
        cudastack::attest::store::attach_statement(
            &dir,
            &image_descriptor(&dir),
            "provenance",
            &statement,
        )
        .unwrap();
        let index = std::fs::read(dir.join("index.json")).unwrap();
        let mut blobs: Vec<Vec<u8>> = std::fs::read_dir(dir.join("blobs/sha256"))
            .unwrap()
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        blobs.sort();
        (index, blobs)
    })
}

fn image_descriptor(dir: &Path) -> oci_spec::image::Descriptor {
    cudastack::oci::layout::resolve(dir, "latest")
        .unwrap()
        .manifest
}

/// The bundle `cosign attest-blob --bundle` 3.1.1 wrote (the key is [`entries::COSIGN_PUB`]).
const COSIGN_BUNDLE: &str = r#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{"publicKey":{"hint":"/XsztIoyScbLp2kmz8ZwWqmvyTrFN8seQY6wkEl5mXw="}},"dsseEnvelope":{"payload":"eyJfdHlwZSI6Imh0dHBzOi8vaW4tdG90by5pby9TdGF0ZW1lbnQvdjAuMSIsInN1YmplY3QiOlt7Im5hbWUiOiJibG9iIiwiZGlnZXN0Ijp7InNoYTI1NiI6IjU4OTFiNWI1MjJkNWRmMDg2ZDBmZjBiMTEwZmJkOWQyMWJiNGZjNzE2M2FmMzRkMDgyODZhMmU4NDZmNmJlMDMifX1dLCJwcmVkaWNhdGVUeXBlIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS90L3YxIiwicHJlZGljYXRlIjp7ImJ1aWxkVHlwZSI6IngifX0=","payloadType":"application/vnd.in-toto+json","signatures":[{"sig":"MEUCIQCYwmmEJnpOgeIaEX3ugsk7PAVBZLi2LyH2VYREeYPZmwIgZUP2DWazz4uJjCJLVJ0ivJbRInz4oM5Za+mei+tdWg8="}]}}"#;

/// An SPDX document as `inspect` reads one: the image, a deb, a wheel, a CUDA component
/// with a fact.
const SPDX: &str = r#"{"spdxVersion":"SPDX-2.3","name":"img","creationInfo":{"created":"2024-01-01T00:00:00Z"},"packages":[{"SPDXID":"SPDXRef-image","name":"img"},{"SPDXID":"SPDXRef-deb","name":"libc6","versionInfo":"2.36-9","externalRefs":[{"referenceType":"purl","referenceLocator":"pkg:deb/debian/libc6@2.36-9"}]},{"SPDXID":"SPDXRef-wheel","name":"torch","versionInfo":"2.4.1","externalRefs":[{"referenceType":"purl","referenceLocator":"pkg:pypi/torch@2.4.1"}]},{"SPDXID":"SPDXRef-cuda","name":"cuda_cudart","versionInfo":"12.4.127","externalRefs":[{"referenceType":"purl","referenceLocator":"pkg:generic/cuda_cudart@12.4.127"}],"annotations":[{"comment":"cudastack.cuda=12.4"}]}],"relationships":[{"spdxElementId":"SPDXRef-DOCUMENT","relationshipType":"DESCRIBES","relatedSpdxElement":"SPDXRef-image"},{"spdxElementId":"SPDXRef-image","relationshipType":"CONTAINS","relatedSpdxElement":"SPDXRef-cuda"}]}"#;

fn attestation_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut seeds = vec![COSIGN_BUNDLE.as_bytes().to_vec(), SPDX.as_bytes().to_vec()];
        // The referrer blobs of the layout seed: a cudastack bundle and a bare statement.
        seeds.extend(
            layout_seed()
                .1
                .iter()
                .filter(|b| b.starts_with(b"{\"") && b.len() > 100)
                .cloned(),
        );
        seeds
    })
}

// ---------------------------------------------------------------------------------------
// Mutations: what a fuzzer does to a seed, as proptest strategies (so failures shrink).
// ---------------------------------------------------------------------------------------

/// Text that breaks parsers: multi-byte characters (a byte slice off a char boundary
/// panics), controls, NUL, huge and negative numbers, paths that climb, deep nesting.
const TOKENS: &[&str] = &[
    "é",
    "€",
    "😀",
    "\u{202e}",
    "\u{1b}[2J",
    "\0",
    "\r",
    "\n",
    "\t",
    "\\",
    "\"",
    "'",
    "#",
    "=",
    "==",
    ";",
    ",",
    ":",
    "@",
    "[",
    "]",
    "{",
    "}",
    "[[",
    "]]",
    "-",
    "--",
    "../",
    "/",
    "~",
    "*",
    "**",
    "!",
    "?",
    "-1",
    "0",
    "18446744073709551616",
    "1e999",
    "NaN",
    "true",
    "null",
    "sha256:",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "https://",
    "file:///etc/passwd",
    "%2e%2e",
    " ; python_version < '3.12'",
    " \\\n",
    "&a",
    "*a",
    "<<: *a",
    "!!binary",
    "%YAML 1.2\n---\n",
];

fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(TOKENS).prop_map(|t| t.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 1..16),
        1 => (prop::sample::select(&["[", "{", "- ", "(", "\""][..]), 1usize..400)
            .prop_map(|(t, n)| t.repeat(n).into_bytes()),
    ]
}

#[derive(Debug, Clone)]
enum ByteEdit {
    Insert(prop::sample::Index, Vec<u8>),
    Delete(prop::sample::Index, usize),
    Repeat(prop::sample::Index, usize),
    Flip(prop::sample::Index, u8),
    Truncate(prop::sample::Index),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        3 => (any::<prop::sample::Index>(), token()).prop_map(|(i, t)| ByteEdit::Insert(i, t)),
        2 => (any::<prop::sample::Index>(), 1usize..64).prop_map(|(i, n)| ByteEdit::Delete(i, n)),
        1 => (any::<prop::sample::Index>(), 1usize..64).prop_map(|(i, n)| ByteEdit::Repeat(i, n)),
        2 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Flip(i, b)),
        1 => any::<prop::sample::Index>().prop_map(ByteEdit::Truncate),
    ]
}

fn apply_bytes(mut bytes: Vec<u8>, edits: &[ByteEdit]) -> Vec<u8> {
    for edit in edits {
        let at = |i: &prop::sample::Index, len: usize| i.index(len + 1);
        match edit {
            ByteEdit::Insert(i, t) => {
                let at = at(i, bytes.len());
                bytes.splice(at..at, t.iter().copied());
            }
            ByteEdit::Delete(i, n) => {
                let at = at(i, bytes.len());
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
            ByteEdit::Repeat(i, n) => {
                let at = at(i, bytes.len());
                let end = (at + n).min(bytes.len());
                let span = bytes[at..end].to_vec();
                bytes.splice(at..at, span);
            }
            ByteEdit::Flip(i, b) if !bytes.is_empty() => {
                let at = i.index(bytes.len());
                bytes[at] = *b;
            }
            ByteEdit::Flip(..) => {}
            ByteEdit::Truncate(i) => bytes.truncate(at(i, bytes.len())),
        }
    }
    bytes
}

/// A seed with a few byte-level edits.
fn mutated_bytes(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(seeds),
        prop::collection::vec(byte_edit(), 1..6),
    )
        .prop_map(|(seed, edits)| apply_bytes(seed, &edits))
}

/// A line-based or TOML seed with lines replaced (the value after `=` or the whole line),
/// repeated, dropped, or a hostile line inserted.
fn mutated_lines(
    seeds: Vec<Vec<u8>>,
    extra: &'static [&'static str],
) -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        2 => prop::sample::select(extra).prop_map(str::to_string),
        1 => prop::sample::select(TOKENS).prop_map(str::to_string),
        1 => "\\PC{0,24}",
    ];
    (
        prop::sample::select(seeds),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, line, value()), 1..6),
    )
        .prop_map(|(seed, edits)| {
            let text = String::from_utf8_lossy(&seed).into_owned();
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            for (index, kind, line, value) in edits {
                let at = index
                    .index(lines.len().max(1))
                    .min(lines.len().saturating_sub(1));
                match kind {
                    // A value replaced, its key kept (`key = value`, `key: value`).
                    0 if !lines.is_empty() => {
                        let split = [" = ", ": ", "=="].iter().find_map(|s| {
                            lines[at].split_once(s).map(|(k, _)| (k.to_string(), *s))
                        });
                        lines[at] = match split {
                            Some((key, sep)) if !key.trim().is_empty() => {
                                format!("{key}{sep}{value}")
                            }
                            _ => line,
                        }
                    }
                    1 if !lines.is_empty() => lines.insert(at, lines[at].clone()),
                    2 if !lines.is_empty() => {
                        lines.remove(at);
                    }
                    _ => lines.insert(at, line),
                }
            }
            (lines.join("\n") + "\n").into_bytes()
        })
}

/// A value for a `key = value` or `key: value` line: well-formed in TOML and YAML, wrong in
/// type, size or content.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(
            &[
                "\"é\"",
                "\"\"",
                "\"1.0\"",
                "\"0\"",
                "\"six\"",
                "\"../../x\"",
                "\"/etc/passwd\"",
                "\"==1\"",
                "\"1.0 ; python_version < '3'\"",
                "\"sha256:00\"",
                "\"https://é/x.whl\"",
                "[]",
                "{}",
                "[\"é\"]",
                "[1, 2]",
                "{ a = 1 }",
                "1",
                "-1",
                "0",
                "true",
                "1e999",
                "18446744073709551616",
                "\"\\u0000\"",
                "\"\\u001b[2J\"",
                "\"{torch}é\"",
                "~",
                "null",
                "&a x",
                "*a",
            ][..]
        )
        .prop_map(str::to_string),
        "\"[ -~é]{0,30}\"".prop_map(|s| s.replace('\\', "")),
        (1usize..3000).prop_map(|n| format!("\"{}\"", "é".repeat(n))),
    ]
}

/// A JSON value that breaks readers expecting another type or a sane size.
fn hostile_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(serde_json::json!(true)),
        Just(serde_json::json!(0)),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(u64::MAX)),
        Just(serde_json::json!(i64::MIN)),
        Just(serde_json::json!(1e308)),
        Just(serde_json::json!("")),
        Just(serde_json::json!({})),
        Just(serde_json::json!([])),
        (1usize..200).prop_map(|depth| (0..depth).fold(Value::Null, |v, _| Value::Array(vec![v]))),
        prop::sample::select(TOKENS).prop_map(Value::from),
        "\\PC{0,40}".prop_map(Value::from),
        "[é€😀a-z0-9:/.]{0,80}".prop_map(Value::from),
        (1usize..2000).prop_map(|n| Value::from("é".repeat(n))),
    ]
}

#[derive(Debug, Clone)]
enum JsonEdit {
    Replace(prop::sample::Index, Value),
    /// The value at one place moved to another (type-correct values in wrong places).
    Copy(prop::sample::Index, prop::sample::Index),
    Remove(prop::sample::Index),
    Repeat(prop::sample::Index),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    prop_oneof![
        3 => (any::<prop::sample::Index>(), hostile_json()).prop_map(|(i, v)| JsonEdit::Replace(i, v)),
        2 => (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(a, b)| JsonEdit::Copy(a, b)),
        2 => any::<prop::sample::Index>().prop_map(JsonEdit::Remove),
        1 => any::<prop::sample::Index>().prop_map(JsonEdit::Repeat),
    ]
}

/// Every place in a JSON value, as a JSON pointer.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let key = key.replace('~', "~0").replace('/', "~1");
                pointers(inner, format!("{at}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                pointers(inner, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

fn apply_json(mut value: Value, edits: &[JsonEdit]) -> Value {
    for edit in edits {
        let mut places = Vec::new();
        pointers(&value, String::new(), &mut places);
        let place = |i: &prop::sample::Index| places[i.index(places.len())].clone();
        match edit {
            JsonEdit::Replace(i, new) => {
                if let Some(slot) = value.pointer_mut(&place(i)) {
                    *slot = new.clone();
                }
            }
            JsonEdit::Copy(from, to) => {
                let moved = value.pointer(&place(from)).cloned();
                if let (Some(moved), Some(slot)) = (moved, value.pointer_mut(&place(to))) {
                    *slot = moved;
                }
            }
            JsonEdit::Remove(i) | JsonEdit::Repeat(i) => {
                let pointer = place(i);
                let Some((parent, last)) = pointer.rsplit_once('/') else {
                    continue;
                };
                let repeat = matches!(edit, JsonEdit::Repeat(_));
                match value.pointer_mut(parent) {
                    Some(Value::Object(map)) => {
                        let key = last.replace("~1", "/").replace("~0", "~");
                        if repeat {
                            // A duplicate key: serde_json keeps the last one; text
                            // readers may not, so write it twice in the output.
                            continue;
                        }
                        map.remove(&key);
                    }
                    Some(Value::Array(items)) => {
                        if let Ok(n) = last.parse::<usize>() {
                            if repeat {
                                let copy = items[n].clone();
                                items.insert(n, copy);
                            } else {
                                items.remove(n);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    value
}

/// A JSON seed with a few value-level edits, written compact or pretty.
fn mutated_json(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(seeds),
        prop::collection::vec(json_edit(), 1..5),
        any::<bool>(),
    )
        .prop_map(|(seed, edits, pretty)| {
            let value: Value = serde_json::from_slice(&seed).expect("JSON seeds parse");
            let value = apply_json(value, &edits);
            if pretty {
                serde_json::to_vec_pretty(&value).unwrap()
            } else {
                serde_json::to_vec(&value).unwrap()
            }
        })
}

fn arbitrary_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        "(?s)\\PC{0,200}".prop_map(String::into_bytes),
    ]
}

/// Any input for a format: arbitrary bytes, seeds edited bytewise, and the
/// format-aware mutations given.
fn input(
    seeds: Vec<Vec<u8>>,
    aware: impl Strategy<Value = Vec<u8>> + 'static,
) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => arbitrary_bytes(),
        2 => mutated_bytes(seeds),
        3 => aware,
    ]
}

/// Lines requirements files and TOML inputs are made of, to splice into seeds.
const PYTHON_LINES: &[&str] = &[
    "-r shared/base.txt",
    "-r requirements.txt",
    "-c shared/base.txt",
    "-r ../outside.txt",
    "-r /etc/passwd",
    "--requirement=shared/base.txt",
    "-e .",
    "--index-url https://example.org/simple",
    "--hash=sha256:é",
    "six==1.16.0 --hash=sha256:0000",
    "torch==2.4.1 ; python_version >= '3.11' and platform_machine == 'x86_64'",
    "pkg @ https://example.org/pkg.whl",
    "pkg[extra]>=1,<2",
    "é==1",
    "idna===3.7",
    "[project]",
    "[project.optional-dependencies]",
    "[dependency-groups]",
    "test = [{ include-group = \"test\" }]",
    "all = [\"trainer[all]\"]",
    "dependencies = [\"idna>=3.6\", 3]",
    "[[package]]",
    "[[packages]]",
    "name = \"é\"",
    "version = \"1.0\"",
    "marker = \"python_version < '3'\"",
    "environments = [\"sys_platform == 'win32'\"]",
    "lock-version = \"2.0\"",
    "dependencies = [{ name = \"six\" }]",
    "source = { editable = \".\" }",
    "wheels = [{ url = \"https://x/é.whl\", hashes = { sha256 = \"é\" } }]",
    "sdist = { url = \"https://x/a.tar.gz\", hash = \"sha256:00\" }",
    "optional-dependencies = { train = [{ name = \"tqdm\" }] }",
    "a = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "a = { b = { c = { d = { e = { f = { g = 1 } } } } } }",
];

const DOCKERIGNORE_LINES: &[&str] = &[
    "**",
    "**/",
    "!**",
    "*",
    "!",
    "!!a",
    "/",
    "./",
    "../..",
    "a/../../b",
    "[",
    "[!]",
    "[]]",
    "[a-]",
    "{a,b}",
    "{a,{b,c}}",
    "{",
    "\\",
    "a\\",
    "\\*",
    "**/**/**/**/**/**",
    "?é",
    "é/**",
    "# x",
    "  spaced  ",
    "\u{0}",
    "a//b",
    "./././a",
];

/// After blobs of the layout seed were edited, point every document that named an edited
/// blob's old digest at its new one, until no digest moves (manifest -> config, index ->
/// manifest, artifact -> subject: a few rounds), so the reader reaches the edited
/// document instead of stopping at a missing blob.
fn relink(mut index: Vec<u8>, mut blobs: Vec<Vec<u8>>) -> (Vec<u8>, Vec<Vec<u8>>) {
    let digest = |b: &[u8]| cudastack::digest::Digest::of_bytes(b).to_string();
    let mut named: Vec<String> = layout_seed().1.iter().map(|b| digest(b)).collect();
    for _ in 0..6 {
        let moved: Vec<(String, String)> = named
            .iter()
            .zip(&blobs)
            .map(|(old, blob)| (old.clone(), digest(blob)))
            .filter(|(old, new)| old != new)
            .collect();
        if moved.is_empty() {
            break;
        }
        let replace = |bytes: &[u8]| -> Vec<u8> {
            let mut text = String::from_utf8_lossy(bytes).into_owned();
            for (old, new) in &moved {
                text = text.replace(old.as_str(), new);
            }
            text.into_bytes()
        };
        // The edited blobs now stand under their new digests.
        named = blobs.iter().map(|b| digest(b)).collect();
        index = replace(&index);
        // A relinked blob's digest moves again: `named` keeps the one the others now
        // use, so the next round repoints them.
        for blob in blobs.iter_mut() {
            *blob = replace(blob);
        }
    }
    (index, blobs)
}

// ---------------------------------------------------------------------------------------
// The properties.
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn recipes(bytes in input(recipe_seeds().to_vec(), mutated_lines(recipe_seeds().to_vec(), &["<<: *a", "a: &a [*a, *a, *a]", "name: é", "tags: [\"{torch}é\"]", "source_date_epoch: 18446744073709551616", "base: { oci: \"../é\" }", "copy: [{ src: \"é\", dest: /x, exclude: [\"[\"] }]"]))) {
        entries::recipe(&bytes);
    }

    #[test]
    fn locks(bytes in input(lock_seeds().to_vec(), mutated_json(lock_seeds().to_vec()))) {
        entries::lock(&bytes);
    }

    #[test]
    fn requirements_files(
        bytes in input(python_seeds(PythonInput::Requirements), mutated_lines(python_seeds(PythonInput::Requirements), PYTHON_LINES)),
        included in prop_oneof![Just(included_seed()), mutated_lines(vec![included_seed()], PYTHON_LINES)],
    ) {
        entries::python_input(PythonInput::Requirements, &bytes, &included);
    }

    #[test]
    fn pyprojects(bytes in input(python_seeds(PythonInput::Pyproject), mutated_lines(python_seeds(PythonInput::Pyproject), PYTHON_LINES))) {
        entries::python_input(PythonInput::Pyproject, &bytes, &included_seed());
    }

    #[test]
    fn pylocks(bytes in input(python_seeds(PythonInput::Pylock), mutated_lines(python_seeds(PythonInput::Pylock), PYTHON_LINES))) {
        entries::python_input(PythonInput::Pylock, &bytes, &included_seed());
    }

    #[test]
    fn uv_locks(bytes in input(python_seeds(PythonInput::UvLock), mutated_lines(python_seeds(PythonInput::UvLock), PYTHON_LINES))) {
        entries::python_input(PythonInput::UvLock, &bytes, &included_seed());
    }

    #[test]
    fn dockerignores(bytes in input(dockerignore_seeds(), mutated_lines(dockerignore_seeds(), DOCKERIGNORE_LINES))) {
        entries::dockerignore(&bytes);
    }

    /// The layout's documents edited as JSON, each blob stored under its new digest, and
    /// the index's descriptors pointed at the edited blobs (so the reader gets past the
    /// digest check to the document itself).
    #[test]
    fn oci_layouts(
        which in any::<prop::sample::Index>(),
        edited in mutated_json(layout_seed().1.iter().filter(|b| serde_json::from_slice::<Value>(b).is_ok()).cloned().collect()),
        index in prop_oneof![Just(layout_seed().0.clone()), mutated_json(vec![layout_seed().0.clone()]), arbitrary_bytes()],
    ) {
        let (_, blobs) = layout_seed();
        let mut blobs = blobs.clone();
        let at = which.index(blobs.len());
        blobs[at] = edited;
        let (index, blobs) = relink(index, blobs);
        let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
        entries::layout(&index, &refs);
    }

    #[test]
    fn attestations(bytes in input(attestation_seeds().to_vec(), mutated_json(attestation_seeds().to_vec()))) {
        entries::attestation(&bytes);
    }
}

// ---------------------------------------------------------------------------------------
// Caps: a hostile file may be huge, or a device that never ends; the readers refuse it
// before reading more than their limit (issue 32: no unbounded allocation).
// ---------------------------------------------------------------------------------------

/// A sparse file of `size` bytes (no disk used): what a pull request's huge file costs a
/// reader that does not stop.
fn sparse(path: &Path, size: u64) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
}

/// Run `read` on another thread; a reader that blocks (on a FIFO no one writes) fails the
/// test after `seconds` instead of hanging the suite.
fn within<T: Send + 'static>(seconds: u64, read: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || send.send(read()));
    receive
        .recv_timeout(std::time::Duration::from_secs(seconds))
        .expect("the reader blocked instead of refusing the input")
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_recipe_past_the_cap_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recipe.yaml");
    sparse(&path, cudastack::recipe::MAX_RECIPE_BYTES + 1);
    let error = cudastack::recipe::Recipe::load(&path).unwrap_err();
    let message = entries::render(&error);
    assert!(message.contains("larger than"), "{message}");
    assert!(message.contains("recipe.yaml"), "{message}");
}

/// A recipe that is a link to a device (`/dev/zero` would be read until memory ran out;
/// `/dev/null` shows the refusal without that risk) or a FIFO is refused, not read.
#[test]
fn a_recipe_that_is_a_device_or_a_fifo_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device.yaml");
    std::os::unix::fs::symlink("/dev/null", &device).unwrap();
    let message = entries::render(&cudastack::recipe::Recipe::load(&device).unwrap_err());
    assert!(message.contains("a device"), "{message}");
    let fifo = dir.path().join("fifo.yaml");
    mkfifo(&fifo);
    let message = within(10, move || {
        entries::render(&cudastack::recipe::Recipe::load(&fifo).unwrap_err())
    });
    assert!(message.contains("named pipe"), "{message}");
}

/// A lock that is a FIFO, or a link to a device or to `/dev/stdin` (a pull request can carry
/// the link; CI's stdin is often an open pipe), blocked `build`, `lock` and `lock --check`
/// for ever: it is refused, not read.
#[test]
fn a_lock_that_is_a_device_or_a_fifo_is_refused() {
    use cudastack::lock::lockfile::Lockfile;
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device.lock");
    std::os::unix::fs::symlink("/dev/null", &device).unwrap();
    let message = entries::render(&Lockfile::read(&device).unwrap_err());
    assert!(message.contains("a device"), "{message}");
    let fifo = dir.path().join("fifo.lock");
    mkfifo(&fifo);
    let message = within(10, move || {
        entries::render(&Lockfile::read(&fifo).unwrap_err())
    });
    assert!(message.contains("named pipe"), "{message}");
}

/// An OCI layout's `index.json` and its documents (manifest, config, referrers) are read
/// whole: each is capped, and one that is a device or FIFO is refused.
#[test]
fn layout_documents_past_the_cap_or_not_files_are_refused() {
    let (index, blobs) = layout_seed();
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    let limit = cudastack::oci::layout::MAX_DOCUMENT_BYTES;

    // index.json: huge, then a device, then a FIFO.
    let dir = tempfile::tempdir().unwrap();
    entries::write_layout(dir.path(), index, &refs);
    sparse(&dir.path().join("index.json"), limit + 1);
    let message = entries::render(&cudastack::oci::layout::Layout::open(dir.path()).unwrap_err());
    assert!(message.contains("larger than"), "{message}");
    std::fs::remove_file(dir.path().join("index.json")).unwrap();
    std::os::unix::fs::symlink("/dev/null", dir.path().join("index.json")).unwrap();
    let message = entries::render(&cudastack::oci::layout::Layout::open(dir.path()).unwrap_err());
    assert!(message.contains("a device"), "{message}");
    std::fs::remove_file(dir.path().join("index.json")).unwrap();
    mkfifo(&dir.path().join("index.json"));
    let root = dir.path().to_path_buf();
    let message = within(10, move || {
        entries::render(&cudastack::oci::layout::Layout::open(&root).unwrap_err())
    });
    assert!(message.contains("named pipe"), "{message}");

    // The manifest `latest` names: huge (its digest cannot match, but it must not be read
    // to find that out), then a link to a device.
    let dir = tempfile::tempdir().unwrap();
    entries::write_layout(dir.path(), index, &refs);
    let manifest = cudastack::oci::layout::resolve(dir.path(), "latest")
        .unwrap()
        .manifest_digest;
    let blob = cudastack::oci::layout::blob_path(dir.path(), &manifest);
    std::fs::remove_file(&blob).unwrap();
    sparse(&blob, limit + 1);
    let message =
        entries::render(&cudastack::oci::layout::resolve(dir.path(), "latest").unwrap_err());
    assert!(message.contains("larger than"), "{message}");
    std::fs::remove_file(&blob).unwrap();
    std::os::unix::fs::symlink("/dev/null", &blob).unwrap();
    let message =
        entries::render(&cudastack::oci::layout::resolve(dir.path(), "latest").unwrap_err());
    assert!(message.contains("a device"), "{message}");
}

/// The readers of the other inputs were capped in the first round of issue 32; these hold
/// them to it with the same real files.
#[test]
fn the_other_inputs_past_their_caps_are_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("big.lock");
    sparse(&lock, cudastack::lock::lockfile::MAX_LOCK_BYTES + 1);
    let message = entries::render(&cudastack::lock::Lockfile::read(&lock).unwrap_err());
    assert!(message.contains("larger than"), "{message}");

    sparse(&dir.path().join(".dockerignore"), (1 << 20) + 1);
    let message =
        cudastack::stack::layers::copy::dockerignore::IgnorePatterns::load(dir.path()).unwrap_err();
    assert!(message.contains("1048576"), "{message}");

    let requirements = dir.path().join("requirements.txt");
    sparse(
        &requirements,
        cudastack::lock::python_inputs::MAX_INPUT_BYTES + 1,
    );
    let recipe_path = dir.path().join("recipe.yaml");
    let recipe = cudastack::recipe::Recipe::parse(
        "name: job\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\nrequirements: [requirements.txt]\n",
        &recipe_path,
    )
    .unwrap();
    let target = cudastack::lock::Target::new(
        "3.11".parse().unwrap(),
        cudastack::recipe::Platform::LinuxAmd64,
        "2.28".parse().unwrap(),
    )
    .unwrap();
    let error = cudastack::lock::python_inputs::PythonInputs::load(&recipe, &recipe_path, &target)
        .unwrap_err();
    let message = entries::render(&error);
    assert!(message.contains("larger than"), "{message}");

    let oversized = vec![b' '; cudastack::sbom::summary::MAX_SBOM_BYTES + 1];
    let message =
        entries::render(&cudastack::sbom::summary::Summary::of_spdx(&oversized).unwrap_err());
    assert!(message.contains("more than"), "{message}");
}

/// Nesting thousands of levels deep (as deep as [`entries::MAX_INPUT`] allows): each
/// format's reader refuses it with an error (a recursion limit), never a stack overflow,
/// which would abort the process (no panic hook, no error message, and in CI the whole test
/// binary).
#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    const DEPTH: usize = 30_000;
    let flow = format!("name: {}{}\n", "[".repeat(DEPTH), "]".repeat(DEPTH));
    let block: String = (0..200)
        .map(|i| format!("{}- \n", " ".repeat(i * 2)))
        .collect();
    let mapping: String = (0..200)
        .map(|i| format!("{}a:\n", " ".repeat(i * 2)))
        .collect();
    for text in [flow, block, mapping, format!("{}a", "- ".repeat(DEPTH))] {
        assert!(text.len() <= entries::MAX_INPUT);
        entries::recipe(text.as_bytes());
    }
    let json = format!("{}{}", "[".repeat(DEPTH), "]".repeat(DEPTH));
    entries::lock(json.as_bytes());
    entries::attestation(json.as_bytes());
    let half = format!("{}{}", "[".repeat(DEPTH / 2), "]".repeat(DEPTH / 2));
    entries::layout(half.as_bytes(), &[b"{}"]);
    let toml_array = format!("a = {}{}\n", "[".repeat(DEPTH), "]".repeat(DEPTH));
    let toml_table = format!(
        "a = {}1{}\n",
        "{ b = ".repeat(DEPTH / 4),
        " }".repeat(DEPTH / 4)
    );
    let dotted = format!("{} = 1\n", vec!["a"; DEPTH].join("."));
    for text in [toml_array, toml_table, dotted] {
        assert!(text.len() <= entries::MAX_INPUT);
        for kind in [
            PythonInput::Pyproject,
            PythonInput::Pylock,
            PythonInput::UvLock,
        ] {
            entries::python_input(kind, text.as_bytes(), b"");
        }
    }
}

/// The format-aware mutations keep enough of each seed's structure that a good share of
/// them still parses, so the properties exercise what lies behind the syntax (the lock's
/// round trip, the layout's image reader, the Python inputs' requirements) and not only
/// the syntax errors. A mutator that broke every input would pass every property and test
/// nothing; this fails instead.
#[test]
fn mutations_reach_past_the_syntax() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    const SAMPLES: usize = 300;
    fn share(strategy: impl Strategy<Value = Vec<u8>>, parses: impl Fn(&[u8]) -> bool) -> f64 {
        let mut runner = TestRunner::deterministic();
        let ok = (0..SAMPLES)
            .filter(|_| parses(&strategy.new_tree(&mut runner).unwrap().current()))
            .count();
        ok as f64 / SAMPLES as f64
    }
    let lock = share(mutated_json(lock_seeds().to_vec()), |b| {
        std::str::from_utf8(b)
            .is_ok_and(|t| cudastack::lock::Lockfile::from_json(t, Path::new("l")).is_ok())
    });
    let recipe = share(mutated_lines(recipe_seeds().to_vec(), &["name: é"]), |b| {
        cudastack::recipe::Recipe::parse_bytes(b, Path::new("r")).is_ok()
    });
    let requirements = share(
        mutated_lines(python_seeds(PythonInput::Requirements), PYTHON_LINES),
        |b| python_inputs_load(PythonInput::Requirements, b),
    );
    let uv_lock = share(
        mutated_lines(python_seeds(PythonInput::UvLock), PYTHON_LINES),
        |b| python_inputs_load(PythonInput::UvLock, b),
    );
    let layout = share(mutated_json(vec![layout_seed().0.clone()]), |index| {
        let dir = tempfile::tempdir().unwrap();
        let refs: Vec<&[u8]> = layout_seed().1.iter().map(Vec::as_slice).collect();
        entries::write_layout(dir.path(), index, &refs);
        cudastack::oci::layout::Layout::open(dir.path()).is_ok()
    });
    let shares = [
        ("lock", lock),
        ("recipe", recipe),
        ("requirements", requirements),
        ("uv.lock", uv_lock),
        ("layout", layout),
    ];
    eprintln!("shares of mutated inputs that parse: {shares:?}");
    for (what, share) in shares {
        assert!(
            share >= 0.05,
            "{what}: only {share} of mutated inputs parse"
        );
        assert!(
            share <= 0.95,
            "{what}: {share} of mutated inputs parse: the mutations change nothing"
        );
    }
}

/// Whether `PythonInputs::load` reads `bytes` as the input `kind` without an error.
fn python_inputs_load(kind: PythonInput, bytes: &[u8]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let (file, key) = match kind {
        PythonInput::Requirements => ("requirements.txt", "requirements: [requirements.txt]"),
        _ => ("uv.lock", "python_lock: uv.lock"),
    };
    std::fs::write(dir.path().join(file), bytes).unwrap();
    std::fs::create_dir(dir.path().join("shared")).unwrap();
    std::fs::write(dir.path().join("shared/base.txt"), included_seed()).unwrap();
    std::fs::write(
        dir.path().join("shared/constraints.txt"),
        read("tests/fixtures/python-inputs/requirements/shared/constraints.txt"),
    )
    .unwrap();
    let path = dir.path().join("recipe.yaml");
    let recipe = cudastack::recipe::Recipe::parse(
        &format!("name: job\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\n{key}\n"),
        &path,
    )
    .unwrap();
    let target = cudastack::lock::Target::new(
        "3.11".parse().unwrap(),
        cudastack::recipe::Platform::LinuxAmd64,
        "2.28".parse().unwrap(),
    )
    .unwrap();
    cudastack::lock::python_inputs::PythonInputs::load(&recipe, &path, &target).is_ok()
}
