//! Wheel file names: the one definition is [`crate::names`] (shared vocabulary used by fetch,
//! lock and install); this path is kept so fetch's callers read as before.

pub use crate::names::{BuildTag, PackageName, Tag, WheelFilename, WheelFilenameError};
