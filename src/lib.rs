//! cudastack: reproducible, verified container images for GPU deep learning.
//!
//! The modules follow the data flow of a build (see DESIGN.md):
//! recipe -> matrix -> fetch/lock -> layer -> oci -> outputs -> verify.
pub mod atomic_file;
pub mod audit;
pub mod canonical;
pub mod cas;
pub mod cluster;
pub mod digest;
pub mod doctor;
pub mod elf;
pub mod engine;
pub mod fetch;
pub mod host;
pub mod install;
pub mod layer;
pub mod lock;
pub mod matrix;
pub mod names;
pub mod oci;
pub mod pipeline;
pub mod platform;
pub mod probe;
pub mod recipe;
pub mod reference;
pub mod registry;
pub mod rootfs;
pub mod stack;
pub mod verify;
pub mod version;
