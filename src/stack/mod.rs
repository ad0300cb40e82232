//! The assemblers: turn a validated, locked recipe into the layers of a CUDA stack, in
//! the order that lets images share prefixes: base -> CUDA toolkit -> cuDNN -> Python
//! wheels -> config.
//!
//! [`build`] is the stage's entry point and reads as its steps: [`prepare`] each platform's
//! inputs (lock, wheels, arch list), plan the [`layers`] (one file per layer kind),
//! [`produce`] them through the layer cache and the [`staging`] area, audit, and write the
//! [`output`]. The mechanics the layer kinds use live beside them: [`base`] and
//! [`foreign_base`] (mmdebstrap roots), [`toolkit`] (wheels -> NVIDIA's layout), [`config`]
//! (environment and labels) and [`ldcache`] (the loader cache writer).
pub mod base;
pub mod build;
pub mod cache_dir;
pub mod config;
pub mod dockerignore;
mod error;
pub mod foreign_base;
mod layers;
pub mod ldcache;
mod output;
mod prepare;
mod produce;
mod report;
pub mod rootless;
mod settings;
pub mod source_build;
mod staging;

pub(crate) use staging::hold_builds_lock;
pub mod toolkit;
mod tree_diff;
