//! Private package indexes with credentials (issue 19): a recipe's `indexes:` locked
//! against a real index on 127.0.0.1 that requires basic auth (PEP 503 HTML and PEP 691
//! JSON pages, files under another path of the same host), with credentials from the
//! environment and from a netrc file; a package pinned to the index never asked of PyPI (a
//! fixture PyPI records every request and offers a higher version of the same name);
//! credentials never sent to another host, also not after a redirect; the errors of a
//! missing or refused login; the locked wheel fetched as `build` fetches it; and the
//! password absent from the lock, `--json` output and the logs at the most verbose level.

#[path = "fetch_support/auth_index.rs"]
pub(crate) mod auth_index;

use crate::fetch_support::{sha256_hex, wheel_bytes};

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use auth_index::{AuthIndex, PageFormat};
use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::fetch::credentials::{IndexCredentials, IndexSpec, Lookup};
use cudastack::fetch::download::Downloader;
use cudastack::fetch::http::{error_chain, HttpClient, HttpConfig, RetryPolicy};
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::progress::NoReporter;
use cudastack::lock::inputs::package_sources;
use cudastack::lock::{resolve, LockRequest, Lockfile, Target};
use cudastack::platform::Platform;
use cudastack::recipe::Recipe;
use pep508_rs::Requirement;

const USER: &str = "ci-bot";
const PASSWORD: &str = "pw-7Kq2-never-shown";

fn client() -> HttpClient {
    HttpClient::new(HttpConfig {
        retry: RetryPolicy {
            max_attempts: 2,
            initial_backoff: std::time::Duration::from_millis(10),
            max_backoff: std::time::Duration::from_millis(20),
        },
        ..HttpConfig::default()
    })
    .unwrap()
}

/// A real wheel (zip with METADATA and WHEEL) published on `index`.
fn publish(index: &AuthIndex, name: &str, version: &str, requires: &[&str]) -> Vec<u8> {
    let (bytes, metadata) = wheel_bytes(name, version, requires);
    let filename = format!("{}-{version}-py3-none-any.whl", name.replace('-', "_"));
    index.publish(name, &filename, bytes.clone(), &metadata);
    bytes
}

fn recipe(indexes: &str, packages: &str) -> Recipe {
    Recipe::parse(
        &format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\npackages: {packages}\nindexes: {indexes}\n"),
        Path::new("t.yaml"),
    )
    .unwrap()
}

/// The credentials of `recipe`'s indexes from the variables in `env` only (the process's
/// own environment is shared by every test of the binary).
fn credentials(recipe: &Recipe, env: &[(&str, &str)], netrc: Option<&Path>) -> IndexCredentials {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = Lookup::new(
        move |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
        netrc.map(Path::to_path_buf),
        None,
    );
    let specs = recipe
        .indexes
        .iter()
        .map(|index| IndexSpec {
            name: index.name.to_string(),
            env_key: index.name.env_key(),
            base: index.url.as_url().clone(),
        })
        .collect();
    IndexCredentials::discover_with(specs, &lookup).unwrap()
}

fn request(recipe: &Recipe, client: &HttpClient, pypi: &AuthIndex, roots: &[&str]) -> LockRequest {
    let pypi = SimpleIndex::new(
        client.clone(),
        format!("{}/simple/", pypi.base).parse().unwrap(),
    );
    LockRequest {
        target: Target::new(
            "3.11".parse().unwrap(),
            Platform::LinuxAmd64,
            "2.36".parse().unwrap(),
        )
        .unwrap(),
        requirements: roots
            .iter()
            .map(|r| Requirement::from_str(r).unwrap())
            .collect(),
        sources: package_sources(recipe, client, None, pypi).unwrap(),
        constraints: Default::default(),
        redist: vec![],
        system: None,
        recipe_digest: recipe.lock_digest(),
        byte_digest: None,
        as_of: None,
    }
}

