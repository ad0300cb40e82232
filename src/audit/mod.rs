//! placeholder
pub mod rootfs;
