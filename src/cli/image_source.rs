//! Shared by check and verify: reading an image's documents and the verifications signed
//! about it, wherever it lives (the library's [`ImageSource`],
//! resolved from the arguments by `cli/args.rs`), on the run's runtime; and detecting the
//! local node.

use cudastack::digest::Digest;
use cudastack::pipeline::image_source::{self, ImageSource};
use cudastack::pipeline::signed::{self, SignedVerifications};
use cudastack::sign::key::PublicKey;
use cudastack::verify::check::Node;
use cudastack::verify::source::ImageDocuments;

use super::{Async, Printer};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The documents of the image at `source`; of `platform`'s image when it names a
/// multi-platform image (default: this machine's platform).
pub fn read_documents(
    source: ImageSource,
    platform: Option<cudastack::recipe::Platform>,
    runtime: &Async,
) -> Result<ImageDocuments, Error> {
    runtime.block_on(image_source::read_documents(source, platform))
}

/// The verifications `key` signed about the manifest `subject` at `source`, and the
/// bundles left unread; the budget's line, when it ran out, goes to stderr.
pub fn signed_verifications(
    source: ImageSource,
    subject: &Digest,
    key: &PublicKey,
    runtime: &Async,
    printer: &Printer,
) -> Result<SignedVerifications, Error> {
    let signed = runtime.block_on(signed::signed_verifications(source, subject, key))?;
    warn_over_budget(&signed.over_budget, printer);
    Ok(signed)
}

fn warn_over_budget(over_budget: &Option<String>, printer: &Printer) {
    if let Some(line) = over_budget {
        printer.status(format!("warning: {line}"));
    }
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
