//! A registry whose token service or error documents are hostile: a real registry (Debian's
//! docker-registry, open) behind a proxy that answers 401 with a Bearer challenge naming a
//! token service of the test's choosing, and answers that service itself.
//! - `expires_in` of u64::MAX panicked every registry command (the clock overflowed);
//! - a token answer or error document that never ends was read into memory whole;
//! - credentials went to any realm the registry named, plain http on another host included.

use crate::registry_support::{self, random_layer, Action, Proxy, Registry};

use std::sync::{Arc, OnceLock};

use cudastack::cache::BlobStore;
use cudastack::registry::{
    push_image, ClientOptions, Credentials, PushOptions, Reference, RegistryClient, Secret,
};

/// An open registry holding one small image, behind a proxy that asks for a Bearer token
/// from `realm` (`{proxy}` is replaced by the proxy's own host) and answers `/token` with
/// `token_answer`. Returns the proxy (keep it alive) and the image's reference through it.
async fn behind_a_token_service(
    realm: &str,
    token_answer: Vec<u8>,
) -> Option<(Arc<Registry>, Proxy, Reference, tempfile::TempDir)> {
    if let Some(reason) = registry_support::skip_reason() {
        reason.report();
        return None;
    }
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let image = cudastack::oci::Image::new(1_700_000_000)
        .with_layer(random_layer(&store, "payload", 3, 4 << 10), "payload");
    let direct: Reference = format!("{}/team/app:1", registry.host()).parse().unwrap();
    let client = RegistryClient::new(&direct, ClientOptions::default()).unwrap();
    push_image(&client, &image, &direct, &PushOptions::default())
        .await
        .unwrap();

    let port = Arc::new(OnceLock::<u16>::new());
    let (realm, own_port) = (realm.to_string(), port.clone());
    let proxy = Proxy::start(
        registry.port,
        Arc::new(move |head| {
            let host = format!("127.0.0.1:{}", own_port.get().copied().unwrap_or_default());
            if head.target.starts_with("/token") {
                return Action::Respond {
                    status: 200,
                    headers: vec![("Content-Type".into(), "application/json".into())],
                    body: token_answer.clone(),
                };
            }
            if head.header("authorization").is_none() {
                return Action::Respond {
                    status: 401,
                    headers: vec![(
                        "WWW-Authenticate".into(),
                        format!(
                            r#"Bearer realm="{}",service="hostile""#,
                            realm.replace("{proxy}", &host)
                        ),
                    )],
                    body: Vec::new(),
                };
            }
            Action::ForwardWithoutAuth
        }),
    );
    port.set(proxy.port).unwrap();
    let reference = format!("{}/team/app:1", proxy.host()).parse().unwrap();
    Some((registry, proxy, reference, work))
}

fn with(credentials: Credentials) -> ClientOptions {
    ClientOptions {
        credentials,
        ..ClientOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_lifetime_past_the_clock_is_taken_as_a_day_not_a_panic() {
    let answer = br#"{"token":"t","expires_in":18446744073709551615}"#.to_vec();
    let Some((_registry, _proxy, reference, _work)) =
        behind_a_token_service("http://{proxy}/token", answer).await
    else {
        return;
    };
    // With credentials: a token service on the registry's own host may have them over http.
    let password = Secret::new("s3cret-password".to_string());
    let client = RegistryClient::new(&reference, with(Credentials::basic("ci", password))).unwrap();
    let manifest = client.get_manifest(&reference).await.unwrap();
    assert!(!manifest.bytes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_answer_past_its_cap_is_refused_unread() {
    let mut answer = br#"{"token":""#.to_vec();
    answer.extend(std::iter::repeat_n(b'a', 8 << 20));
    answer.extend(br#""}"#);
    let Some((_registry, _proxy, reference, _work)) =
        behind_a_token_service("http://{proxy}/token", answer).await
    else {
        return;
    };
    let client = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    let error = client
        .get_manifest(&reference)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("larger than 1048576 bytes"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_go_to_a_plain_http_token_service_on_another_host() {
    // 192.0.2.0/24 is TEST-NET-1: nothing answers there, and nothing must be tried.
    let Some((_registry, proxy, reference, _work)) =
        behind_a_token_service("http://192.0.2.2:5121/token", b"{}".to_vec()).await
    else {
        return;
    };
    let password = Secret::new("s3cret-password".to_string());
    let client = RegistryClient::new(&reference, with(Credentials::basic("ci", password))).unwrap();
    let started = std::time::Instant::now();
    let error = client
        .get_manifest(&reference)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("plain http on another machine") && !error.contains("s3cret"),
        "{error}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "it tried to reach the token service"
    );
    assert!(proxy.requests().iter().all(|r| !r.contains("/token")));
}

/// A registry that requires Basic auth answers the upload POST with a `Location` on another
/// origin (here another port of this machine, standing in for another host): the upload
/// goes there without the registry's credentials, as Docker's client sends them only to
/// the host that asked for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_location_on_another_host_gets_no_credentials() {
    if let Some(reason) = registry_support::skip_reason() {
        reason.report();
        return;
    }
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let image = cudastack::oci::Image::new(1_700_000_000)
        .with_layer(random_layer(&store, "payload", 3, 4 << 10), "payload");

    // The other host: records whether each request carried an Authorization header.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Option<String>>::new()));
    let record = seen.clone();
    let elsewhere = Proxy::start(
        registry.port,
        Arc::new(move |head| {
            record
                .lock()
                .unwrap()
                .push(head.header("authorization").map(str::to_string));
            Action::Respond {
                status: 400,
                headers: vec![],
                body: b"{}".to_vec(),
            }
        }),
    );
    let location = format!(
        "http://{}/v2/team/app/blobs/uploads/session1",
        elsewhere.host()
    );
    let registry_with_basic = Proxy::start(
        registry.port,
        Arc::new(move |head| {
            if head.header("authorization").is_none() {
                return Action::Respond {
                    status: 401,
                    headers: vec![("WWW-Authenticate".into(), r#"Basic realm="hostile""#.into())],
                    body: Vec::new(),
                };
            }
            if head.method == "POST" && head.target.contains("/blobs/uploads/") {
                return Action::Respond {
                    status: 202,
                    headers: vec![("Location".into(), location.clone())],
                    body: Vec::new(),
                };
            }
            Action::ForwardWithoutAuth
        }),
    );
    let reference: Reference = format!("{}/team/app:1", registry_with_basic.host())
        .parse()
        .unwrap();
    let password = Secret::new("s3cret-password".to_string());
    let client = RegistryClient::new(&reference, with(Credentials::basic("ci", password))).unwrap();
    let error = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap_err();
    assert!(!format!("{error:?}").contains("s3cret"), "{error:?}");
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty(), "the upload never reached the Location");
    assert!(
        seen.iter().all(Option::is_none),
        "the other host received credentials: {seen:?}"
    );
}
