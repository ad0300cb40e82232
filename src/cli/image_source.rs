//! Shared by inspect, check and verify: reading an image's documents from a layout or a
//! registry, and detecting the local node.

use clap::Args;
use cudastack::verify::check::Node;
use cudastack::verify::source::{read_layout, ImageDocuments, ImageLocation};

use super::Printer;

/// How to reach a registry.
#[derive(Debug, Args, Default)]
pub struct RegistryArgs {}

pub fn read_documents(
    location: &ImageLocation,
    _registry: &RegistryArgs,
) -> Result<ImageDocuments, Box<dyn std::error::Error + Send + Sync>> {
    match location {
        ImageLocation::Layout { dir, ref_name } => Ok(read_layout(dir, ref_name)?),
        ImageLocation::Registry(reference) => {
            Err(format!("registry reference {reference}: not wired yet").into())
        }
    }
}

pub fn detect_node(
    _node: &mut Node,
    _printer: &Printer,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    Err("--detect: not wired yet".into())
}
