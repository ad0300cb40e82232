//! The `config` layer: the small top layer that makes the stack one coherent environment
//! and carries its own proof. It holds the loader configuration (`ld.so.conf.d` naming the
//! one CUDA library directory) and the loader cache over the whole merged tree, the recipe
//! and lock it was built from, and the verification probe with what it should find, so
//! every runner (Docker, a Kubernetes Job, enroot) runs the same probe with nothing to
//! mount. Its key names the keys of every layer below: the loader cache covers them all.

use std::path::Path;

use super::trust::write_trust_store;
use super::view::LayerBelow;
use super::{BuildEnv, LayerStager, Part, ASSEMBLER};
use crate::audit::{DirFs, ImageFs, LayeredFs};
use crate::base_root::inspect_rootfs;
use crate::base_root::ldcache;
use crate::digest::Digest;
use crate::elf::Machine;
use crate::layer::CacheKey;
use crate::lock::lockfile::{ArtifactKind, Lockfile};
use crate::probe::expect::Expectations;
use crate::probe::glibc::can_run_on;
use crate::probe::guard::{GUARD_PATH, GUARD_SOURCE};
use crate::probe::native::{self, NativeProbe, NATIVE_PROBE_PATH};
use crate::probe::{EXPECT_PATH, PROBE_PATH, PROBE_SOURCE};
use crate::recipe::ca::CaFile;
use crate::stack::error::{io_error, BuildError};
use crate::stack::files::write_file;
use crate::stack::image_config::PIP_CONSTRAINTS_PATH;
use crate::stack::layers::toolkit::layout::ToolkitPaths;
use crate::stack::prepare::PlatformInputs;
use crate::stack::settings::BuildProgress;

/// The config layer of one platform.
pub(crate) struct ConfigLayer<'a> {
    key: CacheKey,
    /// `etc/ld.so.conf.d/000-cuda-X.Y.conf` and its one line.
    conf_path: String,
    conf_text: String,
    recipe_json: String,
    lock_json: String,
    /// /etc/pip/constraints.txt: every locked wheel pinned (derived from the lock, which
    /// the key names).
    constraints: String,
    expect_json: Vec<u8>,
    /// The native probe, for images without torch, when one is built for them.
    native_probe: Option<NativeProbe>,
    /// The start-time guard's source, when the recipe asks for it (`runtime.guard`).
    guard: Option<&'static str>,
    /// Every layer below, base first.
    below: Vec<LayerBelow>,
    machine: Machine,
    /// The recipe's certificate authorities, added to the trust store.
    ca_files: Vec<CaFile>,
    progress: &'a dyn BuildProgress,
}

/// What the config stager writes, in its key: bump it when that changes (config-2: the
/// `python` command beside `python3`).
const CONFIG_WRITER: &str = "config-2";

/// Where the image's Python is, and the plain `python` teams' scripts call.
const PYTHON3_COMMAND: &str = "usr/bin/python3";
const PYTHON_COMMAND: &str = "usr/bin/python";

impl<'a> ConfigLayer<'a> {
    /// Plan the config layer over every layer `below` it (base to packages).
    pub fn plan(inputs: &PlatformInputs, below: &[&dyn LayerStager], env: &BuildEnv<'a>) -> Self {
        let (conf_path, conf_text) = ld_so_conf(&inputs.paths());
        let recipe_json = inputs.recipe.canonical_json();
        let lock_json = inputs.lock.to_json();
        let expect_json = expectations(inputs).to_json();
        let native_probe = native_probe(inputs, env.progress);
        let guard = inputs
            .recipe
            .runtime
            .as_ref()
            .is_some_and(|runtime| runtime.guard)
            .then_some(GUARD_SOURCE);
        let key = CacheKey::new(
            &format!("{ASSEMBLER}/{CONFIG_WRITER}"),
            &below
                .iter()
                .map(|layer| layer.key().digest())
                .chain([
                    Digest::of_bytes(recipe_json.as_bytes()),
                    Digest::of_bytes(lock_json.as_bytes()),
                    Digest::of_bytes(PROBE_SOURCE.as_bytes()),
                    Digest::of_bytes(&expect_json),
                ])
                .chain(native_probe.as_ref().map(|p| p.digest))
                .chain(guard.map(|source| Digest::of_bytes(source.as_bytes())))
                .chain(inputs.resolved.ca_files().iter().map(|file| {
                    Digest::of_bytes(format!("{}\n{}", file.path.image_name(), file.pem).as_bytes())
                }))
                .collect::<Vec<_>>(),
            &conf_text,
        );
        Self {
            key,
            conf_path,
            conf_text,
            recipe_json,
            constraints: pip_constraints(&inputs.lock),
            lock_json,
            expect_json,
            native_probe,
            guard,
            below: below
                .iter()
                .map(|layer| LayerBelow::of(*layer, env.staging))
                .collect(),
            machine: inputs.machine(),
            ca_files: inputs.resolved.ca_files().to_vec(),
            progress: env.progress,
        }
    }