/// The pinned package comes from the private index (HTML and JSON pages) although an
/// index listed before it and PyPI both offer a higher version of its name; a package only
/// the private index has comes from it, the rest from PyPI. A pinned package the private
/// index lacks is an error, never looked up elsewhere. Neither PyPI nor the other index is
/// ever asked for a pinned name or sent the credentials.
#[tokio::test]
async fn a_pinned_package_comes_from_its_index_only() {
    for format in [PageFormat::Html, PageFormat::Json] {
        let extra = AuthIndex::start(PageFormat::Json, None);
        let internal = AuthIndex::start(format, Some((USER, PASSWORD)));
        let pypi = AuthIndex::start(PageFormat::Json, None);
        let tokenizer = publish(
            &internal,
            "acme-tokenizer",
            "1.0",
            &["Requires-Dist: acme-core", "Requires-Dist: shared-util"],
        );
        publish(&internal, "acme-core", "2.0", &[]);
        // The attack: the same names on public indexes, with higher versions.
        for public in [&extra, &pypi] {
            publish(public, "acme-tokenizer", "99.0", &[]);
            publish(public, "acme-secret", "99.0", &[]);
        }
        publish(&pypi, "shared-util", "1.5", &[]);
        let recipe = recipe(
            &format!(
                "[{{ name: extra, url: \"{}/simple\" }}, {{ name: internal, url: \"{}\", packages: [acme-tokenizer, acme-secret] }}]",
                extra.base,
                internal.simple_url()
            ),
            "[acme-tokenizer]",
        );
        let bound = internal.simple_url();
        let env = [
            ("CUDASTACK_INDEX_INTERNAL_USERNAME", USER),
            ("CUDASTACK_INDEX_INTERNAL_PASSWORD", PASSWORD),
            ("CUDASTACK_INDEX_INTERNAL_URL", &bound),
        ];
        let client = client().with_credentials(credentials(&recipe, &env, None));
        let lock = resolve(
            &client,
            &request(&recipe, &client, &pypi, &["acme-tokenizer"]),
        )
        .await
        .unwrap();

        let locked = lock.artifact("acme-tokenizer").unwrap();
        assert_eq!(locked.version, "1.0", "{format:?}");
        assert_eq!(locked.sha256.hex(), sha256_hex(&tokenizer));
        assert_eq!(locked.source, format!("{}/", internal.simple_url()));
        assert_eq!(
            locked.url.to_string(),
            format!(
                "{}/packages/acme_tokenizer-1.0-py3-none-any.whl",
                internal.base
            )
        );
        // Not pinned: the first index that has it, the private one before PyPI ...
        let internal_base = format!("{}/", internal.simple_url());
        assert_eq!(lock.artifact("acme-core").unwrap().source, internal_base);
        // ... and PyPI for what no named index has.
        let pypi_base = format!("{}/simple/", pypi.base);
        assert_eq!(lock.artifact("shared-util").unwrap().source, pypi_base);

        // A pinned package its index does not have: not found, not taken from elsewhere.
        let error = resolve(&client, &request(&recipe, &client, &pypi, &["acme-secret"]))
            .await
            .unwrap_err();
        let text = error_chain(&error);
        assert!(
            text.contains(&format!(
                "`acme-secret` was not found on any source: {internal_base}"
            )),
            "{text}"
        );
        assert!(
            !text.contains(&pypi_base) && !text.contains(&extra.base),
            "{text}"
        );

        for public in [&extra, &pypi] {
            let asked: Vec<String> = public.log().into_iter().map(|seen| seen.path).collect();
            assert!(
                !asked
                    .iter()
                    .any(|path| path.contains("acme-tokenizer") || path.contains("acme-secret")),
                "a public index was asked for a pinned package: {asked:?}"
            );
            assert!(public.log().iter().all(|seen| seen.authorization.is_none()));
        }
        // Every request to the private host carried the credentials: pages, metadata.
        let internal_log = internal.log();
        assert!(internal_log
            .iter()
            .any(|seen| seen.path.starts_with("/packages/")));
        assert!(internal_log
            .iter()
            .any(|seen| seen.path == "/simple/acme-secret/"));
        assert!(
            internal_log.iter().all(|seen| seen.authorization.is_some()),
            "{internal_log:?}"
        );
        let text = format!("{lock:?}");
        assert!(!text.contains(PASSWORD) && !text.contains(USER), "{text}");
    }
}

