//! Issue 32: a registry serving 256 referrers of an image, each a large manifest pointing
//! to a 4 MiB blob, took `inspect`, `check` and `pull` to 2.1 GB of memory and wrote
//! 1.1 GB into a pulled layout. Now one budget per operation (64 referrers, 64 MiB of
//! listing, manifests and blobs), the types each command uses fetched first, blobs read
//! up to their declared size and pulled ones streamed into the layout.
//!
//! A real registry (Debian's docker-registry) holds the image and one real signed
//! verification bundle; a proxy in front answers the referrers API with a hostile listing
//! (the real bundle, first or last, and 256 fabricated referrers whose manifests and blobs
//! it serves itself, counting every byte). The real `cudastack` binary runs each command
//! under `/usr/bin/time -v` for its peak memory. No GPU: the verification report is the
//! GPU report's format, written by hand.

use crate::cli_verify_registry::{cudastack, gpu_report, text};
use crate::registry_support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::registry::referrers::{push_referrer, ArtifactLayer, Subject};
use cudastack::registry::{push_image, ClientOptions, PushOptions, Reference, RegistryClient};
use cudastack::sign::bundle;
use registry_support::{random_layer, Action, Proxy, Registry};
use serde_json::json;

const HOSTILE: usize = 256;
const HOSTILE_BLOB: usize = 4 << 20;
/// Each fabricated manifest is padded to this size (an annotation), so manifests alone
/// are 64 MiB: they must count in the budget, not only the blobs.
const HOSTILE_MANIFEST: usize = 256 << 10;
/// A type cudastack does not read: the listing says so, so no command fetches these.
const UNREAD_TYPE: &str = "application/vnd.example.unread+json";
/// The budget (64 MiB) with room for the real referrer and the listing.
const BYTES_BOUND: u64 = (64 << 20) + (1 << 20);

struct Hostile {
    /// Request path -> body, for each fabricated manifest and blob.
    bodies: HashMap<String, Vec<u8>>,
    /// Index entries, in the listing's order.
    entries: Vec<serde_json::Value>,
    /// The paths of the manifests of `UNREAD_TYPE`.
    unread: Vec<String>,
}

/// 256 referrers of `subject`: the first half of a type nobody reads, the second half
/// claiming to be sigstore bundles; all point to one 4 MiB blob of junk.
fn hostile(repo: &str, subject: &Digest, subject_size: u64) -> Hostile {
    let blob = vec![b'x'; HOSTILE_BLOB];
    let blob_digest = Digest::of_bytes(&blob);
    let mut bodies = HashMap::new();
    bodies.insert(format!("/v2/{repo}/blobs/{blob_digest}"), blob);
    let (mut entries, mut unread) = (Vec::new(), Vec::new());
    for i in 0..HOSTILE {
        let artifact_type = if i < HOSTILE / 2 {
            UNREAD_TYPE
        } else {
            bundle::MEDIA_TYPE
        };
        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": artifact_type,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": Digest::of_bytes(b"{}").to_string(), "size": 2},
            "layers": [{"mediaType": artifact_type, "digest": blob_digest.to_string(),
                        "size": HOSTILE_BLOB}],
            "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": subject.to_string(), "size": subject_size},
            "annotations": {"padding": ""},
        });
        let bare = serde_json::to_vec(&manifest).unwrap().len();
        manifest["annotations"]["padding"] =
            json!(format!("{i:08}").repeat((HOSTILE_MANIFEST - bare) / 8));
        let bytes = serde_json::to_vec(&manifest).unwrap();
        let digest = Digest::of_bytes(&bytes);
        entries.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest.to_string(), "size": bytes.len(), "artifactType": artifact_type,
        }));
        let path = format!("/v2/{repo}/manifests/{digest}");
        if artifact_type == UNREAD_TYPE {
            unread.push(path.clone());
        }
        bodies.insert(path, bytes);
    }
    Hostile {
        bodies,
        entries,
        unread,
    }
}

struct Fixture {
    _registry: Arc<Registry>,
    proxy: Proxy,
    reference: Reference,
    /// Bytes of fabricated manifests and blobs the proxy served.
    served: Arc<AtomicU64>,
    /// Put the real bundle last in the listing (past the budget) instead of first.
    real_last: Arc<AtomicBool>,
    unread: Vec<String>,
    work: tempfile::TempDir,
    public_key: std::path::PathBuf,
}

