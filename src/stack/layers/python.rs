//! The Python layers: the locked wheels installed into the Debian `/usr/local` scheme, with
//! the nvidia-* libraries the toolkit layers already hold replaced by links to those copies,
//! so the image has one copy of each CUDA library (DESIGN.md, "two copies of cuDNN in one
//! environment is how version skew happens").
//!
//! The wheels are cut by what changes together and by size ("layers cut for
//! change and for pulls"):
//! - each very large distribution ([`LARGE_DISTRIBUTION`]: torch, triton) alone in a layer
//!   named after it, so neither a closure package's bump nor a team requirement re-tars,
//!   re-compresses or re-uploads its GB;
//! - `python`: the rest of the stack (pip, the nvidia-* and cuda-* wheels' Python parts,
//!   and what torch and they require: sympy, networkx, jinja2, ...);
//! - `packages`: the rest of the lock (the team's requirements).
//!
//! The stack is the closure of each wheel's own `Requires-Dist`, evaluated for the lock's
//! target, from torch, pip and the nvidia-* / cuda-* wheels.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::toolkit::{self as toolkit_layer, ToolkitLayers};
use super::{LayerStager, Part, WheelMembers, ASSEMBLER};
use crate::digest::Digest;
use crate::fetch::metadata::{local_wheel_metadata, Metadata};
use crate::install::{
    apply_entries, plan_with_reader, EntryContent, InstallEntry, InstallOptions, Scheme,
    WheelReader,
};
use crate::layer::CacheKey;
use crate::stack::error::{io_error, BuildError};
use crate::stack::layers::toolkit::layout::Placement;
use crate::stack::prepare::{FetchedWheel, PlatformInputs};

/// A distribution whose files unpack to more than this gets a layer of its own.
///
/// Measured on the torch 2.4.1 cu121 stack (unpacked sizes from the wheels' central
/// directories): torch 1552 MiB, triton 553 MiB, then numpy 61, sympy 25, transformers 42,
/// networkx 6, pip 5. The threshold sits in that gap with a factor of two either side, so
/// torch and triton are cut out and everything else stays together. Below it a layer of its
/// own would cost a blob request, a manifest entry and a chain ID on every pull for a
/// re-upload saving of well under 100 MB compressed; above it, one closure or requirement
/// bump would otherwise resend the distribution with its small neighbours.
pub(crate) const LARGE_DISTRIBUTION: u64 = 256 * 1024 * 1024;

/// Which of the locked wheels a Python layer installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PythonPart<'a> {
    /// One very large distribution alone, in a layer named after it (`torch`): the stack's
    /// or one of the recipe's requirements.
    Large(&'a str, Part),
    /// pip, the nvidia-* and cuda-* wheels, and what they and torch require.
    Stack,
    /// Every other wheel: the recipe's own requirements.
    Packages,
}

impl<'a> PythonPart<'a> {
    /// The stack's part of the image, or the team's.
    fn image_part(self) -> Part {
        match self {
            PythonPart::Large(_, part) => part,
            PythonPart::Stack => Part::Stack,
            PythonPart::Packages => Part::Team,
        }
    }

    fn name(self) -> &'a str {
        match self {
            PythonPart::Large(name, _) => name,
            PythonPart::Stack => "python",
            PythonPart::Packages => "packages",
        }
    }
}

/// A Python layer of one platform. The `python` and `packages` keys name the toolkit
/// layers' keys: they link to what those placed. A large distribution's layer links
/// nothing (no nvidia-* wheel is one), so its key is its wheel and the Python line alone:
/// a cuDNN or closure change leaves it cached.
pub(crate) struct PythonLayer<'a> {
    part: PythonPart<'a>,
    key: CacheKey,
    wheels: Vec<&'a FetchedWheel>,
    install_options: InstallOptions,
    /// The placement records of the toolkit trees; empty for a large distribution's layer.
    placements: Vec<PathBuf>,
}

