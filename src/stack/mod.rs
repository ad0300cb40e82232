//! The assemblers: turn a validated, locked recipe into the layers of a CUDA stack, in
//! the order that lets images share prefixes: base -> CUDA toolkit -> cuDNN -> Python
//! wheels -> config.
pub mod base;
pub mod build;
pub mod config;
pub mod foreign_base;
pub mod inputs;
pub mod ldcache;
pub mod toolkit;
