//! The `python` and `packages` layers: the locked wheels installed into the Debian
//! `/usr/local` scheme, with the nvidia-* libraries the toolkit layers already hold replaced
//! by links to those copies, so the image has one copy of each CUDA library (DESIGN.md, "two
//! copies of cuDNN in one environment is how version skew happens").
//!
//! The wheels are split in two layers: `python` holds the stack (torch, pip, the nvidia-*
//! and cuda-* wheels and everything they require), `packages` the rest (the team's
//! requirements), so changing a requirement rebuilds the small layer and not torch's GBs.
//! The split follows each wheel's own `Requires-Dist`, evaluated for the lock's target.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::toolkit::ToolkitLayer;
use super::{LayerStager, ASSEMBLER};
use crate::digest::Digest;
use crate::fetch::metadata::{local_wheel_metadata, Metadata};
use crate::install::{
    apply_entries, plan_with_reader, EntryContent, InstallOptions, Scheme, WheelReader,
};
use crate::layer::CacheKey;
use crate::stack::error::{io_error, BuildError};
use crate::stack::prepare::{FetchedWheel, PlatformInputs};
use crate::stack::toolkit::Placement;

/// Which of the locked wheels a Python layer installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PythonPart {
    /// torch, pip, the nvidia-* and cuda-* wheels, and what they require.
    Stack,
    /// Every other wheel: the recipe's own requirements.
    Packages,
}

impl PythonPart {
    fn name(self) -> &'static str {
        match self {
            PythonPart::Stack => "python",
            PythonPart::Packages => "packages",
        }
    }
}

/// A Python layer of one platform. Its key names the toolkit layers' keys: it links to
/// what they placed.
pub(crate) struct PythonLayer<'a> {
    part: PythonPart,
    key: CacheKey,
    wheels: Vec<&'a FetchedWheel>,
    install_options: InstallOptions,
    /// The placement records of the `cuda` and `cudnn` trees.
    placements: [PathBuf; 2],
}

impl<'a> PythonLayer<'a> {
    /// The layer of `part` of the wheels: its `wheels`, in name order.
    pub fn plan(
        inputs: &PlatformInputs,
        wheels: Vec<&'a FetchedWheel>,
        part: PythonPart,
        cuda: &ToolkitLayer,
        cudnn: &ToolkitLayer,
    ) -> Self {
        let recipe = inputs.recipe;
        let wheel_digests: Vec<Digest> = wheels.iter().map(|w| w.sha256).collect();
        let key = CacheKey::new(
            &format!("{ASSEMBLER}/{}", part.name()),
            &wheel_digests,
            &(
                recipe.python.to_string(),
                cuda.key().digest(),
                cudnn.key().digest(),
            ),
        );
        Self {
            part,
            key,
            wheels,
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
        self.part.name()
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let placement = self.placement()?;
        for wheel in &self.wheels {
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

/// The locked wheels split into the stack's and the others, each in name order.
pub(crate) fn split_wheels<'a>(
    inputs: &'a PlatformInputs,
) -> Result<(Vec<&'a FetchedWheel>, Vec<&'a FetchedWheel>), BuildError> {
    let stack = stack_wheels(inputs)?;
    let (in_stack, others): (Vec<_>, Vec<_>) = inputs
        .wheels
        .iter()
        .partition(|(name, _)| stack.contains(*name));
    let wheels =
        |part: Vec<(&String, &'a FetchedWheel)>| part.into_iter().map(|(_, w)| w).collect();
    Ok((wheels(in_stack), wheels(others)))
}

/// The names of the stack's wheels: torch, pip and every nvidia-* / cuda-* wheel, and the
/// closure of their `Requires-Dist` (markers evaluated for the lock's target; extras are
/// not followed: the stack's roots name no extra a wheel outside them would bring).
fn stack_wheels(inputs: &PlatformInputs) -> Result<BTreeSet<String>, BuildError> {
    let environment = inputs.lock.target.marker_environment();
    let is_root = |name: &str| {
        matches!(name, "torch" | "pip") || name.starts_with("nvidia-") || name.starts_with("cuda-")
    };
    let mut stack = BTreeSet::new();
    let mut todo: Vec<String> = inputs
        .wheels
        .keys()
        .filter(|name| is_root(name))
        .cloned()
        .collect();
    while let Some(name) = todo.pop() {
        let Some(wheel) = inputs.wheels.get(&name) else {
            continue;
        };
        if !stack.insert(name.clone()) {
            continue;
        }
        let location = wheel.path.display().to_string();
        let text = local_wheel_metadata(&wheel.path).map_err(|e| BuildError::Wheel {
            wheel: location.clone(),
            message: e.to_string(),
        })?;
        let metadata = Metadata::parse(&text, &location).map_err(|e| BuildError::Wheel {
            wheel: location.clone(),
            message: e.to_string(),
        })?;
        for requirement in &metadata.requires_dist {
            if requirement.evaluate_markers(&environment, &[]) {
                todo.push(requirement.name.to_string());
            }
        }
    }
    Ok(stack)
}
