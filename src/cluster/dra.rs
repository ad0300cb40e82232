//! Placement through Dynamic Resource Allocation: a ResourceClaimTemplate whose CEL
//! selector admits a device of NVIDIA's DRA driver (`gpu.nvidia.com`) only when it is a
//! verified product with a driver at or above the image's floor.
//!
//! The driver publishes, per GPU, the attributes `productName` (NVML's name, as the probe
//! recorded it), `cudaComputeCapability` (`9.0.0`) and `driverVersion` (`550.54.15`), both
//! semantic versions, among others (`architecture`, `brand`, ...). Version attributes are compared with the
//! `semver` library of Kubernetes' DRA CEL environment. The API group is GA as
//! `resource.k8s.io/v1` from Kubernetes 1.34; 1.33 serves `v1beta2` (same shape) and 1.32
//! `v1beta1` (a request without `exactly`).

use std::str::FromStr;

use serde::Serialize;

use super::placement::{cel_string, Placement};
use super::{is_dns_label, to_yaml, ClusterError};

/// The DeviceClass and attribute domain of NVIDIA's DRA driver for GPUs.
pub const NVIDIA_GPU_CLASS: &str = "gpu.nvidia.com";

/// Which `resource.k8s.io` version to write, from the cluster's Kubernetes minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceApi {
    V1beta1,
    V1beta2,
    V1,
}

impl ResourceApi {
    /// The version a cluster of Kubernetes `1.minor` serves by default.
    pub fn for_kubernetes(minor: u32) -> Result<ResourceApi, ClusterError> {
        match minor {
            0..=31 => Err(ClusterError::Invalid {
                field: "Kubernetes version",
                value: format!("1.{minor}"),
                rule: "DRA with structured parameters needs Kubernetes 1.32 or newer (GA in 1.34); on older clusters place by node affinity (the default)",
            }),
            32 => Ok(ResourceApi::V1beta1),
            33 => Ok(ResourceApi::V1beta2),
            _ => Ok(ResourceApi::V1),
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            ResourceApi::V1beta1 => "resource.k8s.io/v1beta1",
            ResourceApi::V1beta2 => "resource.k8s.io/v1beta2",
            ResourceApi::V1 => "resource.k8s.io/v1",
        }
    }
}

/// A Kubernetes version as `--kube-version` takes it: `1.34` or `1.34.1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubernetesVersion {
    pub minor: u32,
}

impl Default for KubernetesVersion {
    fn default() -> Self {
        KubernetesVersion { minor: 34 }
    }
}

impl FromStr for KubernetesVersion {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut parts = text.trim_start_matches('v').split('.');
        match (parts.next(), parts.next().map(str::parse::<u32>)) {
            (Some("1"), Some(Ok(minor))) => Ok(KubernetesVersion { minor }),
            _ => Err(format!(
                "`{text}` is not a Kubernetes version: expected 1.MINOR, e.g. 1.34"
            )),
        }
    }
}

/// The CEL expression admitting a device of `placement`: NVIDIA's driver, a verified
/// product with the compute capability it was verified with, a driver version at or above
/// the floor. A device without one of these attributes is an evaluation error for that
/// device, which the scheduler counts as not matching.
pub fn device_selector(placement: &Placement) -> String {
    let attribute =
        |name: &str| format!("device.attributes[{}].{name}", cel_string(NVIDIA_GPU_CLASS));
    let products: Vec<String> = placement
        .products
        .iter()
        .map(|p| {
            format!(
                "({} == {} && {}.compareTo(semver(\"{}.{}.0\")) == 0)",
                attribute("productName"),
                cel_string(&p.name),
                attribute("cudaComputeCapability"),
                p.compute_capability.major,
                p.compute_capability.minor,
            )
        })
        .collect();
    format!(
        "device.driver == {driver} && ({products}) && {version}.compareTo(semver({floor})) >= 0",
        driver = cel_string(NVIDIA_GPU_CLASS),
        products = products.join(" || "),
        version = attribute("driverVersion"),
        floor = cel_string(&placement.floor_semver()),
    )
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClaimTemplate<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata<'a>,
    spec: TemplateSpec,
}

#[derive(Serialize)]
struct Metadata<'a> {
    name: &'a str,
    namespace: &'a str,
}

