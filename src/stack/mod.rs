//! The assemblers: turn a validated, locked recipe into the layers of a CUDA stack, in
//! the order that lets images share prefixes: base -> CUDA toolkit -> cuDNN -> Python
//! wheels -> config.
//!
//! [`build`] is the stage's entry point and reads as its steps: [`prepare`] each platform's
//! inputs (lock, wheels, arch list), plan the [`layers`] (one module per layer kind, each
//! holding its stager and its mechanics: `layers::toolkit::layout` lays wheels out as
//! NVIDIA's installers do, `layers::copy::dockerignore` reads the build context's ignore
//! file), [`produce`] them through the layer cache and the cache's staging area, audit, and
//! write the [`output`] with its [`image_config`] (environment, labels, command). The base
//! root itself (mmdebstrap, foreign architectures, rootless builds, the loader cache writer)
//! is `crate::base_root`'s job.
pub mod build;
mod error;
mod files;
pub mod image_config;
pub mod layers;
mod output;
mod prepare;
mod produce;
mod report;
mod settings;
pub mod source_build;
mod tree_diff;
