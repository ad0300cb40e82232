//! Issue 22: what is inside an image and who proved it. The SBOM, the provenance and the
//! verification statement stored beside an image are signed with a cosign key, verified by
//! cosign itself (Debian's cosign 3.1, scripts/setup.sh) after a push to Debian's real
//! `docker-registry`, pulled into another layout with the image, and `check
//! --require-signed-by` says yes only for the right key, the right image and the right GPU
//! class; a flipped byte anywhere makes it say no.
//!
//! The verification report is the one a probe prints on an H200 (`verify_record::report`),
//! written by hand in the probe's format: this machine has no GPU, and what is tested here
//! is what cudastack does with a report, not the probe (tests/build_e2e.rs runs that). The
//! SBOM and provenance are made by the library from the committed torch 2.4.1 lock, as the
//! build makes them (the build path itself: tests/build_publish.rs).

use crate::build_publish;
use crate::e2e_support;
use crate::gate;
use crate::registry_support::{self, Registry};
use crate::verify_record::{report, write_image};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cudastack::attest::statement::{Statement, Subject};
use cudastack::attest::{provenance, store, verification};
use cudastack::cache::BlobStore;
use cudastack::lock::Lockfile;
use cudastack::oci::layout;
use cudastack::sign::bundle::{self, Bundle};
use cudastack::verify::record::record_in_layout;

const PASSWORD: &str = "correct horse battery staple";

fn skip_reason() -> Option<gate::Skip> {
    if let Some(skip) = registry_support::skip_reason() {
        return Some(skip);
    }
    if !registry_support::have("cosign") {
        return Some(gate::Skip::missing(
            "cosign",
            "cosign is not installed (scripts/setup.sh installs Debian's)".to_string(),
        ));
    }
    let python = Command::new("python3")
        .args(["-c", "import securesystemslib.dsse, cryptography"])
        .output();
    (!python.is_ok_and(|o| o.status.success())).then(|| {
        gate::Skip::missing(
            "securesystemslib",
            "python3 cannot import securesystemslib (scripts/setup.sh installs it)".to_string(),
        )
    })
}

fn cudastack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(args)
        .env("COSIGN_PASSWORD", PASSWORD)
        .env_remove("CUDASTACK_SIGN_KEY")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A key pair made by cosign itself in `dir`: (private key, public key).