/// Without credentials: an error that names the index and the three ways to give them.
/// With wrong ones: an error that says they were refused and where they came from, and
/// never prints them.
#[tokio::test]
async fn a_missing_or_refused_login_says_what_to_do() {
    let internal = AuthIndex::start(PageFormat::Html, Some((USER, PASSWORD)));
    let pypi = AuthIndex::start(PageFormat::Json, None);
    publish(&internal, "acme-tokenizer", "1.0", &[]);
    let recipe = recipe(
        &format!(
            "[{{ name: acme-internal, url: \"{}\", packages: [acme-tokenizer] }}]",
            internal.simple_url()
        ),
        "[acme-tokenizer]",
    );
    let bare = client().with_credentials(credentials(&recipe, &[], None));
    let error = resolve(&bare, &request(&recipe, &bare, &pypi, &["acme-tokenizer"]))
        .await
        .unwrap_err();
    let text = error_chain(&error);
    for says in [
        "Index `acme-internal` answered HTTP 401",
        "found none for it",
        "CUDASTACK_INDEX_ACME_INTERNAL_USERNAME and CUDASTACK_INDEX_ACME_INTERNAL_PASSWORD",
        "machine 127.0.0.1 login USER password PASSWORD",
        "CUDASTACK_KEYRING_PROVIDER=subprocess",
    ] {
        assert!(text.contains(says), "missing `{says}` in: {text}");
    }

    let wrong_password = "wrong-9xZ";
    let bound = internal.simple_url();
    let env = [
        ("CUDASTACK_INDEX_ACME_INTERNAL_USERNAME", USER),
        ("CUDASTACK_INDEX_ACME_INTERNAL_PASSWORD", wrong_password),
        ("CUDASTACK_INDEX_ACME_INTERNAL_URL", &bound),
    ];
    let wrong = client().with_credentials(credentials(&recipe, &env, None));
    let error = resolve(
        &wrong,
        &request(&recipe, &wrong, &pypi, &["acme-tokenizer"]),
    )
    .await
    .unwrap_err();
    let text = error_chain(&error);
    assert!(
        text.contains("Index `acme-internal` refused the credentials from CUDASTACK_INDEX_ACME_INTERNAL_USERNAME and CUDASTACK_INDEX_ACME_INTERNAL_PASSWORD (HTTP 401"),
        "{text}"
    );
    assert!(
        !text.contains(wrong_password) && !format!("{error:?}").contains(wrong_password),
        "{text}"
    );
    // The pinned package was not looked for anywhere else after the refusal.
    assert!(pypi.log().is_empty(), "{:?}", pypi.log());
}

/// A file link that redirects to another host: the redirect is followed, the credentials
/// are not; a URL of another host is never sent them either.
#[tokio::test]
async fn credentials_never_go_to_another_host() {
    let internal = AuthIndex::start(PageFormat::Json, Some((USER, PASSWORD)));
    let cdn = AuthIndex::start(PageFormat::Json, None);
    let bytes = publish(&cdn, "acme-tokenizer", "1.0", &[]);
    let filename = "acme_tokenizer-1.0-py3-none-any.whl";
    internal.publish_redirect(
        "acme-tokenizer",
        filename,
        &sha256_hex(&bytes),
        &format!("{}/packages/{filename}", cdn.base),
    );
    let recipe = recipe(
        &format!("[{{ name: internal, url: \"{}\" }}]", internal.simple_url()),
        "[]",
    );
    let netrc_dir = tempfile::tempdir().unwrap();
    let netrc = netrc_dir.path().join("netrc");
    std::fs::write(
        &netrc,
        format!("machine 127.0.0.1 login {USER} password {PASSWORD}\n"),
    )
    .unwrap();
    let client = client().with_credentials(credentials(&recipe, &[], Some(&netrc)));
    let index = SimpleIndex::new(
        client.clone(),
        format!("{}/", internal.simple_url()).parse().unwrap(),
    );
    let page = index
        .project(&cudastack::names::PackageName::from_str("acme-tokenizer").unwrap())
        .await
        .unwrap();
    let body = client.get_bytes(&page.files[0].url, None).await.unwrap();
    assert_eq!(body.as_ref(), bytes.as_slice());
    assert!(internal
        .log()
        .iter()
        .all(|seen| seen.authorization.is_some()));
    let cdn_log = cdn.log();
    assert!(!cdn_log.is_empty());
    assert!(
        cdn_log.iter().all(|seen| seen.authorization.is_none()),
        "credentials followed the redirect: {cdn_log:?}"
    );
}