    /// The loader configuration, the provenance files, the probe and its expectations,
    /// and the guard when the recipe asks for it.
    fn write_files(&self, dir: &Path) -> Result<(), BuildError> {
        write_file(&dir.join(&self.conf_path), self.conf_text.as_bytes())?;
        write_file(
            &dir.join("usr/share/cudastack/recipe.json"),
            self.recipe_json.as_bytes(),
        )?;
        write_file(
            &dir.join(crate::labels::LOCK_IN_IMAGE),
            self.lock_json.as_bytes(),
        )?;
        write_file(
            &dir.join(PIP_CONSTRAINTS_PATH.trim_start_matches('/')),
            self.constraints.as_bytes(),
        )?;
        write_file(
            &dir.join(EXPECT_PATH.trim_start_matches('/')),
            &self.expect_json,
        )?;
        write_executable(
            &dir.join(PROBE_PATH.trim_start_matches('/')),
            PROBE_SOURCE.as_bytes(),
        )?;
        if let Some(source) = self.guard {
            write_file(
                &dir.join(GUARD_PATH.trim_start_matches('/')),
                source.as_bytes(),
            )?;
        }
        let views = self.views_below()?;
        let below = LayeredFs::new(views.iter().map(|layer| layer.as_ref()).collect());
        self.write_python_command(&below, dir)?;
        write_trust_store(&below, &self.ca_files, dir)
    }

    /// Every layer below as recorded (a wheel layer's tree is gone once written).
    fn views_below(&self) -> Result<Vec<Box<dyn ImageFs>>, BuildError> {
        self.below.iter().map(LayerBelow::view).collect()
    }

    /// `/usr/bin/python -> python3`, as Debian's python-is-python3 makes it: teams' scripts
    /// and Makefiles call `python`. Not when a layer below already has a `python` (that
    /// package among `apt:`, say), or has no `python3` to point at.
    fn write_python_command(&self, below: &dyn ImageFs, dir: &Path) -> Result<(), BuildError> {
        let in_below = |path: &str| {
            below
                .node(&Path::new("/").join(path))
                .is_ok_and(|node| node.is_some())
        };
        if in_below(PYTHON_COMMAND) || !in_below(PYTHON3_COMMAND) {
            return Ok(());
        }
        let link = dir.join(PYTHON_COMMAND);
        if let Some(parent) = link.parent() {
            fs_err::create_dir_all(parent).map_err(io_error(parent))?;
        }
        std::os::unix::fs::symlink("python3", &link).map_err(io_error(&link))
    }

    /// The native probe, when the base's glibc can run it.
    fn write_native_probe(&self, dir: &Path) -> Result<(), BuildError> {
        let Some(native) = &self.native_probe else {
            return Ok(());
        };
        let glibc = inspect_rootfs(&self.below[0].tree)?.glibc;
        match (native.required_glibc, glibc) {
            (Some(need), Some(have)) if need > have => {
                self.progress
                    .stage("probe", &can_run_on(Some(need), have).unwrap_err());
                Ok(())
            }
            _ => write_executable(
                &dir.join(NATIVE_PROBE_PATH.trim_start_matches('/')),
                &native.bytes,
            ),
        }
    }

    /// `etc/ld.so.cache` over every layer, as the image's own `ldconfig` would write it
    /// (cudastack's writer, byte for byte glibc's: tests/stack_ldcache.rs). Not the host's
    /// `ldconfig -r`: that names the host's glibc in the cache, needs root (chroot), and
    /// skips objects of another machine.
    fn write_loader_cache(&self, dir: &Path) -> Result<(), BuildError> {
        // The layers below as recorded (a wheel layer's tree is gone once written), this
        // one as staged so far.
        let mut layers = self.views_below()?;
        layers.push(Box::new(DirFs::new(dir)));
        let merged = LayeredFs::new(layers.iter().map(|layer| layer.as_ref()).collect());
        let cache_bytes = ldcache::ld_so_cache(&merged, self.machine)
            .map_err(|e| BuildError::Unsupported(e.to_string()))?;
        write_file(&dir.join("etc/ld.so.cache"), &cache_bytes)
    }
}

impl LayerStager for ConfigLayer<'_> {
    fn name(&self) -> &str {
        "config"
    }
    fn part(&self) -> Part {
        Part::Team
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        self.write_files(dir)?;
        self.write_native_probe(dir)?;
        self.write_loader_cache(dir)
    }
}

