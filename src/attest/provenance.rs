//! SLSA v1 build provenance of an image: who built it (cudastack and its version), from
//! what (the recipe and lock digests, every locked artifact by URL and sha256), how (the
//! settings that decide the bytes), and what came out (the layers by diff_id).
//! <https://slsa.dev/spec/v1.0/provenance>
//!
//! A cudastack build is a function of the recipe and its lock: the same inputs give the
//! same layers and manifest digest (SOURCE_DATE_EPOCH, canonical tar, a pinned encoder).
//! `internalParameters.reproducible` says which settings that rests on, so a verifier can
//! rebuild and compare digests. The provenance itself is deterministic too (no start and
//! finish times): a rebuild of the same image states the same thing, and a signature of it
//! stays valid.

use serde_json::{json, Value};

pub use super::git_source::GitSource;
use crate::digest::Digest;
use crate::lock::Lockfile;
use crate::stack::LayerReport;

/// The predicate type of SLSA v1 provenance.
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
/// What kind of build this is: documented in docs/security.md.
pub const BUILD_TYPE: &str = "https://cudastack.dev/build/v1";
/// The builder's id.
pub const BUILDER_ID: &str = "https://github.com/cudastack/cudastack";

/// What one platform's build was made from and with.
pub struct BuildFacts<'a> {
    /// The recipe as given on the command line.
    pub recipe_path: &'a str,
    pub lock: &'a Lockfile,
    /// `linux/amd64`.
    pub platform: &'a str,
    /// The layer compression (`{"codec": "gzip", "level": 1}`) and its encoder identity.
    pub compression: Value,
    pub encoder: String,
    pub source_date_epoch: u64,
    pub layers: &'a [LayerReport],
    /// The git commit the recipe was built from, when its directory is a checkout.
    pub source: Option<&'a GitSource>,
}

/// The digest of a lock: sha256 of its canonical text (what `cudastack lock` writes).
pub fn lock_digest(lock: &Lockfile) -> Digest {
    Digest::of_bytes(lock.to_json().as_bytes())
}

/// The recipe's git commit as SLSA names a source (`git+URL@REF`, `gitCommit`), with the
/// recipe's path inside the checkout.
fn source_dependency(source: &GitSource) -> Value {
    let uri = match (&source.repository, &source.reference) {
        (Some(repository), Some(reference)) => Some(format!("git+{repository}@{reference}")),
        (Some(repository), None) => Some(format!("git+{repository}")),
        (None, _) => None,
    };
    let mut dependency = json!({
        "name": "recipe source",
        "digest": {"gitCommit": source.commit},
        "annotations": {"kind": "git", "path": source.path},
    });
    if let Some(uri) = uri {
        dependency["uri"] = Value::String(uri);
    }
    dependency
}

/// The SLSA v1 provenance predicate of one platform's image.
pub fn predicate(facts: &BuildFacts) -> Value {
    let resolved: Vec<Value> = facts
        .source
        .map(source_dependency)
        .into_iter()
        .chain(facts.lock.artifacts.iter().map(|artifact| {
            json!({
                "name": format!("{} {}", artifact.name, artifact.version),
                "annotations": {"kind": artifact.kind},
                "uri": artifact.url.to_string(),
                "digest": {"sha256": artifact.sha256.hex()},
            })
        }))
        .collect();
    let byproducts: Vec<Value> = facts
        .layers
        .iter()
        .map(|layer| {
            json!({
                "name": format!("layer {}", layer.name),
                "digest": {"sha256": layer.digest.hex()},
                "annotations": {"diffId": layer.diff_id.to_string(), "cached": layer.cached},
            })
        })
        .collect();
    json!({
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "recipe": {
                    "path": facts.recipe_path,
                    "digest": {"sha256": facts.lock.recipe_digest.hex()},
                },
                "lock": {"digest": {"sha256": lock_digest(facts.lock).hex()}},
                "platform": facts.platform,
                "compression": facts.compression,
            },
            "internalParameters": {
                "reproducible": {
                    "sourceDateEpoch": facts.source_date_epoch,
                    "layerEncoder": facts.encoder,
                    "how": "the same recipe and lock, built with the same cudastack version, give the same layers and manifest digest: rebuild and compare",
                },
                "lockTarget": facts.lock.target,
            },
            "resolvedDependencies": resolved,
        },
        "runDetails": {
            "builder": {
                "id": BUILDER_ID,
                "version": {"cudastack": env!("CARGO_PKG_VERSION")},
            },
            "byproducts": byproducts,
        },
    })
}