/// A torch wheel in a mirror directory (the stack without PyPI), and the recipe that adds a
/// package of the private index to it.
fn cli_project(work: &Path, internal: &AuthIndex) -> std::path::PathBuf {
    cli_project_at(work, &internal.simple_url())
}

/// [`cli_project`] with the recipe's index at `index_url`.
fn cli_project_at(work: &Path, index_url: &str) -> std::path::PathBuf {
    let mirror = work.join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    let (torch, _) = wheel_bytes("torch", "2.4.1", &[]);
    std::fs::write(
        mirror.join("torch-2.4.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
        torch,
    )
    .unwrap();
    let recipe = work.join("train.yaml");
    std::fs::write(
        &recipe,
        format!("name: train\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: {{ version: \"12.1\" }}\ntorch: {{ version: \"2.4.1\" }}\npackages: [acme-tokenizer]\nindexes:\n  - {{ name: internal, url: \"{index_url}\", packages: [acme-tokenizer] }}\n"),
    )
    .unwrap();
    recipe
}

/// `cudastack --json lock` at the most verbose log level, with `env` set and the
/// process's own credential sources cleared (an empty netrc file, no variables).
fn cli_lock(work: &Path, recipe: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut command = assert_cmd::Command::cargo_bin("cudastack").unwrap();
    command
        .args(["--json", "lock"])
        .arg(recipe)
        .arg("--mirror")
        .arg(work.join("mirror"))
        .env("NETRC", work.join("empty.netrc"))
        .env("CUDASTACK_LOG", "trace")
        .env("RUST_LOG", "debug")
        .env_remove("CUDASTACK_KEYRING_PROVIDER")
        .env_remove("CUDASTACK_INDEX_INTERNAL_USERNAME")
        .env_remove("CUDASTACK_INDEX_INTERNAL_PASSWORD")
        .env_remove("CUDASTACK_INDEX_INTERNAL_URL");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

/// Through the CLI: locked with credentials from the environment, then from a netrc file;
/// refused without any; the lock, `--json` output and trace-level logs never hold the
/// password; the locked wheel fetched the way `build` fetches it.
#[test]
fn cli_lock_uses_env_then_netrc_and_never_prints_the_password() {
    let work = tempfile::tempdir().unwrap();
    let internal = AuthIndex::start(PageFormat::Json, Some((USER, PASSWORD)));
    let tokenizer = publish(&internal, "acme-tokenizer", "1.0", &[]);
    let recipe_path = cli_project(work.path(), &internal);
    std::fs::write(work.path().join("empty.netrc"), "").unwrap();
    let lock_path = work.path().join("train.lock");

    let output = cli_lock(work.path(), &recipe_path, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("Index `internal` answered HTTP 401"),
        "{stderr}"
    );
    assert!(
        stderr.contains("CUDASTACK_INDEX_INTERNAL_USERNAME"),
        "{stderr}"
    );

    let bound = internal.simple_url();
    let env = [
        ("CUDASTACK_INDEX_INTERNAL_USERNAME", USER),
        ("CUDASTACK_INDEX_INTERNAL_PASSWORD", PASSWORD),
        ("CUDASTACK_INDEX_INTERNAL_URL", &bound),
    ];
    let netrc = work.path().join("team.netrc");
    std::fs::write(
        &netrc,
        format!("machine 127.0.0.1\n  login {USER}\n  password {PASSWORD}\n"),
    )
    .unwrap();
    let netrc_env = [("NETRC", netrc.to_str().unwrap())];
    for (how, env) in [("environment", &env[..]), ("netrc", &netrc_env[..])] {
        std::fs::remove_file(&lock_path).ok();
        let output = cli_lock(work.path(), &recipe_path, env);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{how}: {stderr}");
        let lock_text = std::fs::read_to_string(&lock_path).unwrap();
        for (what, text) in [
            ("lock", &*lock_text),
            ("--json", &*stdout),
            ("log", &*stderr),
        ] {
            assert!(
                !text.contains(PASSWORD),
                "{how}: the password is in the {what}"
            );
            // Basic auth is base64 of `user:password`; no form of it may show either.
            assert!(
                !text.contains("Y2ktYm90"),
                "{how}: an Authorization value is in the {what}"
            );
        }
        assert!(
            stderr.contains("TRACE") || stderr.contains("DEBUG"),
            "{how}: no verbose log: {stderr}"
        );
        let lock = Lockfile::read(&lock_path).unwrap();
        let locked = lock.artifact("acme-tokenizer").unwrap();
        assert_eq!(
            locked.source,
            format!("{}/", internal.simple_url()),
            "{how}"
        );
        assert_eq!(locked.url.as_url().unwrap().username(), "");
        assert_eq!(locked.sha256.hex(), sha256_hex(&tokenizer));
    }

    // The build's fetch: the recipe's index gives the credentials for the locked URL.
    let recipe = Recipe::load(&recipe_path).unwrap();
    let lock = Lockfile::read(&lock_path).unwrap();
    let item = lock
        .artifact("acme-tokenizer")
        .unwrap()
        .fetch_item(std::path::Path::new(""));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let fetch = |credentials: IndexCredentials| {
        let downloader = Downloader::new(
            client().with_credentials(credentials),
            store.clone(),
            Arc::new(NoReporter),
        );
        runtime.block_on(downloader.fetch(&item))
    };
    let error = fetch(credentials(&recipe, &[], None)).unwrap_err();
    assert!(
        error_chain(&error).contains("Index `internal` answered HTTP 401"),
        "{error}"
    );
    let blob = fetch(credentials(&recipe, &[], Some(&netrc))).unwrap();
    assert_eq!(
        Digest::of_bytes(&std::fs::read(blob).unwrap()),
        Digest::of_bytes(&tokenizer)
    );
}

/// Issue 32: a pull request changes the recipe's index `url:` to its own server and keeps
/// the name whose credentials CI holds. The environment's credentials go only to the URL
/// `CUDASTACK_INDEX_<NAME>_URL` names: without it, or with the real index's URL there,
/// `lock` stops before any request, and the other server never sees an `Authorization`.
#[test]
fn environment_credentials_never_follow_a_recipe_to_another_url() {
    let work = tempfile::tempdir().unwrap();
    let internal = AuthIndex::start(PageFormat::Json, Some((USER, PASSWORD)));
    let attacker = AuthIndex::start(PageFormat::Json, None);
    publish(&attacker, "acme-tokenizer", "1.0", &[]);
    let recipe_path = cli_project_at(work.path(), &attacker.simple_url());
    std::fs::write(work.path().join("empty.netrc"), "").unwrap();
    let credentials = [
        ("CUDASTACK_INDEX_INTERNAL_USERNAME", USER),
        ("CUDASTACK_INDEX_INTERNAL_PASSWORD", PASSWORD),
    ];
    let real = internal.simple_url();
    let bound_elsewhere = [
        credentials[0],
        credentials[1],
        ("CUDASTACK_INDEX_INTERNAL_URL", &real),
    ];
    for (how, env, says) in [
        (
            "unbound",
            &credentials[..],
            "CUDASTACK_INDEX_INTERNAL_URL is not",
        ),
        (
            "bound to the real index",
            &bound_elsewhere[..],
            "but CUDASTACK_INDEX_INTERNAL_URL is",
        ),
    ] {
        let output = cli_lock(work.path(), &recipe_path, env);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let seen = attacker.log();
        assert!(
            seen.iter().all(|seen| seen.authorization.is_none()),
            "{how}: the recipe's server got the credentials: {seen:?}"
        );
        assert!(!output.status.success(), "{how}: {stderr}");
        assert!(stderr.contains(says), "{how}: {stderr}");
        assert!(
            !stderr.contains(PASSWORD) && !stderr.contains("Y2ktYm90"),
            "{how}: {stderr}"
        );
    }
    assert!(internal.log().is_empty());
}

/// Issue 32: a netrc `default` entry (curl and pip send it to every host) goes only to an
/// index the user bound by `CUDASTACK_INDEX_<NAME>_URL`; a recipe's other server is read
/// without it.
#[test]
fn a_netrc_default_entry_goes_only_to_a_bound_index() {
    let work = tempfile::tempdir().unwrap();
    let netrc = work.path().join("default.netrc");
    std::fs::write(
        &netrc,
        format!("default login {USER} password {PASSWORD}\n"),
    )
    .unwrap();
    let netrc_env = ("NETRC", netrc.to_str().unwrap());

    let attacker = AuthIndex::start(PageFormat::Json, None);
    publish(&attacker, "acme-tokenizer", "1.0", &[]);
    let recipe_path = cli_project_at(work.path(), &attacker.simple_url());
    let output = cli_lock(work.path(), &recipe_path, &[netrc_env]);
    let seen = attacker.log();
    assert!(
        seen.iter().all(|seen| seen.authorization.is_none()),
        "the netrc default entry went to the recipe's server: {seen:?}"
    );
    assert!(
        !seen.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Bound by the user, the index gets it.
    let internal = AuthIndex::start(PageFormat::Json, Some((USER, PASSWORD)));
    publish(&internal, "acme-tokenizer", "1.0", &[]);
    let recipe_path = cli_project_at(work.path(), &internal.simple_url());
    std::fs::remove_file(work.path().join("train.lock")).ok();
    let bound = internal.simple_url();
    let output = cli_lock(
        work.path(),
        &recipe_path,
        &[netrc_env, ("CUDASTACK_INDEX_INTERNAL_URL", &bound)],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(internal
        .log()
        .iter()
        .all(|seen| seen.authorization.is_some()));
}

/// This machine's address on its network interface (not loopback), where one exists: a
/// server there stands for another host reached over plain http. No packet is sent to
/// find it (a UDP socket's `connect` only picks the route).
fn non_loopback_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.200:9").ok()?;
    let address = socket.local_addr().ok()?.ip();
    (!address.is_loopback() && !address.is_unspecified()).then_some(address)
}

/// Issue 32: credentials are never sent over plain http to a host other than this
/// machine; `lock` refuses before any request, saying where they came from and what to do.
#[test]
fn credentials_over_plain_http_to_another_host_are_refused() {
    let Some(address) = non_loopback_address() else {
        crate::gate::skip(
            "non-loopback address",
            "this machine has no network interface besides loopback to stand for another host",
        );
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let remote = AuthIndex::start_on(address, PageFormat::Json, Some((USER, PASSWORD)));
    publish(&remote, "acme-tokenizer", "1.0", &[]);
    let recipe_path = cli_project_at(work.path(), &remote.simple_url());
    std::fs::write(work.path().join("empty.netrc"), "").unwrap();
    let netrc = work.path().join("team.netrc");
    std::fs::write(
        &netrc,
        format!("machine {address} login {USER} password {PASSWORD}\n"),
    )
    .unwrap();
    let bound = remote.simple_url();
    let env = [
        ("CUDASTACK_INDEX_INTERNAL_USERNAME", USER),
        ("CUDASTACK_INDEX_INTERNAL_PASSWORD", PASSWORD),
        ("CUDASTACK_INDEX_INTERNAL_URL", &bound),
    ];
    let netrc_env = [("NETRC", netrc.to_str().unwrap())];
    for (how, env, from) in [
        ("environment", &env[..], "CUDASTACK_INDEX_INTERNAL_USERNAME"),
        ("netrc", &netrc_env[..], "the netrc file"),
    ] {
        let output = cli_lock(work.path(), &recipe_path, env);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let seen = remote.log();
        assert!(
            seen.iter().all(|seen| seen.authorization.is_none()),
            "{how}: credentials crossed plain http: {seen:?}"
        );
        assert!(!output.status.success(), "{how}: {stderr}");
        for says in [
            "plain http on another machine",
            from,
            "use the index's https URL",
        ] {
            assert!(stderr.contains(says), "{how}: missing `{says}`: {stderr}");
        }
    }
}

/// A file link whose redirect chain leaves the index's origin (another port of 127.0.0.1
/// is another origin) and comes back: the credentials bound to the index reach it only
/// before the chain leaves, never the other origin, and are not put back on the way back.
#[tokio::test]
async fn a_redirect_to_another_origin_carries_no_credentials() {
    let internal = AuthIndex::start(PageFormat::Json, Some((USER, PASSWORD)));
    let cdn = AuthIndex::start(PageFormat::Json, None);
    let bytes = publish(&internal, "acme-tokenizer", "1.0", &[]);
    let filename = "acme_tokenizer-1.0-py3-none-any.whl";
    // internal /redirect/F -> cdn /redirect/F -> internal /packages/F
    internal.publish_redirect(
        "acme-tokenizer",
        filename,
        &sha256_hex(&bytes),
        &format!("{}/redirect/{filename}", cdn.base),
    );
    cdn.publish_redirect(
        "acme-tokenizer",
        filename,
        &sha256_hex(&bytes),
        &format!("{}/packages/{filename}", internal.base),
    );
    let recipe = recipe(
        &format!("[{{ name: internal, url: \"{}\" }}]", internal.simple_url()),
        "[]",
    );
    let bound = internal.simple_url();
    let env = [
        ("CUDASTACK_INDEX_INTERNAL_USERNAME", USER),
        ("CUDASTACK_INDEX_INTERNAL_PASSWORD", PASSWORD),
        ("CUDASTACK_INDEX_INTERNAL_URL", &bound),
    ];
    let client = client().with_credentials(credentials(&recipe, &env, None));
    let url = format!("{}/redirect/{filename}", internal.base)
        .parse()
        .unwrap();
    // The way back to the index comes without credentials, and the index refuses it.
    let error = client.get_bytes(&url, None).await.unwrap_err();
    assert!(
        error_chain(&error).contains("401"),
        "{}",
        error_chain(&error)
    );
    let cdn_log = cdn.log();
    assert!(!cdn_log.is_empty());
    assert!(
        cdn_log.iter().all(|seen| seen.authorization.is_none()),
        "credentials followed the redirect: {cdn_log:?}"
    );
    let internal_log = internal.log();
    assert!(internal_log[0].authorization.is_some(), "{internal_log:?}");
    assert!(
        internal_log[1..]
            .iter()
            .all(|seen| seen.authorization.is_none()),
        "{internal_log:?}"
    );
}

/// Whether `needle` occurs in what `reader` yields, read in chunks (a layer may be large).
fn stream_contains(mut reader: impl std::io::Read, needle: &[u8]) -> bool {
    let mut carry: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut chunk).unwrap();
        if n == 0 {
            return false;
        }
        carry.extend_from_slice(&chunk[..n]);
        if carry.windows(needle.len()).any(|window| window == needle) {
            return true;
        }
        let keep = carry.len().min(needle.len() - 1);
        carry.drain(..carry.len() - keep);
    }
}

/// Every blob of an OCI layout, decompressed when it is a gzip or zstd layer, searched.
fn layout_contains(layout: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in walk(layout) {
        let file = std::fs::File::open(&entry).unwrap();
        let mut magic = [0u8; 4];
        let head =
            std::io::Read::read(&mut std::fs::File::open(&entry).unwrap(), &mut magic).unwrap();
        let hit = if head >= 2 && magic[..2] == [0x1f, 0x8b] {
            stream_contains(flate2::read::MultiGzDecoder::new(file), needle)
        } else if head == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
            stream_contains(zstd::stream::read::Decoder::new(file).unwrap(), needle)
        } else {
            stream_contains(file, needle)
        };
        if hit {
            found.push(entry.display().to_string());
        }
    }
    found
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.is_file() {
            files.push(path);
        }
    }
    files
}