/// The pip constraints file: every locked wheel as `name==version`, sorted, under a header
/// saying what it is. PIP_CONSTRAINT names it, so `pip install` in a derived image keeps
/// every distribution of the stack at its locked version or fails.
pub(crate) fn pip_constraints(lock: &Lockfile) -> String {
    let mut pins: Vec<String> = lock
        .artifacts
        .iter()
        // Built from an sdist (`build:`) counts too: pip must not replace the extension
        // compiled for the recipe's GPUs with another build.
        .filter(|a| matches!(a.kind, ArtifactKind::Wheel | ArtifactKind::Sdist))
        .map(|a| format!("{}=={}", a.name, a.version))
        .collect();
    pins.sort();
    pins.dedup();
    let mut text = String::from(
        "# The Python distributions of this image, as cudastack locked and verified them.\n\
         # PIP_CONSTRAINT names this file: `pip install` may add packages, but cannot replace\n\
         # or duplicate these (torch, the nvidia-* CUDA libraries, pip). To change them,\n\
         # change the recipe and run `cudastack lock` and `cudastack build`.\n",
    );
    for pin in pins {
        text.push_str(&pin);
        text.push('\n');
    }
    text
}

fn write_executable(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    write_file(path, bytes)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(io_error(path))
}

/// Images without torch get the native probe too (if built, and if it can run there).
fn native_probe(inputs: &PlatformInputs, progress: &dyn BuildProgress) -> Option<NativeProbe> {
    if inputs.lock.artifacts.iter().any(|a| a.name == "torch") {
        return None;
    }
    match native::locate(inputs.recipe.cuda.version.major, inputs.machine()) {
        Ok(probe) => Some(probe),
        Err(why) => {
            progress.stage(
                "probe",
                &format!("{why}: the probe runs the static level alone"),
            );
            None
        }
    }
}

/// What the probe should find, from the recipe, the lock and the matrix: the stack decides
/// what it holds, and the probe (in [`crate::probe`]) only compares.
pub(crate) fn expectations(inputs: &PlatformInputs) -> Expectations {
    let (matrix, recipe, lock) = (inputs.matrix, inputs.recipe, &inputs.lock);
    let torch_build = inputs.torch_build.as_ref();
    let version_of = |pick: &dyn Fn(&str) -> bool| {
        lock.artifacts
            .iter()
            .find(|a| pick(&a.name))
            .map(|a| a.version.clone())
    };
    Expectations {
        recipe: recipe.name.clone(),
        python: recipe.python.to_string(),
        torch: version_of(&|name| name == "torch"),
        cuda: torch_build
            .map(|b| b.cuda.line().to_string())
            .unwrap_or_else(|| recipe.cuda.version.line().to_string()),
        cuda_runtime: version_of(&|name| name.starts_with("nvidia-cuda-runtime")),
        cudnn: version_of(&|name| name.starts_with("nvidia-cudnn")),
        driver_floor: recipe.driver_floor.to_string(),
        minor_version_compat: recipe.minor_version_compat,
        sm: torch_build
            .map(|b| b.arch_list.iter().map(|cc| cc.sm()).collect())
            .unwrap_or_default(),
        cuda_lib_dir: inputs.paths().lib_dir(),
        cuda_archs: matrix
            .cuda_archs(recipe.cuda.version)
            .iter()
            .map(|cc| cc.sm())
            .collect(),
        // The distribution's name as a module: `cuda-ext` imports as `cuda_ext`. A git
        // requirement or local project is not assumed to be an extension, nor to import
        // under its distribution's name.
        extensions: lock
            .artifacts
            .iter()
            .filter(|a| a.kind == ArtifactKind::Sdist && !a.is_git() && !a.is_project())
            .map(|a| a.name.replace(['-', '.'], "_"))
            .collect(),
    }
}

/// `/etc/ld.so.conf.d/` entry so `ldconfig` and programs without LD_LIBRARY_PATH find the
/// one toolkit library directory.
pub fn ld_so_conf(paths: &ToolkitPaths) -> (String, String) {
    (
        format!("etc/ld.so.conf.d/000-cuda-{}.conf", paths.cuda.line()),
        format!("{}\n", paths.lib_dir()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constraints of a shipped lock: its wheels, sorted, pinned; no .deb, no redist.
    #[test]
    fn constraints_pin_every_locked_wheel() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/torch2.4.1-cu121-py3.11.lock");
        let lock = Lockfile::read(&path).unwrap();
        let text = pip_constraints(&lock);
        assert!(text.starts_with("# The Python distributions of this image"));
        let pins: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let wheels = lock
            .artifacts
            .iter()
            .filter(|a| a.kind == ArtifactKind::Wheel)
            .count();
        assert_eq!(pins.len(), wheels);
        assert!(pins.windows(2).all(|pair| pair[0] < pair[1]), "{text}");
        assert!(pins.contains(&"torch==2.4.1"), "{text}");
        assert!(pins.contains(&"nvidia-cudnn-cu12==9.1.0.70"), "{text}");
        assert!(pins.iter().all(|pin| {
            let (name, version) = pin.split_once("==").unwrap();
            !name.is_empty() && !version.is_empty()
        }));
    }
}