impl<'a> PythonLayer<'a> {
    /// The layer of `part` of the wheels: its `wheels`, in name order.
    pub fn plan(
        inputs: &PlatformInputs,
        wheels: Vec<&'a FetchedWheel>,
        part: PythonPart<'a>,
        toolkit: &ToolkitLayers,
    ) -> Self {
        let recipe = inputs.recipe;
        let wheel_digests: Vec<Digest> = wheels.iter().map(|w| w.sha256).collect();
        let (key, placements) = match part {
            PythonPart::Large(..) => (
                CacheKey::new(
                    &format!("{ASSEMBLER}/large-distribution"),
                    &wheel_digests,
                    &recipe.python.to_string(),
                ),
                Vec::new(),
            ),
            PythonPart::Stack | PythonPart::Packages => (
                CacheKey::new(
                    &format!("{ASSEMBLER}/{}", part.name()),
                    &wheel_digests,
                    &(
                        recipe.python.to_string(),
                        toolkit
                            .all()
                            .iter()
                            .map(|layer| layer.key().digest())
                            .collect::<Vec<_>>(),
                    ),
                ),
                toolkit
                    .all()
                    .iter()
                    .map(|layer| layer.placement_record().to_path_buf())
                    .collect(),
            ),
        };
        Self {
            part,
            key,
            wheels,
            install_options: InstallOptions::new(Scheme::debian_local(recipe.python)),
            placements,
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
    fn name(&self) -> &str {
        self.part.name()
    }
    fn part(&self) -> Part {
        self.part.image_part()
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let placement = self.placement()?;
        let mut members = WheelMembers::default();
        for wheel in &self.wheels {
            let mut reader = WheelReader::open(&wheel.path)?;
            let mut plan = plan_with_reader(&mut reader, &self.install_options)?;
            refuse_data_over_the_verification_base(
                &wheel.path,
                &plan.entries,
                &self.install_options.scheme,
            )?;
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
            record_members(&mut members, &wheel.path, &plan.entries);
        }
        members.write(dir)
    }
    /// A wheel layer: written from the wheels, read above through its facts.
    fn transient(&self) -> bool {
        true
    }
    fn records_wheel_members(&self) -> bool {
        true
    }
    /// The stack's and the team's layers read the toolkit's placement; a large
    /// distribution's reads nothing below.
    fn reads_trees_below(&self) -> bool {
        !self.placements.is_empty()
    }
}

/// Record which of the paths `entries` wrote hold a member of `wheel` unchanged; a path
/// written again as something else (a generated file, a link) loses its record.
fn record_members(members: &mut WheelMembers, wheel: &Path, entries: &[InstallEntry]) {
    for entry in entries {
        let path = entry.path.to_string_lossy();
        match &entry.content {
            EntryContent::ZipMember { name, .. } => members.insert(&path, wheel, name.as_str()),
            EntryContent::Directory => {}
            EntryContent::Generated { .. } | EntryContent::Symlink { .. } => members.remove(&path),
        }
    }
}

/// A wheel's `.data/data/` members install under the prefix (`/usr/local`), where the
/// loader searches too (`/usr/local/lib` is in Debian's ld.so.conf, and the CUDA and driver
/// directories are on LD_LIBRARY_PATH, `glibc-hwcaps/` subdirectories included): a library
/// there would load into the verification probe's interpreter before its first line. Such
/// members are held to the rule of `copy:`; the scheme's other directories (site-packages,
/// scripts, headers) are the wheel's own.
fn refuse_data_over_the_verification_base(
    wheel: &Path,
    entries: &[InstallEntry],
    scheme: &Scheme,
) -> Result<(), BuildError> {
    let own = [
        &scheme.purelib,
        &scheme.platlib,
        &scheme.scripts,
        &scheme.headers,
    ];
    for entry in entries {
        // The planner adds every directory above a file (`/usr`, `/usr/local`, ...); what
        // is written there is the files and links.
        if matches!(entry.content, EntryContent::Directory)
            || own.iter().any(|dir| entry.path.starts_with(dir))
        {
            continue;
        }
        let path = entry.path.to_string_lossy();
        if let Some(protected) = crate::recipe::copy::verification_base_at(&path) {
            return Err(BuildError::WheelWritesVerificationBase {
                wheel: wheel.to_path_buf(),
                path: path.into_owned(),
                protected,
            });
        }
    }
    Ok(())
}

/// The locked wheels cut into layers: each large distribution alone (bottom to top), the
/// rest of the stack, the team's packages; each part in name order.
pub(crate) struct WheelSplit<'a> {
    pub large: Vec<(&'a str, &'a FetchedWheel)>,
    pub stack: Vec<&'a FetchedWheel>,
    /// Large distributions outside the stack's closure, each in a layer above the stack's.
    pub large_packages: Vec<(&'a str, &'a FetchedWheel)>,
    pub packages: Vec<&'a FetchedWheel>,
}

/// Read every locked wheel's requirements and size, and cut the wheels into layers.
pub(crate) fn split_wheels<'a>(inputs: &'a PlatformInputs) -> Result<WheelSplit<'a>, BuildError> {
    let environment = inputs.lock.target.marker_environment();
    let mut facts = BTreeMap::new();
    for (name, wheel) in &inputs.wheels {
        facts.insert(name.clone(), read_facts(wheel, &environment)?);
    }
    let names = split_names(&facts, LARGE_DISTRIBUTION);
    let pick = |part: &BTreeSet<String>| -> Vec<&'a FetchedWheel> {
        inputs
            .wheels
            .iter()
            .filter(|(name, _)| part.contains(*name))
            .map(|(_, wheel)| wheel)
            .collect()
    };
    let named = |names: &[String]| -> Vec<(&'a str, &'a FetchedWheel)> {
        names
            .iter()
            .filter_map(|name| {
                let (name, wheel) = inputs.wheels.get_key_value(name)?;
                Some((name.as_str(), wheel))
            })
            .collect()
    };
    Ok(WheelSplit {
        large: named(&names.large),
        stack: pick(&names.stack),
        large_packages: named(&names.large_packages),
        packages: pick(&names.packages),
    })
}