/// `cudastack build` of a stand-in stack plus a package of the private index: the locked
/// wheel is fetched with the credentials (environment) and installed, and no blob of the
/// OCI layout (config, manifest, every layer decompressed) holds the password, the user
/// name's basic-auth form, or the build's `--json` output and logs. The recipe's
/// `wheels:` directory gives one more package (tests/lock_wheel_dirs.rs has the rest of
/// it): locked at its path beside the recipe, and installed like an index's wheel, from
/// the same image build.
#[test]
fn build_fetches_the_private_wheel_and_the_layout_holds_no_credentials() {
    use crate::e2e_support::{self, stand_in};
    if let Some(skip) = e2e_support::skip_reason(&[]) {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mirror = work.path().join("mirror");
    stand_in::cuda_12_4_wheels(stand_in::Target::X86_64, &work.path().join("libs"), &mirror);
    let private = work.path().join("private");
    std::fs::create_dir_all(&private).unwrap();
    let wheel = stand_in::write_wheel(
        &private,
        stand_in::Target::X86_64,
        "acme-tokenizer",
        "1.0",
        &[("acme_tokenizer/__init__.py", b"TOKENS = 3\n".to_vec())],
    );
    let internal = AuthIndex::start(PageFormat::Html, Some((USER, PASSWORD)));
    internal.publish(
        "acme-tokenizer",
        wheel.file_name().unwrap().to_str().unwrap(),
        std::fs::read(&wheel).unwrap(),
        "Metadata-Version: 2.1\nName: acme-tokenizer\nVersion: 1.0\n\n",
    );
    std::fs::create_dir_all(work.path().join("wheelhouse")).unwrap();
    let local = stand_in::write_wheel(
        &work.path().join("wheelhouse"),
        stand_in::Target::X86_64,
        "acme-ops",
        "1.0",
        &[("acme_ops/__init__.py", b"OPS = 7\n".to_vec())],
    );
    let recipe = work.path().join("private.yaml");
    std::fs::write(
        &recipe,
        format!("name: private\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: 1700000000\npackages: [acme-tokenizer, acme-ops]\nwheels: [wheelhouse]\nindexes: [{{ name: internal, url: \"{}\", packages: [acme-tokenizer] }}]\n", internal.simple_url()),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cudastack"));
        command
            .arg("--json")
            .args(args)
            .arg("--mirror")
            .arg(&mirror)
            .env("CUDASTACK_LOG", "debug")
            .env("NETRC", work.path().join("none.netrc"))
            .env("CUDASTACK_INDEX_INTERNAL_USERNAME", USER)
            .env("CUDASTACK_INDEX_INTERNAL_PASSWORD", PASSWORD)
            .env("CUDASTACK_INDEX_INTERNAL_URL", internal.simple_url());
        command
    };
    let lock = run(&["lock"]).arg(&recipe).output().unwrap();
    assert!(
        lock.status.success(),
        "{}",
        String::from_utf8_lossy(&lock.stderr)
    );
    let locked = Lockfile::read(&recipe.with_extension("lock")).unwrap();
    let ops = locked.artifact("acme-ops").unwrap();
    assert_eq!(
        ops.url.to_string(),
        format!(
            "file:wheelhouse/{}",
            local.file_name().unwrap().to_str().unwrap()
        )
    );
    let layout = work.path().join("layout");
    let build = run(&["build", "--no-verify"])
        .arg("--layout")
        .arg(&layout)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(&recipe)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&build.stdout);
    let stderr = String::from_utf8_lossy(&build.stderr);
    assert!(build.status.success(), "{stderr}");
    let wheel_fetched = internal
        .log()
        .iter()
        .any(|seen| seen.path.ends_with(".whl") && seen.authorization.is_some());
    let cached = stderr.contains("0 to download");
    assert!(
        wheel_fetched || cached,
        "the build did not fetch the private wheel: {stderr}"
    );
    for needle in [PASSWORD, "Y2ktYm90"] {
        assert!(
            !stdout.contains(needle) && !stderr.contains(needle),
            "`{needle}` in the build's output"
        );
        let found = layout_contains(&layout, needle.as_bytes());
        assert!(found.is_empty(), "`{needle}` in the layout: {found:?}");
    }
    // The wheels were installed: their modules are in a layer.
    assert!(!layout_contains(&layout, b"TOKENS = 3").is_empty());
    assert!(!layout_contains(&layout, b"OPS = 7").is_empty());
    // The same lock and wheel bytes in another checkout: the same image (from the cache).
    let moved = work.path().join("elsewhere/checkout");
    std::fs::create_dir_all(moved.join("wheelhouse")).unwrap();
    std::fs::copy(
        &local,
        moved.join("wheelhouse").join(local.file_name().unwrap()),
    )
    .unwrap();
    for file in ["private.yaml", "private.lock"] {
        std::fs::copy(work.path().join(file), moved.join(file)).unwrap();
    }
    let again = work.path().join("layout-again");
    let rebuild = run(&["build", "--no-verify"])
        .arg("--layout")
        .arg(&again)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(moved.join("private.yaml"))
        .output()
        .unwrap();
    assert!(
        rebuild.status.success(),
        "{}",
        String::from_utf8_lossy(&rebuild.stderr)
    );
    // The image and its SBOMs (which name the wheel by its path from the recipe); the
    // provenance records the recipe's path as the build was given it, which differs.
    let manifests = |layout: &Path| -> Vec<String> {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["artifactType"] != "application/vnd.in-toto+json")
            .map(|m| m["digest"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(manifests(&layout), manifests(&again));
}
