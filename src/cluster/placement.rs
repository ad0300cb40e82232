//! Where a verified image may run: the GPU products it passed verification on, and the
//! driver floor it must not start below. Each scheduler is told the same answer in its own
//! words: Kubernetes node affinity over the labels GPU feature discovery sets
//! ([`super::k8s`]), a DRA CEL selector over the attributes NVIDIA's DRA driver publishes
//! ([`super::dra`]), Slurm features from a site's map ([`super::slurm`]).
//!
//! Only what was proven is admitted: a product is named by its verified row, never by a
//! compute capability (an H200 shares sm_90 with the H100 and was not verified by an H100
//! run), and a node whose driver is unknown, or below the floor, matches nothing.

use crate::verify::check::{ImageClaims, Lineage};
use crate::verify::record::VerifiedOn;
use crate::version::{ComputeCapability, DriverVersion};

use super::ClusterError;

/// A GPU product an image passed verification on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct VerifiedProduct {
    /// The name NVML reports and the probe recorded: `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub compute_capability: ComputeCapability,
}

impl VerifiedProduct {
    /// The value of the node label `nvidia.com/gpu.product` for this GPU: GPU feature
    /// discovery joins the NVML name's words with `-` (`NVIDIA-H100-80GB-HBM3`). A node
    /// shared by time-slicing (`…-SHARED`) or split by MIG (`…-MIG-1g.10gb`) has another
    /// value, and is not the product that was verified.
    pub fn node_label(&self) -> String {
        self.name.split_whitespace().collect::<Vec<_>>().join("-")
    }
}

/// The verified GPU products and the driver floor of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Sorted by name, each once.
    pub products: Vec<VerifiedProduct>,
    pub driver_floor: DriverVersion,
}

impl Placement {
    /// The placement of an image from its claims: the rows of its verified matrix (its
    /// labels, or with a key the rows of its signed verifications, `rows`) and its driver
    /// floor. Refused when nothing was verified, the floor is missing, or the claims do not
    /// describe the image's layers.
    pub fn new(claims: &ImageClaims, rows: &[VerifiedOn]) -> Result<Placement, ClusterError> {
        let refuse = |why: String, hint: &str| ClusterError::Unplaceable {
            why,
            hint: hint.to_string(),
        };
        match claims.lineage {
            Lineage::Derived { added, .. } => {
                return Err(refuse(
                    format!("the image derives from a cudastack image ({added} layer(s) added by another tool): its verified matrix is its base's"),
                    "verify this image itself (`cudastack verify`), then place the verified image",
                ))
            }
            Lineage::Mismatched => {
                return Err(refuse(
                    "the image's io.cudastack labels were written for other layers, so its verified matrix does not describe it".to_string(),
                    "place the image cudastack built and verified",
                ))
            }
            Lineage::Built { .. } | Lineage::Unrecorded => {}
        }
        let Some(driver_floor) = claims.driver_floor.clone() else {
            return Err(refuse(
                "the image declares no driver floor (io.cudastack.driver-floor), so no node's driver can be compared with it".to_string(),
                "build the image with cudastack from a recipe (its stack's `driver_floor`)",
            ));
        };
        let mut products = Vec::new();
        for row in rows {
            let compute_capability = row.compute_capability.parse().map_err(|_| {
                refuse(
                    format!(
                        "a verified row names compute capability `{}` for {}",
                        row.compute_capability, row.gpu
                    ),
                    "verify the image again with this cudastack",
                )
            })?;
            let name = row.gpu.split_whitespace().collect::<Vec<_>>().join(" ");
            let product = VerifiedProduct {
                name,
                compute_capability,
            };
            // The matrix is the image's word (a label): a name no node label can carry is
            // not a GPU NVML reports, and is refused rather than written into a manifest.
            if !super::k8s::is_label_value(&product.node_label()) {
                return Err(refuse(
                    format!(
                        "a verified row names GPU `{}`, which is no GPU name NVML reports (a node label value: at most 63 letters, digits, `-`, `_`, `.`)",
                        crate::printable::escape(&row.gpu)
                    ),
                    "verify the image again with this cudastack",
                ));
            }
            products.push(product);
        }
        products.sort();
        products.dedup_by(|a, b| a.name == b.name);
        if products.is_empty() {
            return Err(refuse(
                "the image was verified on no GPU: there is no node class to admit".to_string(),
                "run its verification on each GPU type it must run on (`cudastack verify`, or `cudastack verify IMAGE --emit k8s-job` then `--from-log`) and place the verified image",
            ));
        }
        Ok(Placement {
            products,
            driver_floor,
        })
    }

