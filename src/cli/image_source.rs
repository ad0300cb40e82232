//! Shared by inspect, check and verify: the image a person named (a layout or a registry
//! reference, with the registry's credentials) as the library's [`ImageSource`], read
//! through `cudastack::pipeline::image_source`; and detecting the local node.

use cudastack::pipeline::image_source::{self, ImageSource};
use cudastack::registry::Reference;
use cudastack::verify::check::Node;
use cudastack::verify::source::{ImageDocuments, ImageLocation};

pub use super::push::RegistryArgs;
use super::Printer;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The documents of the image at `location`; of `platform`'s image when it names a
/// multi-platform image (default: this machine's platform).
pub fn read_documents(
    location: &ImageLocation,
    registry: &RegistryArgs,
    platform: Option<cudastack::recipe::Platform>,
) -> Result<ImageDocuments, Error> {
    let source = source(location, registry)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(image_source::read_documents(source, platform))?)
}

/// The referrers of `types` (SBOM, provenance, statements, reports) of the manifest
/// `subject` at `location`, within the per-image budget; when the budget ran out, the line
/// saying so (registry, image, limit) goes to stderr.
pub fn read_referrers(
    location: &ImageLocation,
    registry: &RegistryArgs,
    subject: &cudastack::digest::Digest,
    types: cudastack::registry::referrers::ArtifactTypes<'_>,
    printer: &Printer,
) -> Result<image_source::ReadReferrers, Error> {
    let source = source(location, registry)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let read = runtime.block_on(image_source::read_referrers(source, subject, types))?;
    if let Some(line) = &read.over_budget {
        printer.status(format!("warning: {line}"));
    }
    Ok(read)
}

fn source(location: &ImageLocation, registry: &RegistryArgs) -> Result<ImageSource, Error> {
    Ok(match location {
        ImageLocation::Layout { dir, ref_name } => ImageSource::Layout {
            dir: dir.clone(),
            ref_name: ref_name.clone(),
        },
        ImageLocation::Registry(text) => {
            let reference: Reference = text.parse()?;
            let client = Box::new(registry.client_options(&reference)?);
            ImageSource::Registry { reference, client }
        }
    })
}

/// The help of a `--platform` option whose default is this machine's platform: `what`, then
/// the default as it is on the machine showing the help (`linux/arm64` on a Grace node).
/// A clap `[default: linux/amd64]` beside "this machine's" read as a fixed value;
/// the help says where the default comes from and what it is here.
pub fn platform_help(what: &str) -> String {
    let default = cudastack::recipe::Platform::host_or_amd64();
    match cudastack::recipe::Platform::host() {
        Some(_) => format!("{what}; default: this machine's platform ({default} here)."),
        None => format!(
            "{what}; default: {default} (this machine's architecture is not one cudastack \
             builds images for)."
        ),
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
