//! The transport under fetch and registry against a real local HTTP server: transient
//! statuses are sent again, and a body cut mid-stream is continued from where it stopped.

use std::sync::Arc;
use std::time::Duration;

use cudastack::net::{range_headers, Piece, ReadError, ResumableBody, RetryPolicy, Transport};
use reqwest::{Method, Response, StatusCode, Url};

use crate::fetch_support::{payload, Body, Faults, FixtureServer};

fn transport(max_attempts: u32) -> Transport {
    let policy = RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    };
    Transport::new(reqwest::Client::new(), policy)
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error(transparent)]
    Net(#[from] cudastack::net::NetError),
    #[error(transparent)]
    Read(#[from] ReadError),
}

#[tokio::test]
async fn two_503s_then_200_is_one_answer_after_three_attempts() {
    let server = FixtureServer::start();
    server.add(
        "/flaky",
        "text/plain",
        Body::Bytes(Arc::new(b"fine".to_vec())),
        Faults {
            fail_status: Some(503),
            fail_times: 2,
            ..Faults::default()
        },
    );
    let url: Url = server.url("/flaky").parse().unwrap();
    let transport = transport(3);
    let sent = transport
        .send::<TestError, _, _>(&Method::GET, &url, || {
            std::future::ready(Ok(transport.client().get(url.clone())))
        })
        .await
        .unwrap();
    assert_eq!(sent.response.status(), StatusCode::OK);
    assert_eq!(sent.attempts, 3);
    assert_eq!(sent.response.bytes().await.unwrap().as_ref(), b"fine");
    assert_eq!(server.requests_for("/flaky").len(), 3);

    // With two attempts the second 503 is the answer: the caller judges it.
    let server = FixtureServer::start();
    server.add(
        "/down",
        "text/plain",
        Body::Bytes(Arc::new(b"x".to_vec())),
        Faults {
            fail_status: Some(503),
            fail_times: 5,
            ..Faults::default()
        },
    );
    let url: Url = server.url("/down").parse().unwrap();
    let transport = self::transport(2);
    let sent = transport
        .send::<TestError, _, _>(&Method::GET, &url, || {
            std::future::ready(Ok(transport.client().get(url.clone())))
        })
        .await
        .unwrap();
    assert_eq!(sent.response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(sent.attempts, 2);
}

/// Read `url` whole through a [`ResumableBody`]; returns the bytes and whether it restarted.
async fn read_resumably(transport: &Transport, url: &Url) -> Result<(Vec<u8>, bool), TestError> {
    let open = |from: u64| async move {
        let sent = transport
            .send::<TestError, _, _>(&Method::GET, url, || {
                std::future::ready(Ok(transport
                    .client()
                    .get(url.clone())
                    .headers(range_headers(from))))
            })
            .await?;
        Ok::<Option<Response>, TestError>(Some(sent.response))
    };
    let mut body = ResumableBody::new(url, 0, transport.retry_policy(), open);
    let mut bytes = Vec::new();
    let mut restarted = false;
    while let Some(piece) = body.next().await? {
        match piece {
            Piece::Bytes(chunk) => bytes.extend_from_slice(&chunk),
            Piece::Restart => {
                bytes.clear();
                restarted = true;
            }
        }
    }
    Ok((bytes, restarted))
}

#[tokio::test]
async fn a_body_cut_mid_stream_is_continued_with_a_range() {
    let server = FixtureServer::start();
    let whole = payload(300_000);
    server.add(
        "/big.bin",
        "application/octet-stream",
        Body::Bytes(Arc::new(whole.clone())),
        Faults {
            cut_after: Some(100_000),
            cut_times: 2,
            ..Faults::default()
        },
    );
    let url: Url = server.url("/big.bin").parse().unwrap();
    let (bytes, restarted) = read_resumably(&transport(3), &url).await.unwrap();
    assert!(!restarted);
    assert_eq!(bytes.len(), whole.len());
    assert!(bytes == whole, "the resumed read differs from the body");
    let ranges: Vec<Option<String>> = server
        .requests_for("/big.bin")
        .into_iter()
        .map(|request| request.range)
        .collect();
    assert_eq!(ranges.len(), 3, "{ranges:?}");
    assert_eq!(ranges[0], None);
    // Each request continues where the bytes received so far end.
    assert_eq!(ranges[1].as_deref(), Some("bytes=100000-"), "{ranges:?}");
    assert_eq!(ranges[2].as_deref(), Some("bytes=200000-"), "{ranges:?}");
}

#[tokio::test]
async fn a_server_that_ignores_the_range_restarts_the_read() {
    let server = FixtureServer::start();
    let whole = payload(200_000);
    server.add(
        "/norange.bin",
        "application/octet-stream",
        Body::Bytes(Arc::new(whole.clone())),
        Faults {
            cut_after: Some(50_000),
            cut_times: 1,
            ignore_range: true,
            ..Faults::default()
        },
    );
    let url: Url = server.url("/norange.bin").parse().unwrap();
    let (bytes, restarted) = read_resumably(&transport(3), &url).await.unwrap();
    assert!(restarted);
    assert!(bytes == whole, "the restarted read differs from the body");
}

#[tokio::test]
async fn cuts_without_progress_give_up_after_the_attempts() {
    let server = FixtureServer::start();
    server.add(
        "/dead.bin",
        "application/octet-stream",
        Body::Bytes(Arc::new(payload(10_000))),
        Faults {
            cut_after: Some(0),
            cut_times: 10,
            ..Faults::default()
        },
    );
    let url: Url = server.url("/dead.bin").parse().unwrap();
    let error = read_resumably(&transport(3), &url).await.unwrap_err();
    assert!(
        matches!(
            error,
            TestError::Read(ReadError::Cut {
                attempts: 3,
                offset: 0,
                ..
            })
        ),
        "{error:?}"
    );
    assert_eq!(server.requests_for("/dead.bin").len(), 3);
}

/// A server that ignores the range and cuts the whole body again at the same byte: the
/// bytes read again after each restart are no progress, so the attempts run out.
#[tokio::test]
async fn a_server_that_restarts_and_cuts_at_the_same_byte_gives_up() {
    let server = FixtureServer::start();
    server.add(
        "/loop.bin",
        "application/octet-stream",
        Body::Bytes(Arc::new(payload(50_000))),
        Faults {
            cut_after: Some(4096),
            cut_times: 50,
            ignore_range: true,
            ..Faults::default()
        },
    );
    let url: Url = server.url("/loop.bin").parse().unwrap();
    let error = read_resumably(&transport(3), &url).await.unwrap_err();
    assert!(
        matches!(error, TestError::Read(ReadError::Cut { attempts: 3, .. })),
        "{error:?}"
    );
    assert_eq!(server.requests_for("/loop.bin").len(), 3);
}