impl Fixture {
    async fn start() -> Option<Fixture> {
        if let Some(reason) = registry_support::skip_reason() {
            reason.report();
            return None;
        }
        let registry = Registry::start(None);
        let work = tempfile::tempdir().unwrap();
        let store = BlobStore::open(work.path().join("cache")).unwrap();
        let image = cudastack::oci::Image::new(1_700_000_000)
            .with_layer(random_layer(&store, "payload", 7, 64 << 10), "payload")
            .with_env("NVIDIA_REQUIRE_CUDA", "cuda>=12.1");
        let direct: Reference = format!("{}/team/torch:2.4.1", registry.host())
            .parse()
            .unwrap();
        let client = RegistryClient::new(&direct, ClientOptions::default()).unwrap();
        let pushed = push_image(&client, &image, &direct, &PushOptions::default())
            .await
            .unwrap();
        let manifest = client.get_manifest(&direct).await.unwrap();
        let subject = Subject {
            media_type: manifest.media_type.clone(),
            digest: pushed.manifest_digest,
            size: manifest.bytes.len() as u64,
        };
        let (real_entry, public_key) =
            push_signed_verification(&client, &direct, &subject, &work).await;
        let hostile = hostile(
            direct.repository(),
            &subject.digest,
            manifest.bytes.len() as u64,
        );
        let served = Arc::new(AtomicU64::new(0));
        let real_last = Arc::new(AtomicBool::new(false));
        let bodies = Arc::new(hostile.bodies);
        let entries = Arc::new(Mutex::new(hostile.entries));
        let referrers_path = format!("/v2/{}/referrers/{}", direct.repository(), subject.digest);
        let (counter, last) = (served.clone(), real_last.clone());
        let proxy = Proxy::start(
            registry.port,
            Arc::new(move |head| {
                let path = head.target.split('?').next().unwrap_or_default();
                if head.method != "GET" {
                    return Action::Forward;
                }
                if path == referrers_path {
                    let mut manifests = entries.lock().unwrap().clone();
                    if last.load(Ordering::SeqCst) {
                        manifests.push(real_entry.clone());
                    } else {
                        manifests.insert(0, real_entry.clone());
                    }
                    let index = json!({"schemaVersion": 2,
                        "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": manifests});
                    return Action::Respond {
                        status: 200,
                        headers: vec![(
                            "Content-Type".into(),
                            "application/vnd.oci.image.index.v1+json".into(),
                        )],
                        body: serde_json::to_vec(&index).unwrap(),
                    };
                }
                match bodies.get(path) {
                    Some(body) => {
                        counter.fetch_add(body.len() as u64, Ordering::SeqCst);
                        let content_type = if path.contains("/manifests/") {
                            "application/vnd.oci.image.manifest.v1+json"
                        } else {
                            "application/octet-stream"
                        };
                        Action::Respond {
                            status: 200,
                            headers: vec![("Content-Type".into(), content_type.into())],
                            body: body.clone(),
                        }
                    }
                    None => Action::Forward,
                }
            }),
        );
        let reference = format!("{}/team/torch:2.4.1", proxy.host())
            .parse()
            .unwrap();
        Some(Fixture {
            _registry: registry,
            proxy,
            reference,
            served,
            real_last,
            unread: hostile.unread,
            work,
            public_key,
        })
    }

    /// Run cudastack with `args` under `/usr/bin/time -v`: its output, the fabricated
    /// bytes it was served, and its peak resident memory in bytes (None without GNU time).
    fn run(&self, args: &[&str]) -> (Output, u64, Option<u64>) {
        self.served.store(0, Ordering::SeqCst);
        let timed = Path::new("/usr/bin/time").is_file();
        let mut command = if timed {
            let mut command = std::process::Command::new("/usr/bin/time");
            command
                .arg("-v")
                .arg(env!("CARGO_BIN_EXE_cudastack"))
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("NO_COLOR", "1")
                .env("DOCKER_CONFIG", "/nonexistent-cudastack-test");
            command
        } else {
            cudastack()
        };
        let output = command
            .args(args)
            .env("CUDASTACK_CACHE_DIR", self.work.path().join("cli-cache"))
            .output()
            .unwrap();
        let peak = timed.then(|| peak_rss(&String::from_utf8_lossy(&output.stderr)));
        (output, self.served.load(Ordering::SeqCst), peak)
    }

    /// Whether any manifest of a type cudastack does not read was requested.
    fn fetched_unread_types(&self) -> bool {
        let requests = self.proxy.requests();
        self.unread
            .iter()
            .any(|path| requests.iter().any(|line| line.ends_with(path.as_str())))
    }
}

/// `Maximum resident set size (kbytes)` of GNU time's `-v` report, in bytes.
fn peak_rss(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
        .unwrap_or_else(|| panic!("no peak memory in:\n{stderr}"));
    line.trim().parse::<u64>().unwrap() * 1024
}