fn cosign_key_pair(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let output = Command::new("cosign")
        .args(["generate-key-pair"])
        .current_dir(dir)
        .env("COSIGN_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    (dir.join("cosign.key"), dir.join("cosign.pub"))
}

/// `cosign verify-attestation` of `image` for `predicate_type` with `public_key`.
fn cosign_verifies(image: &str, public_key: &Path, predicate_type: &str) -> Output {
    Command::new("cosign")
        .args([
            "verify-attestation",
            "--insecure-ignore-tlog",
            "--allow-insecure-registry",
        ])
        .arg("--key")
        .arg(public_key)
        .args(["--type", predicate_type, image])
        .output()
        .unwrap()
}

/// An image with a verified H200 run recorded, and the SBOM and provenance a build of the
/// torch 2.4.1 lock stores, all unsigned; returns the image's ref name after recording
/// (`latest`, now the verified copy) and the manifest the probe ran in.
fn recorded_image(dir: &Path, store: &BlobStore) -> cudastack::digest::Digest {
    let ran = write_image(dir, store);
    let image = layout::resolve(dir, "latest").unwrap();
    let lock = Lockfile::read(&repo().join("recipes/torch2.4.1-cu121-py3.11.lock")).unwrap();
    let claims = cudastack::verify::check::ImageClaims::default();
    let sbom = cudastack::sbom::spdx_json(&cudastack::sbom::SbomInput {
        name: "torch",
        image: Some(ran),
        lock: &lock,
        claims: &claims,
        built: &[],
        targets: &[],
        created: 1_700_000_000,
        licenses: &|_| None,
    });
    store::attach(
        dir,
        &image.manifest,
        store::SBOM,
        cudastack::sbom::SPDX_MEDIA_TYPE,
        sbom,
        BTreeMap::new(),
    )
    .unwrap();
    let facts = provenance::BuildFacts {
        recipe_path: "recipes/torch2.4.1-cu121-py3.11.yaml",
        lock: &lock,
        platform: "linux/amd64",
        compression: serde_json::json!({"codec": "gzip", "level": 1}),
        encoder: "libdeflate".to_string(),
        source_date_epoch: 1_700_000_000,
        layers: &[],
        source: None,
    };
    let statement = Statement::new(
        vec![Subject::image("torch", &ran)],
        provenance::PREDICATE_TYPE,
        provenance::predicate(&facts),
    );
    store::attach_statement(dir, &image.manifest, store::PROVENANCE, &statement).unwrap();
    let report = report("static,driver,device,ops,train", true);
    let recorded = record_in_layout(dir, "latest", &report).unwrap();
    cudastack::pipeline::attest::after_verify(dir, &report, &recorded, "torch", None).unwrap();
    ran
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `check` of `image` for an H200 node (or `cc`) on driver 550, requiring `key`'s signature.
fn check_signed(image: &str, cc: &str, key: &Path) -> Output {
    cudastack(&[
        "check",
        image,
        "--driver",
        "550.54.15",
        "--cc",
        cc,
        "--require-signed-by",
        key.to_str().unwrap(),
    ])
}

#[test]
fn signed_statements_verify_with_cosign_travel_through_a_registry_and_gate_check() {
    if let Some(reason) = skip_reason() {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (key, public) = cosign_key_pair(&work.path().join("ours"));
    let (_, other_public) = cosign_key_pair(&work.path().join("theirs"));
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    let ran = recorded_image(&dir, &store);
    let image = format!("oci:{}", dir.display());

    // Before signing, no signature can satisfy the policy.
    let unsigned = check_signed(&image, "9.0", &public);
    assert_eq!(unsigned.status.code(), Some(1), "{}", text(&unsigned));

    let signed = cudastack(&["sign", &image, "--key", key.to_str().unwrap()]);
    assert!(signed.status.success(), "{}", text(&signed));
    let listed = String::from_utf8_lossy(&signed.stdout);
    for kind in ["provenance", "sbom.att", "verification-"] {
        assert!(listed.contains(kind), "{kind} not signed:\n{listed}");
    }

    let yes = check_signed(&image, "9.0", &public);
    assert_eq!(yes.status.code(), Some(0), "{}", text(&yes));
    assert!(String::from_utf8_lossy(&yes.stdout).contains("signed verification attestation"));
    let other_key = check_signed(&image, "9.0", &other_public);
    assert_eq!(other_key.status.code(), Some(1), "{}", text(&other_key));
    let other_class = check_signed(&image, "8.0", &public);
    assert_eq!(other_class.status.code(), Some(1), "{}", text(&other_class));
    assert!(
        String::from_utf8_lossy(&other_class.stdout).contains("other GPU classes only"),
        "{}",
        text(&other_class)
    );

    let inspect = cudastack(&[
        "--json",
        "inspect",
        &image,
        "--key",
        public.to_str().unwrap(),
    ]);
    assert!(inspect.status.success(), "{}", text(&inspect));
    let value: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let referrers = value["referrers"].as_array().unwrap();
    let valid: Vec<&str> = referrers
        .iter()
        .filter(|r| r["signature"]["status"] == "valid")
        .filter_map(|r| r["predicate_type"].as_str())
        .collect();
    for predicate in [
        provenance::PREDICATE_TYPE,
        verification::PREDICATE_TYPE,
        cudastack::attest::SPDX_PREDICATE_TYPE,
    ] {
        assert!(
            valid.contains(&predicate),
            "{predicate} not valid: {value:#}"
        );
    }

    // Pushed: cosign finds and verifies each statement on the image in the registry.
    let registry = Registry::start(None);
    let reference = format!("{}/att/torch:2.4.1", registry.host());
    let cache = work.path().join("cache");
    let pushed = cudastack(&[
        "push",
        dir.to_str().unwrap(),
        &reference,
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(pushed.status.success(), "{}", text(&pushed));
    for predicate in [
        verification::PREDICATE_TYPE,
        provenance::PREDICATE_TYPE,
        cudastack::attest::SPDX_PREDICATE_TYPE,
    ] {
        let verified = cosign_verifies(&reference, &public, predicate);
        assert!(
            verified.status.success(),
            "{predicate}: {}",
            text(&verified)
        );
    }
    let refused = cosign_verifies(&reference, &other_public, verification::PREDICATE_TYPE);
    assert!(!refused.status.success(), "{}", text(&refused));
    let from_registry = check_signed(&reference, "9.0", &public);
    assert_eq!(
        from_registry.status.code(),
        Some(0),
        "{}",
        text(&from_registry)
    );

    // A cluster job is emitted only for a digest the key signed a run of on its GPU class.
    let job = |gpu_type: &str, key: &Path| {
        cudastack(&[
            "verify",
            &reference,
            "--emit",
            "k8s-job",
            "--gpu-type",
            gpu_type,
            "--require-signed-by",
            key.to_str().unwrap(),
        ])
    };
    let emitted = job("NVIDIA-H200", &public);
    assert!(emitted.status.success(), "{}", text(&emitted));
    assert!(String::from_utf8_lossy(&emitted.stdout).contains("kind: Job"));
    for (gpu_type, key) in [
        ("NVIDIA-H200", &other_public),
        ("NVIDIA-A100-SXM4-80GB", &public),
    ] {
        let refused = job(gpu_type, key);
        assert_eq!(
            refused.status.code(),
            Some(1),
            "{gpu_type}: {}",
            text(&refused)
        );
        assert!(String::from_utf8_lossy(&refused.stdout).contains("no verification of"));
    }

    // Someone with push rights attaches an unsigned statement claiming an A100 run.
    let forged = forged_verification(&dir, "8.0");
    push_raw_referrer(&reference, &forged);

    // Pulled into another layout, the referrers come along and still verify.
    let pulled_dir = work.path().join("pulled");
    let pulled = cudastack(&[
        "pull",
        &reference,
        "--layout",
        pulled_dir.to_str().unwrap(),
        "--ref",
        "latest",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(pulled.status.success(), "{}", text(&pulled));
    let pulled_image = format!("oci:{}", pulled_dir.display());
    let again = check_signed(&pulled_image, "9.0", &public);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    // What the registry served is never signed here: the forged claim stays unsigned.
    let resign = cudastack(&["sign", &pulled_image, "--key", key.to_str().unwrap()]);
    assert!(resign.status.success(), "{}", text(&resign));
    assert!(
        String::from_utf8_lossy(&resign.stdout).contains("nothing to sign"),
        "{}",
        text(&resign)
    );
    let forged_class = check_signed(&pulled_image, "8.0", &public);
    assert_eq!(
        forged_class.status.code(),
        Some(1),
        "{}",
        text(&forged_class)
    );

    // A job for a GPU type the matrix does not know is refused, not waved through.
    let unknown = job("NVIDIA-X9000", &public);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
    assert!(text(&unknown).contains("not a GPU the matrix knows"));

    // The statement is about the image that ran and its verified copy, nothing else.
    let verified = layout::resolve(&dir, "latest").unwrap().manifest_digest;
    let statement = signed_verification(&dir, &verified);
    assert!(statement.is_about(&ran) && statement.is_about(&verified));
}

/// The verification statement signed on `image`, opened without checking the signature.
fn signed_verification(dir: &Path, image: &cudastack::digest::Digest) -> Statement {
    let referrer = store::referrers_of(dir, image)
        .unwrap()
        .into_iter()
        .find(|r| r.kind.starts_with(store::VERIFICATION_PREFIX))
        .expect("a verification referrer");
    assert_eq!(referrer.artifact_type, bundle::MEDIA_TYPE);
    let bundle = Bundle::from_json(&referrer.blob, "test").unwrap();
    Statement::from_bytes(&bundle.envelope.payload).unwrap()
}

/// A flipped byte in the statement, in the signature, or the signed bundle attached to
/// another image: `check --require-signed-by` says no each time, and securesystemslib
/// (an independent DSSE implementation) agrees about the envelope.
#[test]
fn a_flipped_byte_or_another_image_is_refused() {
    if let Some(reason) = skip_reason() {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (key, public) = cosign_key_pair(&work.path().join("ours"));
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    recorded_image(&dir, &store);
    let image = format!("oci:{}", dir.display());
    let signed = cudastack(&["sign", &image, "--key", key.to_str().unwrap()]);
    assert!(signed.status.success(), "{}", text(&signed));
    let verified = layout::resolve(&dir, "latest").unwrap();
    let referrer = store::referrers_of(&dir, &verified.manifest_digest)
        .unwrap()
        .into_iter()
        .find(|r| r.kind.starts_with(store::VERIFICATION_PREFIX))
        .unwrap();
    let original = Bundle::from_json(&referrer.blob, "test").unwrap();
    assert!(securesystemslib_verifies(&original, &public, work.path()));

    let replace = |bundle: &Bundle| {
        store::attach(
            &dir,
            &verified.manifest,
            &referrer.kind,
            bundle::MEDIA_TYPE,
            bundle.to_json(),
            BTreeMap::new(),
        )
        .unwrap();
    };
    let mut payload = original.clone();
    let at = payload.envelope.payload.len() / 2;
    payload.envelope.payload[at] ^= 1;
    let mut signature = original.clone();
    let last = signature.envelope.signatures[0].sig.len() - 1;
    signature.envelope.signatures[0].sig[last] ^= 1;
    for (what, tampered) in [("payload", &payload), ("signature", &signature)] {
        replace(tampered);
        let answer = check_signed(&image, "9.0", &public);
        assert_eq!(answer.status.code(), Some(1), "{what}: {}", text(&answer));
        assert!(
            String::from_utf8_lossy(&answer.stdout).contains("did not count"),
            "{what}: {}",
            text(&answer)
        );
        assert!(
            !securesystemslib_verifies(tampered, &public, work.path()),
            "securesystemslib accepted a flipped byte in the {what}"
        );
    }
    replace(&original);
    let answer = check_signed(&image, "9.0", &public);
    assert_eq!(answer.status.code(), Some(0), "{}", text(&answer));

    // The same signed bundle on another image (one label differs): about other images.
    let other = layout::read(&dir, "latest")
        .unwrap()
        .with_label("io.cudastack.note", "changed");
    layout::write(&other, &dir, "other").unwrap();
    let other_manifest = layout::resolve(&dir, "other").unwrap().manifest;
    store::attach(
        &dir,
        &other_manifest,
        &referrer.kind,
        bundle::MEDIA_TYPE,
        original.to_json(),
        BTreeMap::new(),
    )
    .unwrap();
    let moved = check_signed(&format!("oci:{}:other", dir.display()), "9.0", &public);
    assert_eq!(moved.status.code(), Some(1), "{}", text(&moved));
    assert!(
        String::from_utf8_lossy(&moved.stdout).contains("about other images"),
        "{}",
        text(&moved)
    );
    let shown = cudastack(&[
        "inspect",
        &format!("oci:{}:other", dir.display()),
        "--key",
        public.to_str().unwrap(),
    ]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("valid, but about other images"),
        "{}",
        text(&shown)
    );
}

/// An unsigned verification statement about the image `latest` of `dir` claiming a run on
/// compute capability `cc`: what someone with push rights could attach.
fn forged_verification(dir: &Path, cc: &str) -> Statement {
    let image = layout::resolve(dir, "latest").unwrap().manifest_digest;
    let mut report = report("static,driver,device,ops,train", true);
    report.gpus[0].compute_capability = cc.to_string();
    report.gpus[0].name = "NVIDIA A100-SXM4-80GB".to_string();
    verification::statement("forged", &report, &image, None)
}

/// Push `statement` unsigned as a referrer of the image `reference` names.
fn push_raw_referrer(reference: &str, statement: &Statement) {
    use cudastack::registry::referrers::{push_referrer, ArtifactLayer, Subject as Target};
    let reference: cudastack::registry::Reference = reference.parse().unwrap();
    let client = cudastack::registry::RegistryClient::new(&reference, Default::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let manifest = runtime.block_on(client.get_manifest(&reference)).unwrap();
    let target = Target {
        media_type: manifest.media_type.clone(),
        digest: manifest.digest,
        size: manifest.bytes.len() as u64,
    };
    let layer = ArtifactLayer {
        media_type: cudastack::attest::STATEMENT_ARTIFACT_TYPE.to_string(),
        bytes: statement.to_bytes().into(),
        annotations: BTreeMap::new(),
    };
    let annotations = BTreeMap::from([(store::KIND_ANNOTATION.to_string(), "evil".to_string())]);
    runtime
        .block_on(push_referrer(
            &client,
            &reference,
            &target,
            cudastack::attest::STATEMENT_ARTIFACT_TYPE,
            vec![layer],
            annotations,
        ))
        .unwrap();
}

/// securesystemslib's DSSE verification of the bundle's envelope with the PEM `public`.
fn securesystemslib_verifies(bundle: &Bundle, public: &Path, scratch: &Path) -> bool {
    let envelope = scratch.join("envelope.json");
    std::fs::write(&envelope, bundle.envelope.to_json()).unwrap();
    let script = r#"
import json, sys
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey, Signature
from cryptography.hazmat.primitives import serialization
document = json.load(open(sys.argv[1]))
for signature in document["signatures"]:
    signature.setdefault("keyid", "")
envelope = Envelope.from_dict(document)
pem = open(sys.argv[2], "rb").read()
key = SSlibKey.from_crypto(serialization.load_pem_public_key(pem), keyid="k", scheme="ecdsa-sha2-nistp256")
# DSSE verifiers match signatures to keys by keyid; cosign writes none: name it the key's.
envelope.signatures = {"k": Signature("k", s.signature) for s in envelope.signatures.values()}
try:
    envelope.verify([key], 1)
except Exception as error:
    print(error, file=sys.stderr)
    sys.exit(1)
"#;
    let output = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&envelope)
        .arg(public)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("Traceback"),
        "the verifier script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.status.success()
}

/// `cudastack build --sign-key` of a real (stand-in CUDA) stack: the layout holds the SBOM,
/// which SPDX's own validator accepts and which lists the lock's CUDA wheels with their
/// sha256, and the signed provenance, whose inputs are the recipe's and the lock's digests
/// and every locked artifact; both verify with the key and are about the built image.
#[test]
fn a_signed_build_stores_a_valid_sbom_and_provenance_of_its_lock() {
    if let Some(reason) = skip_reason().or_else(|| e2e_support::skip_reason(&[])) {
        reason.report();
        return;
    }
    if let Some(reason) = pyspdxtools_missing() {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (key, public) = cosign_key_pair(&work.path().join("ours"));
    let recipe = build_publish::locked_stand_in(work.path(), "attest-build", "");
    // The recipe's directory is a git checkout: the provenance names its commit.
    let git = |args: &[&str]| {
        let output = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(["-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(work.path())
            .output()
            .unwrap();
        assert!(output.status.success(), "git {args:?}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    git(&["init", "-q"]);
    git(&[
        "remote",
        "add",
        "origin",
        "https://ci:token@example.com/team/train.git",
    ]);
    git(&["add", recipe.file_name().unwrap().to_str().unwrap()]);
    git(&["commit", "-q", "-m", "recipe"]);
    let commit = git(&["rev-parse", "HEAD"]);
    let layout_dir = work.path().join("layout");
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--no-verify", "--json", "--mirror"])
        .arg(work.path().join("mirror"))
        .arg("--layout")
        .arg(&layout_dir)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg("--sign-key")
        .arg(&key)
        .arg(&recipe)
        .env("COSIGN_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    let built = build_publish::report(&output);
    let digest: cudastack::digest::Digest =
        built["manifest_digest"].as_str().unwrap().parse().unwrap();
    let lock = Lockfile::read(&recipe.with_extension("lock")).unwrap();
    let referrers = store::referrers_of(&layout_dir, &digest).unwrap();
    let kinds: Vec<&str> = referrers.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["provenance", "sbom", "sbom.att", "sbom.cdx", "sbom.cdx.att"],
        "{referrers:#?}"
    );
    let kind = |kind: &str| referrers.iter().find(|r| r.kind == kind).unwrap();

    let sbom = kind("sbom");
    assert_eq!(sbom.artifact_type, cudastack::sbom::SPDX_MEDIA_TYPE);
    // `cudastack sbom` writes the stored document as it is: the file the validator reads.
    let file = work.path().join("sbom.spdx.json");
    let layout_arg = layout_dir.to_str().unwrap();
    let exported = cudastack(&["sbom", layout_arg, "-o", file.to_str().unwrap()]);
    assert!(exported.status.success(), "{}", text(&exported));
    assert_eq!(std::fs::read(&file).unwrap(), sbom.blob);
    let validated = Command::new("pyspdxtools")
        .arg("-i")
        .arg(&file)
        .output()
        .unwrap();
    assert!(validated.status.success(), "{}", text(&validated));
    let document = assert_sbom_lists_cuda_wheels(&sbom.blob, &lock);

    let key = cudastack::sign::key::PublicKey::read(&public).unwrap();
    let provenance = cudastack::attest::open(
        &Bundle::from_json(&kind("provenance").blob, "test").unwrap(),
        &key,
    )
    .unwrap();
    assert!(provenance.is_about(&digest));
    assert_eq!(provenance.predicate_type, provenance::PREDICATE_TYPE);
    let definition = &provenance.predicate["buildDefinition"];
    assert_eq!(
        definition["externalParameters"]["recipe"]["digest"]["sha256"],
        lock.recipe_digest.hex()
    );
    assert_eq!(
        definition["externalParameters"]["lock"]["digest"]["sha256"],
        provenance::lock_digest(&lock).hex()
    );
    let resolved = definition["resolvedDependencies"].as_array().unwrap();
    assert_eq!(resolved.len(), lock.artifacts.len() + 1);
    assert_eq!(resolved[0]["digest"]["gitCommit"], commit.as_str());
    assert_eq!(
        resolved[0]["uri"], "git+https://example.com/team/train.git@refs/heads/main",
        "the remote's token must not be published"
    );
    let sbom_statement = cudastack::attest::open(
        &Bundle::from_json(&kind("sbom.att").blob, "test").unwrap(),
        &key,
    )
    .unwrap();
    assert_eq!(sbom_statement.predicate, document);
    assert!(sbom_statement.is_about(&digest));
    let cyclonedx = kind("sbom.cdx");
    assert_eq!(
        cyclonedx.artifact_type,
        cudastack::sbom::CYCLONEDX_MEDIA_TYPE
    );
    let on_stdout = cudastack(&["sbom", layout_arg, "--format", "cyclonedx"]);
    assert!(on_stdout.status.success(), "{}", text(&on_stdout));
    assert_eq!(on_stdout.stdout, cyclonedx.blob);
    let cyclonedx_statement = cudastack::attest::open(
        &Bundle::from_json(&kind("sbom.cdx.att").blob, "test").unwrap(),
        &key,
    )
    .unwrap();
    assert_eq!(
        cyclonedx_statement.predicate_type,
        cudastack::attest::CYCLONEDX_PREDICATE_TYPE
    );
    assert_eq!(
        cyclonedx_statement.predicate,
        serde_json::from_slice::<serde_json::Value>(&cyclonedx.blob).unwrap()
    );
}

fn pyspdxtools_missing() -> Option<gate::Skip> {
    (!registry_support::have("pyspdxtools")).then(|| {
        gate::Skip::missing(
            "pyspdxtools",
            "pyspdxtools is not installed (`pip install spdx-tools`; scripts/setup.sh does)"
                .to_string(),
        )
    })
}

/// The SBOM `blob` (SPDX JSON) lists every nvidia-* wheel of `lock` with its version and
/// sha256, and its summary names a CUDA component made from each one; returns the document.
pub(crate) fn assert_sbom_lists_cuda_wheels(blob: &[u8], lock: &Lockfile) -> serde_json::Value {
    let document: serde_json::Value = serde_json::from_slice(blob).unwrap();
    let summary = cudastack::sbom::Summary::of_spdx(blob).unwrap();
    let wheels: Vec<_> = lock
        .artifacts
        .iter()
        .filter(|a| a.name.starts_with("nvidia-"))
        .collect();
    assert!(!wheels.is_empty(), "the lock has no nvidia-* wheels");
    for wheel in wheels {
        let listed = document["packages"].as_array().unwrap().iter().any(|p| {
            p["name"] == wheel.name
                && p["versionInfo"] == wheel.version
                && p["checksums"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["checksumValue"] == wheel.sha256.hex()))
        });
        assert!(
            listed,
            "{} {} is not in the SBOM",
            wheel.name, wheel.version
        );
        let from = format!("{} {}", wheel.name, wheel.version);
        assert!(
            summary.cuda.iter().any(|c| c.from == from),
            "no CUDA component from {from}: {:#?}",
            summary.cuda
        );
    }
    document
}

/// An image with no SBOM beside it (made by another tool, or pulled without its referrers):
/// `cudastack sbom` says so and how to get one, and writes no file.
#[test]
fn an_image_without_an_sbom_is_answered_with_how_to_get_one() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("layout");
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    write_image(&dir, &store);
    let file = work.path().join("sbom.json");
    let output = cudastack(&["sbom", dir.to_str().unwrap(), "-o", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    let said = text(&output);
    assert!(
        said.contains("has no SPDX 2.3 SBOM stored beside it"),
        "{said}"
    );
    assert!(
        said.contains("cudastack stores one when it builds an image"),
        "{said}"
    );
    assert!(!file.exists());
}
