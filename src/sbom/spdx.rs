//! The inventory as an SPDX 2.3 JSON document (<https://spdx.github.io/spdx-spec/v2.3/>).
//!
//! The image is the root package (the document DESCRIBES it, it CONTAINS what it holds);
//! cudastack's facts are package annotations of type OTHER whose comment is
//! `cudastack:<key>=<value>` (SPDX 2.3 has no properties; annotations are its place for
//! tool facts, and validators accept them). Written as canonical JSON (sorted keys): the
//! bytes are hashed and stored as an OCI blob.

use std::sync::LazyLock;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use regex::Regex;
use serde_json::{json, Map, Value};

use super::inventory::{Inventory, Package, Role, FACT_PREFIX};
use super::SbomInput;
use crate::digest::Digest;

/// The media type (and OCI artifactType) of an SPDX JSON document.
pub const SPDX_MEDIA_TYPE: &str = "application/spdx+json";

/// The creator every document names.
pub(crate) const TOOL: &str = concat!("Tool: cudastack-", env!("CARGO_PKG_VERSION"));

/// Where document namespaces live: `<base>/<name>-<sha256 of the document without it>`.
pub const NAMESPACE_BASE: &str = "https://cudastack.dev/spdx/";

/// What the name may keep unencoded in the namespace URI (RFC 3986 unreserved).
const NAME_IN_URI: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A URL SPDX 2.3 accepts as a `downloadLocation`: the reference validator's rule (PyPI
/// spdx-tools 0.8, `spdx/validation/uri_validators.py`): a host name with a top-level
/// domain, so no IP address, `localhost` or `file:` URL (a lock made against a local
/// mirror names those).
static DOWNLOAD_URL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)^(https?://(www\.)?|ssh://|git://|svn://|sftp://|ftp://)?",
        r"([\w\-.!~*'()%;:&=+$,]+@)?[a-z0-9]+([\-.][a-z0-9]+){0,100}\.[a-z]{2,5}",
        r"(:[0-9]{1,5})?(/.*)?$",
    ))
    .expect("the pattern is valid")
});

/// The SPDX 2.3 JSON document of `input`'s image, byte-for-byte deterministic.
pub fn spdx_json(input: &SbomInput) -> Vec<u8> {
    document(&Inventory::of(input))
}

/// The document of an inventory.
pub(crate) fn document(inventory: &Inventory) -> Vec<u8> {
    let created = crate::oci::rfc3339(inventory.created);
    let packages: Vec<Value> = inventory
        .packages
        .iter()
        .map(|package| package_json(package, &created))
        .collect();
    let mut relationships = vec![relationship(
        "SPDXRef-DOCUMENT",
        "DESCRIBES",
        &spdx_id(&inventory.image().id),
    )];
    relationships.extend(inventory.edges.iter().map(|edge| {
        relationship(
            &spdx_id(&edge.from),
            edge.relation.spdx(),
            &spdx_id(&edge.to),
        )
    }));
    let mut document = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": inventory.name,
        "creationInfo": {
            "created": created,
            "creators": [TOOL],
        },
        "packages": packages,
        "relationships": relationships,
    });
    // The namespace must be unique per document and the same for the same content: the
    // digest of everything else the document says.
    let body = canonical(&document);
    let namespace = format!(
        "{NAMESPACE_BASE}{}-{}",
        utf8_percent_encode(&inventory.name, NAME_IN_URI),
        Digest::of_bytes(&body).hex()
    );
    document["documentNamespace"] = Value::String(namespace);
    canonical(&document)
}

fn canonical(value: &Value) -> Vec<u8> {
    crate::canonical::to_canonical_json(value).expect("JSON values serialise")
}

/// `SPDXRef-<id>`.
pub(crate) fn spdx_id(id: &str) -> String {
    format!("SPDXRef-{id}")
}

fn relationship(from: &str, kind: &str, to: &str) -> Value {
    json!({
        "spdxElementId": from,
        "relationshipType": kind,
        "relatedSpdxElement": to,
    })
}

