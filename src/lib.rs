//! cudastack: reproducible, verified container images for GPU deep learning.
//!
//! The modules follow the data flow of a build, in groups, and a module imports only
//! modules of its own group or of the groups above it, with no cycle (docs/architecture.md
//! has the picture and a paragraph per module): shared vocabulary, the cache directory, then the inputs (recipe -> matrix -> fetch -> lock), the host's
//! driver and GPUs as read (host: verification compares a report with them), the content
//! (elf, install, audit, layer, probe), the assembly (stack) and the image (oci), the
//! source builds (on the assembly's stagers), the outputs (engine, registry) and the proof
//! (verify), their composition (pipeline), and
//! the cluster and diagnosis tools. The binary (src/cli) parses arguments and prints.

// Shared vocabulary.
pub mod atomic_file;
pub mod canonical;
pub mod contained_file;
pub mod digest;
pub mod elf;
pub mod labels;
pub mod names;
pub mod net;
pub mod platform;
pub mod printable;
pub mod reference;
pub mod rootfs;
pub mod target_gpu;
pub mod version;

// The cache directory, below every stage that keeps bytes on disk.
pub mod cache;

// Inputs.
pub mod apt;
pub mod fetch;
pub mod lock;
pub mod matrix;
pub mod recipe;

// The host: its driver and GPUs as read (what verification compares a report with).
pub mod host;

// Content.
pub mod audit;
pub mod install;
pub mod layer;
pub mod probe;

// Assembly and the image.
pub mod base_root;
pub mod oci;
pub mod stack;

// Source builds: an input of the assembly, made in a builder staged with its stagers.
pub mod source_build;

// Outputs and proof.
pub mod attest;
pub mod engine;
pub mod pipeline;
pub mod registry;
pub mod sbom;
pub mod sign;
pub mod verify;

// Clusters and diagnosis.
pub mod cluster;
pub mod doctor;
