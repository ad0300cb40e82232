//! `build --wheel-cache` (src/pipeline/shared_wheels.rs): the wheels of source builds
//! shared through a real registry (Debian's docker-registry). A cache entry made on one
//! host is pushed, fetched on another into the same entry a local build makes, and an entry
//! that is not exactly of the build asking is refused with nothing cached. The compile
//! itself, and a whole second build that fetches instead of compiling, are in
//! source_build::extensions_build_for_the_recipe_gpus_and_are_reused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::fetch::http::RetryPolicy;
use cudastack::pipeline::shared_wheels::SharedWheels;
use cudastack::registry::{ClientOptions, Reference, RegistryClient, OCI_MANIFEST};
use cudastack::sign::key::SigningKey;
use cudastack::source_build::{cached_wheel, entry_dir, store_fetched_wheel, BuildKey};

use crate::e2e_support::stand_in::{write_wheel, Target};
use crate::registry_support::{self, Registry};

/// The key of a build of cuda-ext 0.1.0 for `arch_list`.
fn key(arch_list: &str) -> BuildKey {
    BuildKey {
        builder: "source-build-test",
        package: "cuda-ext".into(),
        version: "0.1.0".into(),
        sdist_sha256: Digest::of_bytes(b"the sdist"),
        builder_digest: Digest::of_bytes(b"the builder's artifacts"),
        arch_list: arch_list.into(),
        env: Default::default(),
        source_date_epoch: 1_700_000_000,
    }
}

fn options() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(50),
        },
        ..ClientOptions::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A real wheel of cuda-ext 0.1.0 in `dir`: its path and file name.
fn wheel(dir: &Path) -> (PathBuf, String) {
    std::fs::create_dir_all(dir).unwrap();
    let files = [("cuda_ext/__init__.py", b"ARCH = 'sm_89'\n".to_vec())];
    let path = write_wheel(dir, Target::X86_64, "cuda-ext", "0.1.0", &files);
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    (path, name)
}

/// A registry, the wheel cache in it, and a host's cache holding the entry of `built` as
/// a build leaves it.
struct Fixture {
    registry: std::sync::Arc<Registry>,
    shared: SharedWheels,
    repository: Reference,
    work: tempfile::TempDir,
}

impl Fixture {
    fn start() -> Option<Self> {
        if let Some(reason) = registry_support::skip_reason() {
            reason.report();
            return None;
        }
        let registry = Registry::start(None);
        let repository: Reference = format!("{}/team/wheels", registry.host()).parse().unwrap();
        let shared = SharedWheels::new(&repository, options()).unwrap();
        let work = tempfile::tempdir().unwrap();
        Some(Self {
            registry,
            shared,
            repository,
            work,
        })
    }

    /// A host cache `name` with the entry of `key`, as a compile there leaves it.
    fn host_with_entry(&self, name: &str, key: &BuildKey) -> PathBuf {
        let cache = self.work.path().join(name);
        let (path, file) = wheel(&self.work.path().join("dist"));
        store_fetched_wheel(
            &cache,
            key,
            &file,
            &path,
            b"compiled in 61 s\n",
            "built in 61.0 s",
        )
        .unwrap();
        cache
    }
}

#[test]
fn a_wheel_compiled_on_one_host_is_fetched_on_another_as_its_own_entry() {
    let Some(fixture) = Fixture::start() else {
        return;
    };
    let rt = runtime();
    let built_for = key("8.9+PTX");
    let host_a = fixture.host_with_entry("a", &built_for);
    let pushed = rt
        .block_on(fixture.shared.push(&host_a, &built_for))
        .unwrap()
        .expect("the registry had no entry");
    assert_eq!(
        rt.block_on(fixture.shared.push(&host_a, &built_for))
            .unwrap(),
        None,
        "an entry the registry has is not pushed again"
    );

    let host_b = fixture.work.path().join("b");
    let store = BlobStore::open(&host_b).unwrap();
    let fetched = rt
        .block_on(fixture.shared.fetch(&host_b, &built_for, &store))
        .unwrap();
    assert_eq!(fetched, Some(pushed));
    let there = cached_wheel(&host_a, &built_for).unwrap().unwrap();
    let here = cached_wheel(&host_b, &built_for)
        .unwrap()
        .expect("an entry");
    assert_eq!(here.sha256(), there.sha256());
    assert_eq!(here.path().file_name(), there.path().file_name());
    assert_eq!(std::fs::read(&here.log).unwrap(), b"compiled in 61 s\n");
    let complete =
        std::fs::read_to_string(entry_dir(&host_b, &built_for).join("complete")).unwrap();
    assert!(
        complete.starts_with(&format!(
            "fetched from {}@{pushed}\n",
            fixture.shared.entry(&built_for)
        )),
        "{complete}"
    );

    // A build of other inputs (another arch list) finds nothing.
    let other = key("9.0+PTX");
    assert_eq!(
        rt.block_on(fixture.shared.fetch(&host_b, &other, &store))
            .unwrap(),
        None
    );
    assert!(cached_wheel(&host_b, &other).unwrap().is_none());
}