fn package_json(package: &Package, created: &str) -> Value {
    let noassertion = || Value::String("NOASSERTION".into());
    let mut object = Map::new();
    let mut set = |key: &str, value: Value| {
        object.insert(key.to_string(), value);
    };
    set("SPDXID", spdx_id(&package.id).into());
    set("name", package.name.clone().into());
    if let Some(version) = &package.version {
        set("versionInfo", version.clone().into());
    }
    // A URL SPDX does not accept is kept as a fact rather than lost.
    let mut facts: Vec<(&str, &str)> = package
        .facts
        .iter()
        .map(|f| (f.key, f.value.as_str()))
        .collect();
    match package.download.as_deref() {
        Some(url) if DOWNLOAD_URL.is_match(url) => set("downloadLocation", url.into()),
        Some(url) => {
            set("downloadLocation", noassertion());
            facts.push(("download-url", url));
        }
        None => set("downloadLocation", noassertion()),
    }
    // Nothing is said about files: the packages are described from the lock.
    set("filesAnalyzed", false.into());
    if let Some(sha256) = &package.sha256 {
        set(
            "checksums",
            json!([{"algorithm": "SHA256", "checksumValue": sha256.hex()}]),
        );
    }
    if let Some(purl) = &package.purl {
        set(
            "externalRefs",
            json!([{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": purl,
            }]),
        );
    }
    set("licenseConcluded", noassertion());
    set(
        "licenseDeclared",
        package
            .license
            .clone()
            .map_or_else(noassertion, Value::String),
    );
    set("copyrightText", noassertion());
    set(
        "supplier",
        package
            .supplier
            .clone()
            .map_or_else(noassertion, Value::String),
    );
    if let Some(summary) = &package.summary {
        set("summary", summary.clone().into());
    }
    if let Some(purpose) = purpose(package.role) {
        set("primaryPackagePurpose", purpose.into());
    }
    if !facts.is_empty() {
        let annotations: Vec<Value> = facts
            .iter()
            .map(|(key, value)| {
                json!({
                    "annotationDate": created,
                    "annotationType": "OTHER",
                    "annotator": TOOL,
                    "comment": format!("{FACT_PREFIX}{key}={value}"),
                })
            })
            .collect();
        set("annotations", annotations.into());
    }
    Value::Object(object)
}

/// SPDX 2.3's primary package purpose; none for a Debian package (libraries, programs
/// and data alike).
fn purpose(role: Role) -> Option<&'static str> {
    match role {
        Role::Image => Some("CONTAINER"),
        Role::Wheel | Role::CudaComponent | Role::BuiltWheel | Role::BuildWheel => Some("LIBRARY"),
        Role::RedistArchive => Some("ARCHIVE"),
        Role::Sdist => Some("SOURCE"),
        Role::Deb | Role::BuildDeb => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_locations_follow_the_validators_rule() {
        for url in [
            "https://files.pythonhosted.org/packages/53/7b/filelock-4.3.1-py3-none-any.whl",
            "http://deb.debian.org/debian/pool/main/a/adduser/adduser_3.134_all.deb",
            "https://download.pytorch.org/whl/cu118/torch-2.1.2%2Bcu118-cp311-cp311-linux_x86_64.whl",
        ] {
            assert!(DOWNLOAD_URL.is_match(url), "{url}");
        }
        for url in [
            "http://127.0.0.1:0/whl/cu118/files/torch.whl",
            "http://localhost:8080/simple/torch.whl",
            "file:///srv/mirror/torch.whl",
        ] {
            assert!(!DOWNLOAD_URL.is_match(url), "{url}");
        }
    }

    #[test]
    fn names_stay_readable_in_the_namespace() {
        let encoded =
            utf8_percent_encode("ghcr.io/acme/torch:2.4.1 cu121", NAME_IN_URI).to_string();
        assert_eq!(encoded, "ghcr.io%2Facme%2Ftorch%3A2.4.1%20cu121");
    }
}