/// What the split needs of one locked wheel.
#[derive(Debug, Clone, Default)]
struct WheelFacts {
    /// The names its `Requires-Dist` asks for on the lock's target (extras are not followed:
    /// the stack's roots name no extra a wheel outside them would bring).
    requires: Vec<String>,
    /// The sum of its members' sizes, from the zip's central directory.
    unpacked: u64,
}

fn read_facts(
    wheel: &FetchedWheel,
    environment: &pep508_rs::MarkerEnvironment,
) -> Result<WheelFacts, BuildError> {
    let location = wheel.path.display().to_string();
    let malformed = |message: String| BuildError::Wheel {
        wheel: location.clone(),
        message,
    };
    let text = local_wheel_metadata(&wheel.path).map_err(|e| malformed(e.to_string()))?;
    let metadata = Metadata::parse(&text, &location).map_err(|e| malformed(e.to_string()))?;
    let requires = metadata
        .requires_dist
        .iter()
        .filter(|requirement| requirement.evaluate_markers(environment, &[]))
        .map(|requirement| requirement.name.to_string())
        .collect();
    let file = fs_err::File::open(&wheel.path).map_err(io_error(&wheel.path))?;
    let archive = zip::ZipArchive::new(file).map_err(|e| malformed(e.to_string()))?;
    let directory = archive.metadata();
    let mut unpacked = 0u64;
    for index in 0..directory.len() {
        let entry = directory
            .entry(index)
            .map_err(|e| malformed(e.to_string()))?;
        unpacked = unpacked.saturating_add(entry.size());
    }
    Ok(WheelFacts { requires, unpacked })
}

/// The cut by name: see [`WheelSplit`].
#[derive(Debug, Default, PartialEq, Eq)]
struct NameSplit {
    /// The large distributions of the stack's closure (torch, triton).
    large: Vec<String>,
    stack: BTreeSet<String>,
    /// Large distributions outside it (a team's vllm): they change as often as the
    /// packages, so their layers go above the stack's.
    large_packages: Vec<String>,
    packages: BTreeSet<String>,
}

