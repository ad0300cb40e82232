//! Which files of a staged tree are wheel members as they are: recorded by the stagers that
//! unpack wheels (the toolkit's and the Python layers), beside the tree, so that the
//! layer is written with those members' deflate data copied from the wheels instead of the
//! staged files compressed again ([`crate::layer::ZipMember`]).
//!
//! Only a member whose bytes are written unchanged is recorded: a renamed library is, a
//! generated file (RECORD, a console script) is not. The staged tree keeps every file, for
//! the audit and for the layers above that read it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layer::{LayerError, LayerPath, ZipMember};
use crate::stack::error::BuildError;
use crate::stack::files::write_record;

/// Layer path (`usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudnn.so.9.1.0`) -> the
/// wheel member whose bytes it is.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WheelMembers(BTreeMap<String, WheelMember>);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WheelMember {
    wheel: PathBuf,
    member: String,
}

impl WheelMembers {
    /// The file at `path` (relative to the tree's root, or an image path) is `member` of
    /// `wheel`; a later file at the same path replaces the record, as it replaces the file.
    pub fn insert(&mut self, path: &str, wheel: &Path, member: &str) {
        self.0.insert(
            path.trim_start_matches('/').to_string(),
            WheelMember {
                wheel: wheel.to_path_buf(),
                member: member.to_string(),
            },
        );
    }

    /// The file at `path` is no longer a member as it is.
    pub fn remove(&mut self, path: &str) {
        self.0.remove(path.trim_start_matches('/'));
    }

    /// The record beside the staged tree `dir`.
    pub fn record_path(dir: &Path) -> PathBuf {
        dir.with_extension("members.json")
    }

    pub fn write(&self, dir: &Path) -> Result<(), BuildError> {
        let bytes = serde_json::to_vec(self).expect("a map of strings serialises");
        write_record(&Self::record_path(dir), &bytes)
    }

    pub fn read(dir: &Path) -> Result<Self, LayerError> {
        let path = Self::record_path(dir);
        let io = |source| LayerError::Io {
            path: path.clone(),
            source,
        };
        let bytes = std::fs::read(&path).map_err(io)?;
        serde_json::from_slice(&bytes).map_err(|e| io(e.into()))
    }

    /// Each recorded file with its member, located in its wheel (each wheel opened once).
    pub fn locate(&self) -> Result<Vec<(LayerPath, ZipMember)>, LayerError> {
        let mut by_wheel: BTreeMap<&Path, Vec<(&str, &str)>> = BTreeMap::new();
        for (path, member) in &self.0 {
            by_wheel
                .entry(&member.wheel)
                .or_default()
                .push((path, &member.member));
        }
        let mut located = Vec::with_capacity(self.0.len());
        for (wheel, files) in by_wheel {
            let names: Vec<&str> = files.iter().map(|(_, member)| *member).collect();
            let members = ZipMember::locate(wheel, &names)?;
            for ((path, _), member) in files.into_iter().zip(members) {
                located.push((LayerPath::parse(path)?, member));
            }
        }
        Ok(located)
    }
}