#[test]
fn an_entry_that_is_not_exactly_of_the_build_is_refused_and_nothing_is_cached() {
    let Some(fixture) = Fixture::start() else {
        return;
    };
    let rt = runtime();
    let genuine = key("8.9+PTX");
    let host_a = fixture.host_with_entry("a", &genuine);
    rt.block_on(fixture.shared.push(&host_a, &genuine)).unwrap();
    let client = RegistryClient::new(&fixture.repository, options()).unwrap();
    let manifest = rt
        .block_on(client.get_manifest(&fixture.shared.entry(&genuine)))
        .unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    // Put an edited copy of the genuine entry under `key`'s tag, with `key`'s own config
    // blob in the registry when `own_config`.
    let plant = |key: &BuildKey, own_config: bool, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut planted = manifest.clone();
        if own_config {
            let json = serde_json::to_string(&serde_json::to_value(key).unwrap()).unwrap();
            let digest = rt
                .block_on(
                    client
                        .put_blob_bytes(fixture.repository.repository(), Bytes::from(json.clone())),
                )
                .unwrap();
            assert_eq!(digest, key.digest());
            planted["config"]["digest"] = digest.to_string().into();
            planted["config"]["size"] = json.len().into();
        }
        edit(&mut planted);
        let bytes = Bytes::from(serde_json::to_vec(&planted).unwrap());
        rt.block_on(client.put_manifest(&fixture.shared.entry(key), OCI_MANIFEST, bytes))
            .unwrap();
    };
    let host_c = fixture.work.path().join("c");
    let store = BlobStore::open(&host_c).unwrap();
    let refused = |key: &BuildKey| -> String {
        let error = rt
            .block_on(fixture.shared.fetch(&host_c, key, &store))
            .unwrap_err()
            .to_string();
        assert!(cached_wheel(&host_c, key).unwrap().is_none(), "{error}");
        assert!(!entry_dir(&host_c, key).exists(), "{error}");
        error
    };
    let title = "org.opencontainers.image.title";

    // The genuine entry under the tag of a build with other inputs.
    let other_inputs = key("9.0+PTX");
    plant(&other_inputs, false, &|_| {});
    let error = refused(&other_inputs);
    assert!(
        error.contains("is not this build's key (")
            && error.ends_with("it was built from other inputs"),
        "{error}"
    );

    // The right key, but the wheel says it is another distribution.
    let renamed = key("8.0;9.0+PTX");
    plant(&renamed, true, &|m| {
        m["layers"][0]["annotations"][title] = "torch-2.4.1-cp311-cp311-linux_x86_64.whl".into();
    });
    let error = refused(&renamed);
    assert!(
        error.ends_with(
            "which cudastack does not install: it is torch 2.4.1, not the sdist's cuda-ext 0.1.0"
        ),
        "{error}"
    );

    // A file name that is a path.
    let path_name = key("8.6+PTX");
    plant(&path_name, true, &|m| {
        m["layers"][0]["annotations"][title] =
            "../../../../tmp/cuda_ext-0.1.0-py3-none-any.whl".into();
    });
    let error = refused(&path_name);
    assert!(
        error.ends_with("a wheel of cuda-ext 0.1.0 built elsewhere is named `../../../../tmp/cuda_ext-0.1.0-py3-none-any.whl`, which cudastack does not install: `../../../../tmp/cuda_ext-0.1.0-py3-none-any.whl` is not a plain file name: it contains `/`"),
        "{error}"
    );

    // A wheel larger than cudastack fetches: refused before a byte is downloaded.
    let huge = key("7.5+PTX");
    plant(&huge, true, &|m| {
        m["layers"][0]["size"] = (5u64 << 30).into();
    });
    let error = refused(&huge);
    assert!(
        error.contains("more than the 4294967296 cudastack fetches"),
        "{error}"
    );

    // Two wheels in one entry.
    let two = key("8.7+PTX");
    plant(&two, true, &|m| {
        let wheel = m["layers"][0].clone();
        m["layers"].as_array_mut().unwrap().push(wheel);
    });
    let error = refused(&two);
    assert!(error.contains("it has 2 wheels, not one"), "{error}");

    // Nothing of these was fetched: the store holds no wheel.
    let wheels = store.blobs().unwrap();
    assert!(wheels.is_empty(), "{wheels:?}");
}

#[test]
fn a_registry_that_does_not_answer_is_an_error_of_the_cache_not_a_panic() {
    let Some(fixture) = Fixture::start() else {
        return;
    };
    let rt = runtime();
    let port = registry_support::free_port();
    let gone: Reference = format!("127.0.0.1:{port}/team/wheels").parse().unwrap();
    let shared = SharedWheels::new(&gone, options()).unwrap();
    let cache = fixture.work.path().join("d");
    let store = BlobStore::open(&cache).unwrap();
    let built_for = key("8.9+PTX");
    let error = rt
        .block_on(shared.fetch(&cache, &built_for, &store))
        .unwrap_err()
        .to_string();
    assert!(error.contains(&port.to_string()), "{error}");
    assert!(cached_wheel(&cache, &built_for).unwrap().is_none());
    drop(fixture.registry);
}