/// Cut the locked wheels (`facts`, by name) into the large distributions (more than
/// `threshold` unpacked and not placed by the toolkit, whose nvidia-* wheels leave only a
/// few KiB in a Python layer), the stack's closure and the rest.
///
/// Layers are ordered by how often they change, rarest at the bottom: Docker and
/// containerd key an unpacked layer by its chain ID (its digest and those of every layer
/// below), so a changed layer makes every layer above it be downloaded (Docker) or
/// unpacked (containerd) again. A torch upgrade changes torch, triton and the nvidia pins
/// (the toolkit layers below) together, and a closure package's bump changes only
/// `python`, so the stack's large layers go below `python`; a large distribution outside
/// the stack (a team's requirement) changes with the packages, so its layer goes above.
/// Among them a distribution goes below those that require it (triton below torch): a
/// torch patch release keeps its triton.
fn split_names(facts: &BTreeMap<String, WheelFacts>, threshold: u64) -> NameSplit {
    let roots = facts.keys().filter(|name| {
        matches!(name.as_str(), "torch" | "pip")
            || toolkit_layer::is_toolkit_wheel(name)
            || name.starts_with("cuda-")
    });
    let closure_of_stack = closure(facts, roots);
    let mut large: Vec<&String> = facts
        .iter()
        .filter(|(name, wheel)| {
            wheel.unpacked > threshold && !toolkit_layer::is_toolkit_wheel(name)
        })
        .map(|(name, _)| name)
        .collect();
    // A distribution's closure holds the closure of each it requires, so counting the
    // large ones in it orders every requirement before what requires it (name breaks ties).
    let rank = |name: &String| {
        closure(facts, [name])
            .iter()
            .filter(|other| *other != name && large.contains(other))
            .count()
    };
    let ranks: BTreeMap<&String, usize> = large.iter().map(|name| (*name, rank(name))).collect();
    large.sort_by_key(|name| (ranks[name], *name));
    let (stack, packages): (BTreeSet<String>, BTreeSet<String>) = facts
        .keys()
        .filter(|name| !large.contains(name))
        .cloned()
        .partition(|name| closure_of_stack.contains(name));
    let (large, large_packages): (Vec<String>, Vec<String>) = large
        .into_iter()
        .cloned()
        .partition(|name| closure_of_stack.contains(name));
    NameSplit {
        large,
        stack,
        large_packages,
        packages,
    }
}

