//! Against the real PyPI (reachable here and in CI). Skipped with CUDASTACK_OFFLINE_TESTS=1.
//! Kept light: small listings, PEP 658 metadata of small packages, and one range read of a
//! torch wheel's METADATA (the wheel itself is ~800 MB and is never downloaded).

use crate::gate;

use std::str::FromStr;

use cudastack::fetch::http::HttpClient;
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::metadata::{wheel_metadata, wheel_metadata_by_range, Metadata};
use cudastack::fetch::remote_zip::RemoteZip;
use cudastack::names::PackageName;

fn offline() -> bool {
    gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |v| v == "1",
        "this test needs https://pypi.org",
    )
}

#[tokio::test]
async fn pep691_listing_and_pep658_metadata() {
    if offline() {
        return;
    }
    let index = SimpleIndex::pypi(HttpClient::with_defaults().unwrap());
    let page = index
        .project(&PackageName::from_str("MarkupSafe").unwrap())
        .await
        .unwrap();
    assert_eq!(page.url.as_str(), "https://pypi.org/simple/markupsafe/");
    let (wheel, file) = page
        .wheels()
        .find(|(w, _)| {
            w.version.to_string() == "2.1.5"
                && w.tag_string() == "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64"
        })
        .expect("markupsafe 2.1.5 cp311 manylinux wheel");
    assert_eq!(wheel.name.as_ref(), "markupsafe");
    assert!(file.sha256.is_some());
    assert!(file.size.unwrap() > 10_000);
    assert!(file.upload_time.is_some());
    let text = wheel_metadata(index.client(), file).await.unwrap();
    let metadata = Metadata::parse(&text, file.url.as_str()).unwrap();
    assert_eq!(metadata.name.as_ref(), "markupsafe");
    assert_eq!(metadata.version.to_string(), "2.1.5");
    assert!(metadata.requires_python.is_some());
}

#[tokio::test]
async fn torch_metadata_by_range_reads() {
    if offline() {
        return;
    }
    let index = SimpleIndex::pypi(HttpClient::with_defaults().unwrap());
    let page = index
        .project(&PackageName::from_str("torch").unwrap())
        .await
        .unwrap();
    let (_, file) = page
        .wheels()
        .find(|(w, _)| w.to_string() == "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl")
        .expect("torch 2.4.1 cp311 manylinux1 wheel on PyPI");
    // Force the range-read path even if PyPI has since backfilled a .metadata file.
    let text = wheel_metadata_by_range(index.client(), file).await.unwrap();
    let metadata = Metadata::parse(&text, file.url.as_str()).unwrap();
    assert_eq!(metadata.version.to_string(), "2.4.1");
    let names: Vec<String> = metadata
        .requires_dist
        .iter()
        .map(|r| r.name.to_string())
        .collect();
    for expected in [
        "nvidia-cudnn-cu12",
        "triton",
        "sympy",
        "networkx",
        "filelock",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }

    let zip = RemoteZip::open(index.client(), file.url.clone())
        .await
        .unwrap();
    assert_eq!(Some(zip.size()), file.size);
    assert!(zip.entries().len() > 1000);
    assert!(zip.entry("torch/lib/libtorch_python.so").is_some());
}
