//! The inventory as a CycloneDX 1.6 JSON document (<https://cyclonedx.org/docs/1.6/json/>).
//!
//! The image is `metadata.component`; every other package is a component (`scope:
//! excluded` for what the image does not hold: sdists, builder packages, redist archives).
//! The image depends on what it contains (`dependencies`); the other relationships and
//! cudastack's facts are `properties` named `cudastack:<key>` (`cudastack:expanded-from-ref`
//! = the bom-ref of the wheel a CUDA component came from). Same content as the SPDX
//! document, from the same [`Inventory`].

use serde_json::{json, Map, Value};

use super::inventory::{Inventory, Package, Relation, Role, FACT_PREFIX};
use super::SbomInput;
use crate::digest::Digest;

/// The media type (and OCI artifactType) of a CycloneDX JSON document.
pub const CYCLONEDX_MEDIA_TYPE: &str = "application/vnd.cyclonedx+json";

/// The CycloneDX 1.6 JSON document of `input`'s image, byte-for-byte deterministic.
pub fn cyclonedx_json(input: &SbomInput) -> Vec<u8> {
    document(&Inventory::of(input))
}

pub(crate) fn document(inventory: &Inventory) -> Vec<u8> {
    let mut components: Vec<Value> = inventory.packages[1..]
        .iter()
        .map(|package| component(package, inventory))
        .collect();
    components.sort_by(|a, b| a["bom-ref"].as_str().cmp(&b["bom-ref"].as_str()));
    let image = inventory.image();
    let contained: Vec<&str> = inventory
        .edges
        .iter()
        .filter(|e| e.relation == Relation::Contains && e.from == image.id)
        .map(|e| e.to.as_str())
        .collect();
    let mut document = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {
            "timestamp": crate::oci::rfc3339(inventory.created),
            "tools": {"components": [{
                "type": "application",
                "name": "cudastack",
                "version": env!("CARGO_PKG_VERSION"),
            }]},
            "component": component(image, inventory),
        },
        "components": components,
        "dependencies": [{"ref": image.id, "dependsOn": contained}],
    });
    let digest = Digest::of_bytes(&canonical(&document));
    document["serialNumber"] = Value::String(serial_number(&digest));
    canonical(&document)
}

fn canonical(value: &Value) -> Vec<u8> {
    crate::canonical::to_canonical_json(value).expect("JSON values serialise")
}

/// `urn:uuid:...` from the digest of the content: the same BOM has the same serial number.
/// Name-based like a version 5 UUID, from SHA-256 rather than SHA-1; CycloneDX 1.6's
/// pattern admits versions 1 to 5 only, so the version nibble says 5.
fn serial_number(digest: &Digest) -> String {
    let mut bytes: [u8; 16] = digest.as_bytes()[..16].try_into().expect("16 of 32 bytes");
    bytes[6] = (bytes[6] & 0x0f) | 0x50;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn component(package: &Package, inventory: &Inventory) -> Value {
    let mut object = Map::new();
    let mut set = |key: &str, value: Value| {
        object.insert(key.to_string(), value);
    };
    set("bom-ref", package.id.clone().into());
    set(
        "type",
        if package.role == Role::Image {
            "container"
        } else {
            "library"
        }
        .into(),
    );
    set("name", package.name.clone().into());
    if let Some(version) = &package.version {
        set("version", version.clone().into());
    }
    if package.role != Role::Image {
        let scope = if package.role.in_image() {
            "required"
        } else {
            "excluded"
        };
        set("scope", scope.into());
    }
    if let Some(summary) = &package.summary {
        set("description", summary.clone().into());
    }
    if let Some(supplier) = &package.supplier {
        let name = supplier.strip_prefix("Organization: ").unwrap_or(supplier);
        set("supplier", json!({"name": name}));
    }
    if let Some(sha256) = &package.sha256 {
        set(
            "hashes",
            json!([{"alg": "SHA-256", "content": sha256.hex()}]),
        );
    }
    if let Some(license) = &package.license {
        set("licenses", json!([{"expression": license}]));
    }
    if let Some(purl) = &package.purl {
        set("purl", purl.clone().into());
    }
    if let Some(url) = &package.download {
        set(
            "externalReferences",
            json!([{"type": "distribution", "url": url}]),
        );
    }
    let properties = properties(package, inventory);
    if !properties.is_empty() {
        set("properties", properties.into());
    }
    Value::Object(object)
}

/// The package's facts, then its relationships other than the image's CONTAINS.
fn properties(package: &Package, inventory: &Inventory) -> Vec<Value> {
    let property =
        |key: &str, value: &str| json!({"name": format!("{FACT_PREFIX}{key}"), "value": value});
    let mut properties: Vec<Value> = package
        .facts
        .iter()
        .map(|fact| property(fact.key, &fact.value))
        .collect();
    for edge in inventory.edges.iter().filter(|e| e.from == package.id) {
        let key = match edge.relation {
            Relation::Contains => continue,
            Relation::ExpandedFromArchive => "expanded-from-ref",
            Relation::GeneratedFrom => "generated-from-ref",
            Relation::BuildDependencyOf => "build-dependency-of-ref",
        };
        properties.push(property(key, &edge.to));
    }
    properties
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_have_the_uuid_shape_cyclonedx_requires() {
        let serial = serial_number(&Digest::of_bytes(b"bom"));
        let pattern = regex::Regex::new(
            "^urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
        )
        .unwrap();
        assert!(pattern.is_match(&serial), "{serial}");
        assert_eq!(serial, serial_number(&Digest::of_bytes(b"bom")));
    }
}