    /// The floor as a semantic version (`535.104.05` -> `535.104.5`): the form of the
    /// `driverVersion` attribute NVIDIA's DRA driver publishes.
    pub fn floor_semver(&self) -> String {
        let [branch, minor, patch] = self.driver_floor.parts();
        format!("{branch}.{minor}.{patch}")
    }

    /// One line for humans: `NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB; driver >= 535.104.05`.
    pub fn summary(&self) -> String {
        let names: Vec<&str> = self.products.iter().map(|p| p.name.as_str()).collect();
        format!("{}; driver >= {}", names.join(", "), self.driver_floor)
    }
}

/// `text` as a CEL string literal, double-quoted with `\` and `"` escaped.
pub(crate) fn cel_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    pub(crate) fn row(gpu: &str, cc: &str) -> VerifiedOn {
        VerifiedOn {
            gpu: gpu.to_string(),
            compute_capability: cc.to_string(),
            count: 1,
            driver: "550.54.15".to_string(),
            cuda_driver: Some("12.4".to_string()),
            date: "2026-12-01T00:00:00Z".to_string(),
            cudastack: "0.1.0".to_string(),
            checks: BTreeMap::new(),
            report: "sha256:00".to_string(),
        }
    }

    pub(crate) fn claims(floor: Option<&str>, lineage: Lineage) -> ImageClaims {
        ImageClaims {
            driver_floor: floor.map(|f| f.parse().unwrap()),
            lineage,
            ..ImageClaims::default()
        }
    }

    #[test]
    fn products_are_the_verified_rows_once_each_with_their_node_label() {
        let rows = [
            row("NVIDIA H100 80GB HBM3", "9.0"),
            row("NVIDIA A100-SXM4-80GB", "8.0"),
            row("NVIDIA  H100 80GB HBM3", "9.0"),
        ];
        let placement =
            Placement::new(&claims(Some("535.104.05"), Lineage::Unrecorded), &rows).unwrap();
        let labels: Vec<String> = placement.products.iter().map(|p| p.node_label()).collect();
        assert_eq!(labels, ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]);
        assert_eq!(placement.floor_semver(), "535.104.5");
        assert_eq!(
            placement.summary(),
            "NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3; driver >= 535.104.05"
        );
    }

    #[test]
    fn unverified_floorless_and_derived_images_are_not_placed() {
        let rows = [row("NVIDIA H100 80GB HBM3", "9.0")];
        for (claims, rows, says) in [
            (
                claims(Some("550.54.15"), Lineage::Unrecorded),
                &[][..],
                "verified on no GPU",
            ),
            (
                claims(None, Lineage::Unrecorded),
                &rows[..],
                "no driver floor",
            ),
            (
                claims(Some("550.54.15"), Lineage::Derived { base: 9, added: 1 }),
                &rows[..],
                "derives from",
            ),
            (
                claims(Some("550.54.15"), Lineage::Mismatched),
                &rows[..],
                "other layers",
            ),
        ] {
            let error = Placement::new(&claims, rows).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
            assert!(error.contains("hint:"), "{error}");
        }
    }

    #[test]
    fn a_gpu_name_no_node_label_can_carry_is_refused() {
        for name in ["", "NVIDIA \"H100\" \n", &"A".repeat(64), "GPU (x)"] {
            let error = Placement::new(
                &claims(Some("550.54.15"), Lineage::Unrecorded),
                &[row(name, "9.0")],
            )
            .unwrap_err()
            .to_string();
            assert!(
                error.contains("no GPU name NVML reports"),
                "{name}: {error}"
            );
            assert!(
                !error.contains('\n') || error.matches('\n').count() == 1,
                "{error}"
            );
        }
    }

    #[test]
    fn cel_strings_are_escaped() {
        assert_eq!(cel_string(r#"a "b" \c"#), r#""a \"b\" \\c""#);
    }
}