#[test]
fn with_a_key_only_an_entry_it_signed_for_exactly_this_wheel_is_taken() {
    let Some(fixture) = Fixture::start() else {
        return;
    };
    let rt = runtime();
    let built_for = key("8.9+PTX");
    let host_a = fixture.host_with_entry("a", &built_for);
    let platform = SigningKey::generate().unwrap();
    let stranger = SigningKey::generate().unwrap();
    let wheel_cache = || SharedWheels::new(&fixture.repository, options()).unwrap();
    let strict = wheel_cache().trusting(vec![platform.public_key()]);
    let host_b = fixture.work.path().join("b");
    let store = BlobStore::open(&host_b).unwrap();
    let refused = |key: &BuildKey| -> String {
        let error = rt
            .block_on(strict.fetch(&host_b, key, &store))
            .unwrap_err()
            .to_string();
        assert!(cached_wheel(&host_b, key).unwrap().is_none(), "{error}");
        error
    };

    // Unsigned.
    rt.block_on(wheel_cache().push(&host_a, &built_for))
        .unwrap();
    let error = refused(&built_for);
    assert!(
        error.contains("it is not signed, and --wheel-cache-key asks for a signature"),
        "{error}"
    );

    // Signed by another key: a signing push replaces an entry its key did not sign.
    let by_stranger = wheel_cache().signed_with(stranger);
    assert!(rt
        .block_on(by_stranger.push(&host_a, &built_for))
        .unwrap()
        .is_some());
    let error = refused(&built_for);
    assert!(error.contains("no trusted key signed it"), "{error}");

    // Signed by the trusted key: taken.
    let by_platform = wheel_cache().signed_with(platform.clone());
    let pushed = rt
        .block_on(by_platform.push(&host_a, &built_for))
        .unwrap()
        .expect("the stranger's entry is replaced");
    assert_eq!(
        rt.block_on(by_platform.push(&host_a, &built_for)).unwrap(),
        None
    );
    assert_eq!(
        rt.block_on(strict.fetch(&host_b, &built_for, &store))
            .unwrap(),
        Some(pushed)
    );
    assert!(cached_wheel(&host_b, &built_for).unwrap().is_some());

    // The platform's signed entry under the tag of another build (its config replaced by
    // that build's key): the signature claims the other key, so it does not vouch for it.
    let client = RegistryClient::new(&fixture.repository, options()).unwrap();
    let manifest = rt
        .block_on(client.get_manifest(&fixture.shared.entry(&built_for)))
        .unwrap();
    let mut planted: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    let other = key("9.0+PTX");
    let json = serde_json::to_string(&serde_json::to_value(&other).unwrap()).unwrap();
    let config = rt
        .block_on(client.put_blob_bytes(fixture.repository.repository(), Bytes::from(json.clone())))
        .unwrap();
    planted["config"]["digest"] = config.to_string().into();
    planted["config"]["size"] = json.len().into();
    let bytes = Bytes::from(serde_json::to_vec(&planted).unwrap());
    rt.block_on(client.put_manifest(&fixture.shared.entry(&other), OCI_MANIFEST, bytes))
        .unwrap();
    let error = refused(&other);
    assert!(error.contains("signed another wheel or key"), "{error}");
}

/// A build log past what a fetch takes (16 MiB) is shared by its end, where a compiler's
/// last words are, so the entry stays fetchable.
#[test]
fn a_long_build_log_is_shared_by_its_end() {
    let Some(fixture) = Fixture::start() else {
        return;
    };
    let rt = runtime();
    let built_for = key("8.6+PTX");
    let host_a = fixture.work.path().join("a");
    let (path, file) = wheel(&fixture.work.path().join("dist"));
    let mut log = vec![b'.'; 17 << 20];
    log.extend_from_slice(b"\nerror: none, the wheel was written\n");
    store_fetched_wheel(&host_a, &built_for, &file, &path, &log, "built in 3600.0 s").unwrap();
    rt.block_on(fixture.shared.push(&host_a, &built_for))
        .unwrap()
        .expect("pushed");
    let host_b = fixture.work.path().join("b");
    let store = BlobStore::open(&host_b).unwrap();
    rt.block_on(fixture.shared.fetch(&host_b, &built_for, &store))
        .unwrap()
        .expect("fetched");
    let fetched = cached_wheel(&host_b, &built_for).unwrap().unwrap();
    let fetched = std::fs::read(&fetched.log).unwrap();
    assert_eq!(fetched.len(), 16 << 20);
    assert!(fetched.ends_with(b"\nerror: none, the wheel was written\n"));
}
