//! Is an image runnable by the runtimes clusters use (enroot/pyxis, Apptainer, the NVIDIA
//! container runtime under Kubernetes)? Read from the image's config and manifest alone,
//! so it answers before anything is pulled onto a cluster.
//!
//! The checks, and why each runtime needs them:
//! - NVIDIA_VISIBLE_DEVICES set: the NVIDIA container runtime and enroot's nvidia hook
//!   only inject GPUs into containers whose environment names devices.
//! - NVIDIA_DRIVER_CAPABILITIES with `compute` and `utility` (or `all`): without
//!   `compute` the hook mounts no libcuda; the default is `utility` alone.
//! - gzip layers: enroot before 4.0 pipes every layer through gzip and Apptainer's and
//!   Docker 20.10's importers predate zstd; uncompressed layers fail the same gzip pipe.
//! - at most [`MAX_LAYERS`] layers: Docker's layer store refuses deeper chains, and
//!   overlayfs-based importers have similar limits.
//! - NVIDIA_REQUIRE_CUDA (advisory): lets the runtime refuse a too-old driver up front.

use serde::Serialize;

use crate::oci::Image;

/// Docker's limit on chained layers (moby `layer/layer_store.go`, `maxLayerDepth = 125`:
/// "the 127 max in some graphdrivers plus the 2 additional layers used to create a
/// rwlayer"), the strictest of the runtimes clusters use.
pub const MAX_LAYERS: usize = 125;

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub ok: bool,
    /// Advisory checks never make an image "not ready".
    pub required: bool,
    pub detail: String,
}

/// All checks for one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    pub findings: Vec<Finding>,
}

impl Readiness {
    /// Every required check passed.
    pub fn is_ready(&self) -> bool {
        self.findings.iter().all(|f| f.ok || !f.required)
    }
    pub fn failures(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| !f.ok && f.required)
    }
}

fn env_value<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    // The last assignment wins, as in every runtime.
    env.iter()
        .rev()
        .find_map(|entry| entry.strip_prefix(name)?.strip_prefix('='))
}

/// Check `image` for cluster runtimes.
pub fn check(image: &Image) -> Readiness {
    let env: &[String] = image.runtime_config().env().as_deref().unwrap_or(&[]);
    let mut findings = Vec::new();

    let visible = env_value(env, "NVIDIA_VISIBLE_DEVICES");
    findings.push(Finding {
        check: "nvidia-visible-devices",
        ok: matches!(visible, Some(v) if !v.is_empty() && v != "void" && v != "none"),
        required: true,
        detail: match visible {
            Some(value) => format!("NVIDIA_VISIBLE_DEVICES={value}"),
            None => "NVIDIA_VISIBLE_DEVICES is not set: the NVIDIA runtime and enroot's hook will not inject GPUs".to_string(),
        },
    });

    let capabilities = env_value(env, "NVIDIA_DRIVER_CAPABILITIES");
    let has = |name: &str| {
        capabilities.is_some_and(|c| {
            c.split(',')
                .any(|cap| cap.trim() == name || cap.trim() == "all")
        })
    };
    findings.push(Finding {
        check: "nvidia-driver-capabilities",
        ok: has("compute") && has("utility"),
        required: true,
        detail: match capabilities {
            Some(value) if has("compute") && has("utility") => {
                format!("NVIDIA_DRIVER_CAPABILITIES={value}")
            }
            Some(value) => format!("NVIDIA_DRIVER_CAPABILITIES={value} lacks compute or utility: no libcuda or no nvidia-smi in the container"),
            None => "NVIDIA_DRIVER_CAPABILITIES is not set: runtimes default to `utility`, without libcuda".to_string(),
        },
    });

    let not_gzip: Vec<String> = image
        .layers()
        .iter()
        .filter(|layer| !layer.media_type.to_string().ends_with("gzip"))
        .map(|layer| format!("{} ({})", layer.digest, layer.media_type))
        .collect();
    findings.push(Finding {
        check: "gzip-layers",
        ok: not_gzip.is_empty(),
        required: true,
        detail: if not_gzip.is_empty() {
            format!("all {} layers are gzip", image.layers().len())
        } else {
            format!(
                "not gzip (enroot < 4.0, Apptainer and Docker < 23 cannot read them; rebuild with --compression gzip): {}",
                not_gzip.join(", ")
            )
        },
    });

    let count = image.layers().len();
    findings.push(Finding {
        check: "layer-count",
        ok: count <= MAX_LAYERS,
        required: true,
        detail: format!("{count} layers (limit {MAX_LAYERS})"),
    });

    let require = env_value(env, "NVIDIA_REQUIRE_CUDA");
    findings.push(Finding {
        check: "nvidia-require-cuda",
        ok: require.is_some(),
        required: false,
        detail: match require {
            Some(value) => format!("NVIDIA_REQUIRE_CUDA={value}"),
            None => "NVIDIA_REQUIRE_CUDA is not set: a too-old driver is only found at the first CUDA call".to_string(),
        },
    });
    Readiness { findings }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;
    use crate::layer::Layer;
    use oci_spec::image::MediaType;

    fn layer(n: u8, media_type: MediaType) -> Layer {
        Layer {
            digest: Digest::of_bytes(&[n]),
            diff_id: Digest::of_bytes(&[n, n]),
            size: 1,
            uncompressed_size: None,
            media_type,
            blob: "/nonexistent".into(),
        }
    }

    fn image(layers: usize, media_type: MediaType) -> Image {
        let mut image = Image::new(0);
        for n in 0..layers {
            image = image.with_layer(layer(n as u8, media_type.clone()), "test");
        }
        image
    }

    #[test]
    fn a_cudastack_shaped_image_is_ready() {
        let image = image(6, MediaType::ImageLayerGzip)
            .with_env("NVIDIA_VISIBLE_DEVICES", "all")
            .with_env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
            .with_env("NVIDIA_REQUIRE_CUDA", "cuda>=12.1");
        let readiness = check(&image);
        assert!(readiness.is_ready(), "{readiness:?}");
        assert!(readiness.findings.iter().all(|f| f.ok));
    }

    #[test]
    fn each_missing_piece_is_named() {
        let image = image(MAX_LAYERS + 1, MediaType::ImageLayerZstd)
            .with_env("NVIDIA_DRIVER_CAPABILITIES", "utility");
        let readiness = check(&image);
        assert!(!readiness.is_ready());
        let failed: Vec<&str> = readiness.failures().map(|f| f.check).collect();
        assert_eq!(
            failed,
            [
                "nvidia-visible-devices",
                "nvidia-driver-capabilities",
                "gzip-layers",
                "layer-count"
            ]
        );
        let advisory = readiness.findings.last().unwrap();
        assert!(!advisory.ok && !advisory.required);
    }

    #[test]
    fn all_capabilities_and_uncompressed_layers() {
        let image = image(1, MediaType::ImageLayer)
            .with_env("NVIDIA_VISIBLE_DEVICES", "all")
            .with_env("NVIDIA_DRIVER_CAPABILITIES", "all");
        let readiness = check(&image);
        let failed: Vec<&str> = readiness.failures().map(|f| f.check).collect();
        assert_eq!(failed, ["gzip-layers"]);
    }
}
