//! The `python` layer: every locked wheel installed into the Debian `/usr/local` scheme,
//! with the nvidia-* libraries the toolkit layers already hold replaced by links to those
//! copies, so the image has one copy of each CUDA library (DESIGN.md, "two copies of cuDNN
//! in one environment is how version skew happens").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::toolkit::ToolkitLayer;
use super::{LayerStager, ASSEMBLER};
use crate::digest::Digest;
use crate::install::{
    apply_entries, plan_with_reader, EntryContent, InstallOptions, Scheme, WheelReader,
};
use crate::layer::CacheKey;
use crate::stack::error::{io_error, BuildError};
use crate::stack::prepare::{FetchedWheel, PlatformInputs};
use crate::stack::toolkit::Placement;

/// The Python layer of one platform. Its key names the toolkit layers' keys: it links to
/// what they placed.
pub(crate) struct PythonLayer<'a> {
    key: CacheKey,
    wheels: &'a BTreeMap<String, FetchedWheel>,
    install_options: InstallOptions,
    /// The placement records of the `cuda` and `cudnn` trees.
    placements: [PathBuf; 2],
}

impl<'a> PythonLayer<'a> {
    pub fn plan(inputs: &'a PlatformInputs, cuda: &ToolkitLayer, cudnn: &ToolkitLayer) -> Self {
        let recipe = inputs.recipe;
        let wheel_digests: Vec<Digest> = inputs.wheels.values().map(|w| w.sha256).collect();
        let key = CacheKey::new(
            &format!("{ASSEMBLER}/python"),
            &wheel_digests,
            &(
                recipe.python.to_string(),
                cuda.key().digest(),
                cudnn.key().digest(),
            ),
        );
        Self {
            key,
            wheels: &inputs.wheels,
            install_options: InstallOptions::new(Scheme::debian_local(recipe.python)),
            placements: [
                cuda.placement_record().to_path_buf(),
                cudnn.placement_record().to_path_buf(),
            ],
        }
    }

    /// What the toolkit layers hold: wheel member -> image path.
    fn placement(&self) -> Result<Placement, BuildError> {
        let mut placement = Placement::new();
        for record in &self.placements {
            let bytes = fs_err::read(record).map_err(io_error(record))?;
            placement.extend(serde_json::from_slice::<Placement>(&bytes).map_err(|e| {
                BuildError::Io {
                    path: record.clone(),
                    source: e.into(),
                }
            })?);
        }
        Ok(placement)
    }
}

impl LayerStager for PythonLayer<'_> {
    fn name(&self) -> &'static str {
        "python"
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let placement = self.placement()?;
        for wheel in self.wheels.values() {
            let mut reader = WheelReader::open(&wheel.path)?;
            let mut plan = plan_with_reader(&mut reader, &self.install_options)?;
            for entry in &mut plan.entries {
                if let EntryContent::ZipMember { name, .. } = &entry.content {
                    if let Some(target) = placement.get(name) {
                        entry.content = EntryContent::Symlink {
                            target: PathBuf::from(target),
                        };
                        entry.mode = 0o777;
                    }
                }
            }
            apply_entries(&plan.entries, Some(&mut reader), dir)?;
        }
        Ok(())
    }
}