#[derive(Serialize)]
struct TemplateSpec {
    spec: ClaimSpec,
}

#[derive(Serialize)]
struct ClaimSpec {
    devices: Devices,
}

#[derive(Serialize)]
struct Devices {
    requests: Vec<Request>,
}

/// v1 and v1beta2 put the device's class, selectors and count under `exactly`; v1beta1
/// has them on the request itself.
#[derive(Serialize)]
struct Request {
    name: &'static str,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    flat: Option<ExactRequest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exactly: Option<ExactRequest>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExactRequest {
    device_class_name: &'static str,
    allocation_mode: &'static str,
    count: u32,
    selectors: Vec<Selector>,
}

#[derive(Serialize)]
struct Selector {
    cel: Cel,
}

#[derive(Serialize)]
struct Cel {
    expression: String,
}

/// The name of the request the pod's containers refer to (`resources.claims`).
pub const REQUEST_NAME: &str = "gpus";

/// A ResourceClaimTemplate `name` in `namespace` asking for `count` GPUs of `placement`.
pub fn claim_template(
    name: &str,
    namespace: &str,
    count: u32,
    placement: &Placement,
    api: ResourceApi,
) -> Result<String, ClusterError> {
    if !is_dns_label(name) || !is_dns_label(namespace) || count == 0 {
        return Err(ClusterError::Invalid {
            field: "ResourceClaimTemplate",
            value: format!("{namespace}/{name} x{count}"),
            rule: "RFC 1123 names and at least one GPU",
        });
    }
    let exact = ExactRequest {
        device_class_name: NVIDIA_GPU_CLASS,
        allocation_mode: "ExactCount",
        count,
        selectors: vec![Selector {
            cel: Cel {
                expression: device_selector(placement),
            },
        }],
    };
    let (flat, exactly) = match api {
        ResourceApi::V1beta1 => (Some(exact), None),
        ResourceApi::V1beta2 | ResourceApi::V1 => (None, Some(exact)),
    };
    let template = ClaimTemplate {
        api_version: api.api_version(),
        kind: "ResourceClaimTemplate",
        metadata: Metadata { name, namespace },
        spec: TemplateSpec {
            spec: ClaimSpec {
                devices: Devices {
                    requests: vec![Request {
                        name: REQUEST_NAME,
                        flat,
                        exactly,
                    }],
                },
            },
        },
    };
    to_yaml(&template, "the ResourceClaimTemplate")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::placement::tests::{claims, row};
    use crate::verify::check::Lineage;

    fn placement() -> Placement {
        Placement::new(
            &claims(Some("535.104.05"), Lineage::Unrecorded),
            &[
                row("NVIDIA H100 80GB HBM3", "9.0"),
                row("NVIDIA A100-SXM4-80GB", "8.0"),
            ],
        )
        .unwrap()
    }

    #[test]
    fn the_selector_names_each_product_with_its_capability_and_the_floor_as_a_semver() {
        assert_eq!(
            device_selector(&placement()),
            concat!(
                r#"device.driver == "gpu.nvidia.com" && ("#,
                r#"(device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB" && device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) == 0)"#,
                r#" || (device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3" && device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("9.0.0")) == 0)"#,
                r#") && device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("535.104.5")) >= 0"#
            )
        );
    }

    #[test]
    fn each_kubernetes_version_gets_the_api_it_serves() {
        let v1 = claim_template("t", "ml", 8, &placement(), ResourceApi::V1).unwrap();
        assert!(v1.starts_with("apiVersion: resource.k8s.io/v1\n"), "{v1}");
        assert!(v1.contains("    exactly:\n"), "{v1}");
        let beta1 = claim_template("t", "ml", 8, &placement(), ResourceApi::V1beta1).unwrap();
        assert!(!beta1.contains("exactly"), "{beta1}");
        assert!(beta1.contains("deviceClassName: gpu.nvidia.com"), "{beta1}");
        assert_eq!(
            ResourceApi::for_kubernetes("1.33".parse::<KubernetesVersion>().unwrap().minor)
                .unwrap(),
            ResourceApi::V1beta2
        );
        assert!(ResourceApi::for_kubernetes(31).is_err());
        assert!("2.0".parse::<KubernetesVersion>().is_err());
    }
}
