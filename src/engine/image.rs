//! An image the daemon holds, read as `inspect` and `check` read one from a layout or a
//! registry: its config (the daemon's inspect answer in the OCI config's shape: the same
//! `config` keys, the layers' diff_ids, platform and date) and the digests it is known by.
//!
//! What the daemon does not keep is not made up: Docker's classic image store keeps no
//! manifest for a loaded image, so its manifest digest is known only when the daemon says
//! it (`Descriptor`, API 1.48+ with the containerd image store; `RepoDigests` may name an
//! index, so it is not taken for one); the containerd store's image ID is not the config's
//! digest; and no daemon keeps signatures or an SBOM beside an image.

use crate::digest::Digest;

use super::{status_of, Engine, EngineError};

/// The keys of the daemon's `Config` that the OCI image config has under the same names.
const CONFIG_KEYS: &[&str] = &[
    "User",
    "ExposedPorts",
    "Env",
    "Entrypoint",
    "Cmd",
    "Volumes",
    "WorkingDir",
    "Labels",
    "StopSignal",
];

/// One image of the daemon.
#[derive(Debug, Clone)]
pub struct DaemonImage {
    /// The digest of its config: the image ID in the classic store; None in the containerd
    /// store, whose ID is the manifest's or the index's.
    pub config_digest: Option<Digest>,
    /// The manifest digest the daemon knows the image by, when it says (`Descriptor`).
    pub manifest_digest: Option<Digest>,
    pub config: oci_spec::image::ImageConfiguration,
}

impl Engine {
    /// The image `reference` (`name:tag` or an ID), or [`EngineError::NoSuchImage`].
    pub async fn image(&self, reference: &str) -> Result<DaemonImage, EngineError> {
        let inspect = match self.docker.inspect_image(reference).await {
            Ok(inspect) => inspect,
            Err(error) if status_of(&error) == Some(404) => {
                return Err(EngineError::NoSuchImage {
                    image: reference.to_string(),
                })
            }
            Err(source) => {
                return Err(EngineError::Api {
                    what: format!("inspecting image `{reference}`"),
                    source,
                })
            }
        };
        let unreadable = |what: String| EngineError::Unreadable {
            image: reference.to_string(),
            what,
        };
        let answer = serde_json::to_value(&inspect).map_err(|e| unreadable(e.to_string()))?;
        let id: Digest = inspect
            .id
            .as_deref()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| unreadable("its Id is not a sha256 digest".into()))?;
        // The classic store names an image by its config; the containerd store by the
        // manifest or index it was pulled or loaded as (and then says so in Descriptor).
        let by_config = inspect.descriptor.is_none() && !self.info().await?.containerd_image_store;
        let manifest_digest = inspect
            .descriptor
            .as_ref()
            .filter(|d| d.media_type.as_deref().is_some_and(is_image_manifest))
            .and_then(|d| d.digest.as_deref())
            .and_then(|digest| digest.parse().ok());
        let config = serde_json::from_value(oci_config(&answer))
            .map_err(|e| unreadable(format!("its config does not read as an OCI config: {e}")))?;
        Ok(DaemonImage {
            config_digest: by_config.then_some(id),
            manifest_digest,
            config,
        })
    }
}

fn is_image_manifest(media_type: &str) -> bool {
    media_type == "application/vnd.oci.image.manifest.v1+json"
        || media_type == "application/vnd.docker.distribution.manifest.v2+json"
}

/// The OCI config's JSON from the daemon's inspect answer (`docker image inspect`).
fn oci_config(answer: &serde_json::Value) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let text = |key: &str| answer.get(key).filter(|v| v.is_string()).cloned();
    let mut config = Map::new();
    if let Some(Value::Object(daemon)) = answer.get("Config") {
        for key in CONFIG_KEYS {
            if let Some(value) = daemon.get(*key).filter(|v| !v.is_null()) {
                config.insert((*key).to_string(), value.clone());
            }
        }
    }
    let diff_ids = answer
        .pointer("/RootFS/Layers")
        .cloned()
        .unwrap_or_else(|| json!([]));
    let mut image = Map::new();
    for (oci, daemon) in [
        ("architecture", "Architecture"),
        ("os", "Os"),
        ("variant", "Variant"),
        ("created", "Created"),
        ("author", "Author"),
    ] {
        if let Some(value) = text(daemon).filter(|v| v.as_str() != Some("")) {
            image.insert(oci.to_string(), value);
        }
    }
    image.insert("config".into(), Value::Object(config));
    image.insert(
        "rootfs".into(),
        json!({ "type": "layers", "diff_ids": diff_ids }),
    );
    Value::Object(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_answer_reads_as_the_oci_config() {
        // Docker 20.10's answer for an image, trimmed: the keys OCI does not have are left.
        let answer = serde_json::json!({
            "Id": "sha256:aa",
            "Architecture": "amd64",
            "Os": "linux",
            "Created": "2024-01-01T00:00:00Z",
            "Author": "",
            "Config": {
                "Hostname": "", "AttachStdin": false, "Image": "",
                "Env": ["PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.1"],
                "Cmd": ["python3"], "Entrypoint": null, "WorkingDir": "",
                "Labels": { "io.cudastack.recipe": "torch" }
            },
            "RootFS": { "Type": "layers", "Layers": ["sha256:01", "sha256:02"] }
        });
        let config: oci_spec::image::ImageConfiguration =
            serde_json::from_value(oci_config(&answer)).unwrap();
        let inner = config.config().clone().unwrap();
        assert_eq!(
            inner.labels().as_ref().unwrap()["io.cudastack.recipe"],
            "torch"
        );
        assert_eq!(inner.env().as_ref().unwrap().len(), 2);
        assert_eq!(config.rootfs().diff_ids(), &["sha256:01", "sha256:02"]);
        assert_eq!(config.created().as_deref(), Some("2024-01-01T00:00:00Z"));
        assert_eq!(config.author(), &None);
    }
}
