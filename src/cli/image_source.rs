//! Shared by inspect, check and verify: reading an image's documents (manifest and config,
//! never a layer) from a layout or a registry, and detecting the local node.

use cudastack::registry::{Platform, Reference, RegistryClient};
use cudastack::verify::check::Node;
use cudastack::verify::source::{read_layout, ImageDocuments, ImageLocation};

pub use super::push::RegistryArgs;
use super::Printer;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Configs are small JSON documents; refuse anything that is not.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The documents of the image at `location`; of `platform`'s image when it names a
/// multi-platform image (default: this machine's platform).
pub fn read_documents(
    location: &ImageLocation,
    registry: &RegistryArgs,
    platform: Option<cudastack::recipe::Platform>,
) -> Result<ImageDocuments, Error> {
    let platform = platform.or_else(cudastack::stack::build::host_platform);
    let architecture = platform.map(|p| p.to_oci_arch());
    match location {
        ImageLocation::Layout { dir, ref_name } => {
            Ok(read_layout(dir, ref_name, architecture.as_ref())?)
        }
        ImageLocation::Registry(text) => {
            let reference: Reference = text.parse()?;
            let client = RegistryClient::new(&reference, registry.client_options(&reference)?)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let wanted = platform.map_or_else(Platform::default, Platform::from);
                let manifest = client.get_image_manifest(&reference, &wanted).await?;
                let parsed: oci_spec::image::ImageManifest =
                    serde_json::from_slice(&manifest.bytes)?;
                let config_digest: cudastack::digest::Digest =
                    parsed.config().digest().to_string().parse()?;
                let config_bytes = client
                    .get_blob_bytes(reference.repository(), &config_digest, MAX_CONFIG_BYTES)
                    .await?;
                Ok(ImageDocuments {
                    location: reference.to_string(),
                    manifest_digest: manifest.digest,
                    config_digest,
                    config: serde_json::from_slice(&config_bytes)?,
                    bytes_read: (manifest.bytes.len() + config_bytes.len()) as u64,
                })
            })
        }
    }
}

/// Add this machine's driver and GPUs (libcuda, NVML, /proc, nvidia-smi; see src/host) to
/// `node`; GPUs whose compute capability no source gave are looked up by name in the matrix.
pub fn detect_node(node: &mut Node, printer: &Printer) -> Result<(), Error> {
    use cudastack::verify::check::NodeGpu;
    let report = cudastack::host::driver::detect(&cudastack::host::HostRoot::live());
    match &report.driver_version {
        Some(version) => {
            if node.driver.is_none() {
                node.driver = Some(version.clone());
            }
        }
        None => printer.status(
            "--detect: no NVIDIA driver on this machine (no kernel module, libcuda or nvidia-smi)",
        ),
    }
    let matrix = cudastack::matrix::Matrix::embedded();
    for gpu in &report.gpus {
        let cc = gpu
            .cc
            .or_else(|| matrix.gpu(&gpu.name).map(|known| known.cc));
        match cc {
            Some(compute_capability) => node.gpus.push(NodeGpu {
                name: gpu.name.clone(),
                compute_capability,
            }),
            None => printer.status(format!(
                "--detect: compute capability of `{}` unknown; give it with --cc",
                gpu.name
            )),
        }
    }
    Ok(())
}