/// Push a verification of `subject` on an H200 (compute capability 9.0), signed by a new
/// key, as a referrer; returns its index entry and the public key's file.
async fn push_signed_verification(
    client: &RegistryClient,
    reference: &Reference,
    subject: &Subject,
    work: &tempfile::TempDir,
) -> (serde_json::Value, std::path::PathBuf) {
    let key = cudastack::sign::key::SigningKey::generate().unwrap();
    let public_key = work.path().join("signer.pub");
    std::fs::write(&public_key, key.public_key().to_pem()).unwrap();
    let report_json = gpu_report("NVIDIA H200", "9.0", None);
    let report =
        cudastack::verify::report::Report::from_json(&serde_json::to_vec(&report_json).unwrap())
            .unwrap();
    let statement =
        cudastack::attest::verification::statement("team/torch", &report, &subject.digest, None);
    let signed = cudastack::attest::sign(&statement, &key);
    let pushed = push_referrer(
        client,
        reference,
        subject,
        bundle::MEDIA_TYPE,
        vec![ArtifactLayer {
            media_type: bundle::MEDIA_TYPE.to_string(),
            bytes: signed.to_json().into(),
            annotations: BTreeMap::new(),
        }],
        BTreeMap::from([(
            bundle::CONTENT_ANNOTATION.to_string(),
            bundle::CONTENT_DSSE.to_string(),
        )]),
    )
    .await
    .unwrap();
    let manifest = client
        .get_manifest(&reference.with_digest(pushed.digest))
        .await
        .unwrap();
    let entry = json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": pushed.digest.to_string(), "size": manifest.bytes.len(),
        "artifactType": bundle::MEDIA_TYPE,
    });
    (entry, public_key)
}

fn assert_bounded(what: &str, served: u64, peak: Option<u64>, output: &Output) {
    eprintln!("{what}: {served} bytes of fabricated referrers read, peak memory {peak:?}");
    assert!(
        served <= BYTES_BOUND,
        "{what}: {served} bytes of referrers read, over the {BYTES_BOUND} budget\n{}",
        text(output)
    );
    // The binary alone is some tens of MB; the budget is 64 MiB; before the fix it held
    // hundreds (all 256 manifests and 64 blobs of 4 MiB).
    if let Some(peak) = peak {
        assert!(
            peak < 128 << 20,
            "{what}: peak memory {} MiB\n{}",
            peak >> 20,
            text(output)
        );
    }
}

fn check_signed(fixture: &Fixture) -> (Output, u64, Option<u64>) {
    fixture.run(&[
        "check",
        &fixture.reference.to_string(),
        "--driver",
        "550.54.15",
        "--cc",
        "9.0",
        "--require-signed-by",
        fixture.public_key.to_str().unwrap(),
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_referrers_stay_within_one_budget_per_command() {
    let Some(fixture) = Fixture::start().await else {
        return;
    };
    let image = fixture.reference.to_string();

    // check: only bundles fetched, within the budget; the real signature, listed first,
    // is found, and the rest are said to be skipped.
    let (output, served, peak) = check_signed(&fixture);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert_bounded("check", served, peak, &output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("referrer(s) of")
            && stderr.contains("were not read")
            && stderr.contains("at most 64 referrers and 64 MiB")
            && stderr.contains(&fixture.proxy.host()),
        "{}",
        text(&output)
    );
    assert!(!fixture.fetched_unread_types(), "check fetched other types");

    // The same signature listed past the budget: never a yes (a skipped bundle can only
    // remove evidence), but unknown, saying why.
    fixture.real_last.store(true, Ordering::SeqCst);
    let (output, served, peak) = check_signed(&fixture);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    assert_bounded("check (signature past the budget)", served, peak, &output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("the signature cannot be confirmed"),
        "{}",
        text(&output)
    );
    fixture.real_last.store(false, Ordering::SeqCst);

    // inspect: lists what it read, says how many it skipped and how many are of types it
    // does not read (never fetched).
    let (output, served, peak) = fixture.run(&["inspect", &image]);
    assert!(output.status.success(), "{}", text(&output));
    assert_bounded("inspect", served, peak, &output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("not read ")
            && stdout.contains("128 referrer(s) of types cudastack does not read"),
        "{}",
        text(&output)
    );
    assert!(
        !fixture.fetched_unread_types(),
        "inspect fetched other types"
    );

    // pull: copies only what fits the budget; the layout holds at most that much.
    let layout = fixture.work.path().join("pulled");
    let (output, served, peak) =
        fixture.run(&["pull", &image, "--layout", layout.to_str().unwrap()]);
    assert!(output.status.success(), "{}", text(&output));
    assert_bounded("pull", served, peak, &output);
    assert!(!fixture.fetched_unread_types(), "pull fetched other types");
    let written: u64 = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        written <= BYTES_BOUND + (1 << 20),
        "the pulled layout holds {written} bytes\n{}",
        text(&output)
    );
    // The real signature came along and still verifies from the layout.
    let pulled = format!("oci:{}:2.4.1", layout.display());
    let again = fixture.run(&[
        "check",
        &pulled,
        "--driver",
        "550.54.15",
        "--cc",
        "9.0",
        "--require-signed-by",
        fixture.public_key.to_str().unwrap(),
    ]);
    assert_eq!(again.0.status.code(), Some(0), "{}", text(&again.0));
}
