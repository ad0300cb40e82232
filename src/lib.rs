//! cudastack: reproducible, verified container images for GPU deep learning.
//!
//! The modules follow the data flow of a build (see DESIGN.md):
//! recipe -> matrix -> fetch/lock -> layer -> oci -> outputs -> verify.
pub mod cas;
pub mod digest;
pub mod fetch;
pub mod lock;