/// `roots` and every locked wheel they require, transitively.
fn closure<'n>(
    facts: &BTreeMap<String, WheelFacts>,
    roots: impl IntoIterator<Item = &'n String>,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = roots.into_iter().map(String::as_str).collect();
    while let Some(name) = todo.pop() {
        let Some(wheel) = facts.get(name) else {
            continue;
        };
        if seen.insert(name.to_string()) {
            todo.extend(wheel.requires.iter().map(String::as_str));
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.data/data/` member under a directory the loader searches is refused; the
    /// scheme's own directories and the rest of the prefix are the wheel's.
    #[test]
    fn a_wheel_data_member_may_not_land_where_the_loader_searches() {
        let scheme = Scheme::debian_local("3.11".parse().unwrap());
        let entry = |path: &str| crate::install::InstallEntry {
            path: PathBuf::from(path),
            mode: 0o644,
            content: EntryContent::Directory,
        };
        let wheel = Path::new("evil-1.0-py3-none-any.whl");
        let file = |path: &str| crate::install::InstallEntry {
            path: PathBuf::from(path),
            mode: 0o644,
            content: EntryContent::generated(b"x".to_vec()),
        };
        for bad in [
            "/usr/local/nvidia/lib64/glibc-hwcaps/x86-64-v2/libz.so.1",
            "/usr/local/lib/libz.so.1",
            "/usr/local/lib/glibc-hwcaps/x86-64-v2/libz.so.1",
            "/usr/local/cuda-12.1/targets/x86_64-linux/lib/libz.so.1",
        ] {
            let error = refuse_data_over_the_verification_base(wheel, &[file(bad)], &scheme)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(bad) && error.contains("verification probe"),
                "{error}"
            );
        }
        let fine = [
            // The directories the planner adds above every file.
            entry("/usr"),
            entry("/usr/local"),
            entry("/usr/local/lib"),
            file("/usr/local/lib/python3.11/dist-packages/evil/__init__.py"),
            file("/usr/local/bin/evil"),
            file("/usr/local/include/python3.11/evil/evil.h"),
            file("/usr/local/share/jupyter/kernels/evil/kernel.json"),
            file("/usr/local/etc/jupyter/evil.json"),
        ];
        refuse_data_over_the_verification_base(wheel, &fine, &scheme).unwrap();
    }
    use crate::cache::Staging;
    use crate::lock::lockfile::Lockfile;
    use crate::matrix::Matrix;
    use crate::matrix::ResolvedRecipe;
    use crate::recipe::Platform;
    use crate::stack::layers::toolkit::ToolkitLayer;
    use std::io::Write;

    const MIB: u64 = 1024 * 1024;
    const RECIPE: &str = "recipes/torch2.4.1-cu121-py3.11";

    /// The `Requires-Dist` lines of the METADATA of PyPI's torch 2.4.1 cp311 x86_64 wheel.
    const TORCH: &str = "Requires-Dist: filelock
Requires-Dist: typing-extensions (>=4.8.0)
Requires-Dist: sympy
Requires-Dist: networkx
Requires-Dist: jinja2
Requires-Dist: fsspec
Requires-Dist: nvidia-cuda-runtime-cu12 (==12.1.105) ; platform_system == \"Linux\" and platform_machine == \"x86_64\"
Requires-Dist: nvidia-cudnn-cu12 (==9.1.0.70) ; platform_system == \"Linux\" and platform_machine == \"x86_64\"
Requires-Dist: nvidia-cublas-cu12 (==12.1.3.1) ; platform_system == \"Linux\" and platform_machine == \"x86_64\"
Requires-Dist: triton (==3.0.0) ; platform_system == \"Linux\" and platform_machine == \"x86_64\" and python_version < \"3.13\"
Requires-Dist: opt-einsum (>=3.3) ; extra == 'opt-einsum'
Requires-Dist: optree (>=0.11.0) ; extra == 'optree'
";
    /// triton 3.0.0's (its extras only add test and build tools).
    const TRITON: &str = "Requires-Dist: filelock
Requires-Dist: cmake >=3.20 ; extra == 'build'
Requires-Dist: numpy ; extra == 'tests'
";

    /// Each locked wheel of the test stack: name, version, requirements, and its unpacked
    /// size as measured on PyPI's file (the wheels written here are small).
    fn stack() -> Vec<(&'static str, &'static str, &'static str, u64)> {
        vec![
            ("torch", "2.4.1", TORCH, 1552 * MIB),
            ("triton", "3.0.0", TRITON, 553 * MIB),
            ("sympy", "1.14.0", "Requires-Dist: mpmath<1.4,>=1.1.0\nRequires-Dist: pytest>=7.1.0; extra == \"dev\"\n", 25 * MIB),
            ("mpmath", "1.3.0", "", 2 * MIB),
            ("networkx", "3.6.1", "", 6 * MIB),
            ("jinja2", "3.1.4", "Requires-Dist: MarkupSafe>=2.0\n", MIB),
            ("markupsafe", "2.1.5", "", MIB / 10),
            ("filelock", "3.16.1", "", MIB / 10),
            ("fsspec", "2024.9.0", "", MIB),
            ("typing-extensions", "4.12.2", "", MIB / 10),
            ("pip", "24.2", "", 5 * MIB),
            ("nvidia-cublas-cu12", "12.1.3.1", "", 595 * MIB),
            ("nvidia-cuda-runtime-cu12", "12.1.105", "", 3 * MIB),
            ("nvidia-cudnn-cu12", "9.1.0.70", "Requires-Dist: nvidia-cublas-cu12\n", 1000 * MIB),
            ("numpy", "1.26.4", "", 61 * MIB),
        ]
    }

    /// A wheel in the format PyPI serves (deflated members, METADATA in the dist-info).
    fn write_wheel(dir: &Path, name: &str, version: &str, requires: &str) -> PathBuf {
        let dist = format!("{}-{version}", name.replace('-', "_"));
        let path = dir.join(format!("{dist}-py3-none-any.whl"));
        let mut zip = zip::ZipWriter::new(fs_err::File::create(&path).unwrap());
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        let metadata =
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}");
        for (member, bytes) in [
            (format!("{dist}.dist-info/METADATA"), metadata.into_bytes()),
            (
                format!("{}/__init__.py", name.replace('-', "_")),
                vec![b'#'; 4096],
            ),
        ] {
            zip.start_file(member, options).unwrap();
            zip.write_all(&bytes).unwrap();
        }
        zip.finish().unwrap();
        path
    }

    fn fetched(path: PathBuf, version: &str) -> FetchedWheel {
        FetchedWheel {
            sha256: Digest::of_bytes(&fs_err::read(&path).unwrap()),
            path,
            version: version.to_string(),
        }
    }

    /// The shipped torch 2.4.1 recipe and its lock (target: CPython 3.11, x86_64).
    fn recipe_and_lock() -> (ResolvedRecipe, Lockfile) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let yaml = root.join(format!("{RECIPE}.yaml"));
        let lock = Lockfile::read(&root.join(format!("{RECIPE}.lock"))).unwrap();
        (
            ResolvedRecipe::load(&yaml, Matrix::embedded()).unwrap(),
            lock,
        )
    }

    fn inputs<'a>(
        resolved: &'a ResolvedRecipe,
        lock: &Lockfile,
        wheels: BTreeMap<String, FetchedWheel>,
    ) -> PlatformInputs<'a> {
        PlatformInputs {
            matrix: Matrix::embedded(),
            resolved,
            recipe: resolved.recipe(),
            platform: Platform::LinuxAmd64,
            lock: lock.clone(),
            wheels,
            torch_build: None,
            base_debs: Vec::new(),
            apt_debs: Vec::new(),
            context: PathBuf::from("."),
        }
    }

    /// The test stack's facts: requirements read from real-format wheels for the shipped
    /// lock's target, sizes as measured.
    fn facts(dir: &Path) -> BTreeMap<String, WheelFacts> {
        let (_, lock) = recipe_and_lock();
        let environment = lock.target.marker_environment();
        stack()
            .into_iter()
            .map(|(name, version, requires, unpacked)| {
                let wheel = fetched(write_wheel(dir, name, version, requires), version);
                let facts = read_facts(&wheel, &environment).unwrap();
                (name.to_string(), WheelFacts { unpacked, ..facts })
            })
            .collect()
    }

    #[test]
    fn torch_and_triton_get_layers_of_their_own_requirements_first() {
        let dir = tempfile::tempdir().unwrap();
        let split = split_names(&facts(dir.path()), LARGE_DISTRIBUTION);
        // triton below torch: torch requires it, so a torch patch release keeps it.
        assert_eq!(split.large, ["triton", "torch"]);
        let stack: Vec<&str> = split.stack.iter().map(String::as_str).collect();
        assert_eq!(
            stack,
            [
                "filelock",
                "fsspec",
                "jinja2",
                "markupsafe",
                "mpmath",
                "networkx",
                "nvidia-cublas-cu12",
                "nvidia-cuda-runtime-cu12",
                "nvidia-cudnn-cu12",
                "pip",
                "sympy",
                "typing-extensions"
            ],
            "the nvidia-* wheels stay: the toolkit layers hold their libraries"
        );
        assert_eq!(split.packages, BTreeSet::from(["numpy".to_string()]));
    }

    #[test]
    fn a_large_team_package_goes_above_what_it_requires_and_a_small_one_to_packages() {
        let dir = tempfile::tempdir().unwrap();
        let mut facts = facts(dir.path());
        let requires_torch = |unpacked| WheelFacts {
            requires: vec!["torch".into(), "numpy".into()],
            unpacked,
        };
        facts.insert("vllm".into(), requires_torch(400 * MIB));
        facts.insert("accelerate".into(), requires_torch(2 * MIB));
        let split = split_names(&facts, LARGE_DISTRIBUTION);
        assert_eq!(split.large, ["triton", "torch"]);
        // A team's large requirement changes with the packages: above the stack's layers.
        assert_eq!(split.large_packages, ["vllm"]);
        assert_eq!(
            split.packages,
            BTreeSet::from(["accelerate".to_string(), "numpy".to_string()])
        );
        // Without large distributions the cut is the one before: stack and packages.
        let split = split_names(&facts, u64::MAX);
        assert!(split.large.is_empty() && split.large_packages.is_empty());
        assert!(split.stack.contains("torch") && split.stack.contains("triton"));
        assert!(split.packages.contains("vllm"));
    }

    #[test]
    fn a_wheels_facts_are_its_requirements_on_the_target_and_its_unpacked_size() {
        let dir = tempfile::tempdir().unwrap();
        let (_, lock) = recipe_and_lock();
        let wheel = fetched(write_wheel(dir.path(), "torch", "2.4.1", TORCH), "2.4.1");
        let facts = read_facts(&wheel, &lock.target.marker_environment()).unwrap();
        // The markers hold on CPython 3.11 x86_64; extras are not followed.
        assert!(facts.requires.contains(&"triton".to_string()));
        assert!(!facts.requires.iter().any(|name| name == "opt-einsum"));
        assert_eq!(facts.requires.len(), 10, "{:?}", facts.requires);
        let metadata = "Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\n".len() + TORCH.len();
        assert_eq!(facts.unpacked, metadata as u64 + 4096);

        // A file that is not a zip is an error naming the wheel, not a panic.
        let broken = dir.path().join("broken-1.0-py3-none-any.whl");
        fs_err::write(&broken, b"not a zip").unwrap();
        let error = read_facts(&fetched(broken, "1.0"), &lock.target.marker_environment())
            .unwrap_err()
            .to_string();
        assert!(error.contains("broken-1.0-py3-none-any.whl"), "{error}");
    }

    /// The keys of the toolkit, torch, python and packages layers of a stack whose wheels
    /// have these digests.
    fn keys(digests: &[(&str, &str)]) -> BTreeMap<&'static str, Digest> {
        let (recipe, lock) = recipe_and_lock();
        let wheel = |name: &str| FetchedWheel {
            path: PathBuf::from(format!("/wheels/{name}.whl")),
            sha256: Digest::of_bytes(digests.iter().find(|d| d.0 == name).unwrap().1.as_bytes()),
            version: "1".into(),
        };
        let wheels = digests
            .iter()
            .map(|(name, _)| (name.to_string(), wheel(name)))
            .collect();
        let inputs = inputs(&recipe, &lock, wheels);
        let staging_root = tempfile::tempdir().unwrap();
        let staging = Staging::open(staging_root.path()).unwrap();
        let toolkit = ToolkitLayer::plan(&inputs, &staging);
        let pick = |names: &[&str]| -> Vec<&FetchedWheel> {
            names
                .iter()
                .filter_map(|name| inputs.wheels.get(*name))
                .collect()
        };
        let plan = |names: &[&str], part| {
            PythonLayer::plan(&inputs, pick(names), part, &toolkit)
                .key()
                .digest()
        };
        BTreeMap::from([
            ("cuda", toolkit.cuda.key().digest()),
            ("cuda-math", toolkit.math.as_ref().unwrap().key().digest()),
            ("cudnn", toolkit.cudnn.key().digest()),
            (
                "torch",
                plan(&["torch"], PythonPart::Large("torch", Part::Stack)),
            ),
            (
                "python",
                plan(
                    &[
                        "sympy",
                        "nvidia-cudnn-cu12",
                        "nvidia-cublas-cu12",
                        "nvidia-cufft-cu12",
                    ],
                    PythonPart::Stack,
                ),
            ),
            ("packages", plan(&["numpy", "six"], PythonPart::Packages)),
        ])
    }

    /// The layers whose keys differ between two stacks.
    fn changed(before: &[(&str, &str)], after: &[(&str, &str)]) -> Vec<&'static str> {
        let (before, after) = (keys(before), keys(after));
        before
            .keys()
            .filter(|layer| before[*layer] != after[*layer])
            .copied()
            .collect()
    }

    #[test]
    fn each_layer_is_keyed_by_its_own_wheels() {
        let stack = [
            ("torch", "torch 2.4.1"),
            ("sympy", "sympy 1.13"),
            ("nvidia-cudnn-cu12", "cudnn 9.1"),
            ("nvidia-cublas-cu12", "cublas 12.1"),
            ("nvidia-cufft-cu12", "cufft 11.0"),
            ("numpy", "numpy 1.26.4"),
        ];
        let with = |name: &'static str, digest: &'static str| {
            let mut changed: Vec<(&str, &str)> = stack.to_vec();
            changed.retain(|(n, _)| *n != name);
            changed.push((name, digest));
            changed
        };
        // A closure package's bump: only `python`.
        assert_eq!(changed(&stack, &with("sympy", "sympy 1.14")), ["python"]);
        // One more team requirement: only `packages`.
        assert_eq!(changed(&stack, &with("six", "six 1.16")), ["packages"]);
        // A cuDNN bump: cudnn and the layers that link to it; torch links nothing.
        assert_eq!(
            changed(&stack, &with("nvidia-cudnn-cu12", "cudnn 9.3")),
            ["cudnn", "packages", "python"]
        );
        // A cuFFT bump: the math libraries' layer, not the rest of the toolkit.
        assert_eq!(
            changed(&stack, &with("nvidia-cufft-cu12", "cufft 11.2")),
            ["cuda-math", "packages", "python"]
        );
        // A torch patch release: torch's layer alone.
        assert_eq!(changed(&stack, &with("torch", "torch 2.4.2")), ["torch"]);
    }

    #[test]
    fn the_toolkit_is_cut_by_family_and_cuda_math_only_when_locked() {
        let (recipe, lock) = recipe_and_lock();
        let staging_root = tempfile::tempdir().unwrap();
        let staging = Staging::open(staging_root.path()).unwrap();
        let wheels = |names: &[&str]| -> BTreeMap<String, FetchedWheel> {
            names
                .iter()
                .map(|name| {
                    let wheel = FetchedWheel {
                        path: PathBuf::from(format!("/wheels/{name}.whl")),
                        sha256: Digest::of_bytes(name.as_bytes()),
                        version: "12.1.0".into(),
                    };
                    (name.to_string(), wheel)
                })
                .collect()
        };
        let names = |layer: &ToolkitLayer| -> Vec<String> {
            layer.wheels.iter().map(|w| w.project.clone()).collect()
        };
        let full = inputs(
            &recipe,
            &lock,
            wheels(&[
                "nvidia-cublas-cu12",
                "nvidia-cufft-cu12",
                "nvidia-cudnn-cu12",
                "torch",
            ]),
        );
        let toolkit = ToolkitLayer::plan(&full, &staging);
        let layers: Vec<&str> = toolkit.all().iter().map(|l| l.name()).collect();
        assert_eq!(layers, ["cuda", "cuda-math", "cudnn"]);
        assert_eq!(names(&toolkit.cuda), ["nvidia-cublas-cu12"]);
        assert_eq!(names(toolkit.math.as_ref().unwrap()), ["nvidia-cufft-cu12"]);
        assert_eq!(names(&toolkit.cudnn), ["nvidia-cudnn-cu12"]);

        let without_math = inputs(&recipe, &lock, wheels(&["nvidia-cublas-cu12"]));
        let toolkit = ToolkitLayer::plan(&without_math, &staging);
        assert!(toolkit.math.is_none());
        assert_eq!(toolkit.all().len(), 2);
    }

    #[test]
    fn a_large_distributions_layer_is_named_after_it() {
        assert_eq!(PythonPart::Large("torch", Part::Stack).name(), "torch");
    }
}
