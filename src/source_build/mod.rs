//! Source builds: the wheel of each `sdist` artifact of the lock (the recipe's
//! `build:` list), compiled for the recipe's GPUs before the image's layers are planned,
//! then installed by the Python layers like any locked wheel, without the toolchain.
//!
//! In the data flow it is an input stage, between a platform's inputs and the assembly
//! (`crate::pipeline::build` calls [`add_built_wheels`] between the two). In the import
//! order it sits above the stack, whose layer stagers stage its builder; the stack never
//! calls it. Its failures are [`SourceBuildError`]s, the stack's own (staging the builder)
//! wrapped in one.
//!
//! The builder is the devel flavor of the same stack: the image's own layers (base, CUDA,
//! cuDNN, torch, the other wheels) staged with nvcc and the CUDA headers, plus the
//! `build-deb` artifacts (g++, the Python headers) in the apt layer and the `build-wheel`
//! artifacts (setuptools, wheel, ninja, the sdist's `[build-system] requires`), all from
//! the lock. Their staged trees are merged into one root by hard links (same filesystem,
//! nothing copied), and `pip wheel --no-deps --no-build-isolation --no-index` runs there in
//! a chroot, in a sandbox of its own (`Sandbox`: no network, a private /dev, /dev/shm,
//! IPC and PID namespace, a time limit, killed whole on a stop signal or with cudastack:
//! from `/build/<name>-<version>`, with
//! TORCH_CUDA_ARCH_LIST from `gpus:` (SASS for each, `+PTX` on the newest), MAX_JOBS from
//! the cores, SOURCE_DATE_EPOCH and a fixed HOME, TMPDIR and PYTHONHASHSEED: as
//! reproducible as the compiler allows. Building needs root (chroot), as the root build
//! mode does.
//!
//! The wheel is cached by its inputs ([`BuildKey`]: the sdist's sha256, the builder's
//! artifacts, the arch list, the entry's env, the timestamp), next to its build log, under
//! the cache directory's `source-builds/<key>/`; a rebuild with the same inputs runs no
//! compiler. An entry can also come from elsewhere, whole and checked
//! ([`store_fetched_wheel`]): `crate::pipeline::shared_wheels` shares entries through a
//! registry, so that one machine compiles and the others fetch.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::BufRead;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::apt::DebFile;
use crate::cache::{BlobStore, CacheDir};
use crate::digest::Digest;
use crate::fetch::download::Downloader;
use crate::fetch::http::HttpClient;
use crate::lock::inputs::index_credentials;
use crate::lock::lockfile::{Artifact, ArtifactKind};
use crate::matrix::Matrix;
use crate::recipe::{Flavor, Recipe, SourceBuild};
use crate::stack::{
    fetch_deb_files, link_wheel, source_date_epoch, BuildEnv, BuildError, BuildSettings,
    FetchedWheel, PlatformInputs, StackLayers,
};
use crate::target_gpu::TargetGpu;
use crate::version::{ComputeCapability, CudaVersion};

mod sandbox;
use sandbox::*;

/// Bump when the way a wheel is built changes: part of every [`BuildKey`].
/// 3: the build runs as the PID namespace's second process (its init is the sandbox's
/// shell), so nvcc's temporary names, and the bytes, differ from 2's.
const BUILDER: &str = "source-build-3";

/// The default of `BuildSettings::source_build_timeout`: 4 hours. flash-attn 2.6 takes
/// over an hour on 16 cores; a build that hangs must still end a CI job.
pub const DEFAULT_SOURCE_BUILD_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

/// Lines of the build log an error shows.
const LOG_TAIL: usize = 40;

/// Why a source build failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceBuildError {
    #[error("`build` package `{package}`: CUDA {cuda}'s nvcc cannot compile for {sm} (GPU `{gpu}`); it compiles {supported}\n  hint: use a CUDA release that supports the GPU (`cudastack solve --gpu \"{gpu}\"`), or drop it from `gpus:`")]
    Unsupported {
        package: String,
        gpu: String,
        sm: String,
        cuda: String,
        supported: String,
    },
    #[error("`build` package `{package}` cannot be compiled for {platform} on this {host} machine: the compiler runs in a chroot of the image's own platform\n  hint: build the {platform} image on a {platform} machine, or drop `{package}` from `build:` for it")]
    ForeignPlatform {
        package: String,
        platform: String,
        host: String,
    },
    #[error("the lock has the sdist of `{package}` {version}, but the recipe's `build:` does not name it\n  hint: run `cudastack lock` again")]
    NotInRecipe { package: String, version: String },
    #[error("building `{package}` {version} from its sdist needs root (it runs the compiler in a chroot of the devel stack), and this build runs as uid {uid}\n  hint: run `cudastack build` as root, or build the wheel elsewhere and serve it from an index in `indexes:`")]
    NotRoot {
        package: String,
        version: String,
        uid: u32,
    },
    #[error("the build of `{package}` {version} failed ({status}); the last lines of its log:\n{tail}\n  the whole log: {}\n  hint: a missing header or library is a Debian package or a Python package the sdist needs: add it to the recipe's `apt:` or to the entry's `requires:` (both also put it in the image: there is no build-only list yet); `env:` passes switches to its setup.py", log.display())]
    Failed {
        package: String,
        version: String,
        status: String,
        tail: String,
        log: PathBuf,
    },
    #[error("the build of `{package}` {version} ran past its time limit ({limit}) and was killed, with every process it started; the last lines of its log:\n{tail}\n  the whole log: {}\n  hint: a build that needs longer (flash-attn takes over an hour on 16 cores) can have it: `cudastack build --source-build-timeout SECONDS`, or CUDASTACK_SOURCE_BUILD_TIMEOUT", log.display())]
    TimedOut {
        package: String,
        version: String,
        limit: String,
        tail: String,
        log: PathBuf,
    },
    #[error(
        "{what} was stopped by {signal}: its processes were killed and its builder root removed"
    )]
    Stopped { what: String, signal: &'static str },
    #[error("the build of `{package}` {version} left `{path}` as {found}; cudastack reads a build's output only from regular files and directories under the builder root, never through a link, and caches nothing of it\n  hint: the sdist's build replaced its output directory or wheel: build it where you can inspect it")]
    UnsafeOutput {
        package: String,
        version: String,
        path: String,
        found: String,
    },
    #[error("the build of `{package}` {version} made {found} wheels in /build/out, not one (log: {})", log.display())]
    NoWheel {
        package: String,
        version: String,
        found: usize,
        log: PathBuf,
    },
    #[error("the build of {package} {version} made `/build/out/{name}`, which cudastack does not install: {why}")]
    UnexpectedWheel {
        package: String,
        version: String,
        name: String,
        why: String,
    },
    #[error("a wheel of {package} {version} built elsewhere is named `{name}`, which cudastack does not install: {why}")]
    FetchedWheelName {
        package: String,
        version: String,
        name: String,
        why: String,
    },
    #[error("the sdist `{}` unpacks to more than {} MiB or {max_members} files: cudastack does not build it", sdist.display(), max_bytes >> 20)]
    SdistTooLarge {
        sdist: PathBuf,
        max_bytes: u64,
        max_members: usize,
    },
    #[error("the sdist `{}` has {found} top-level entries, not one directory (PEP 517 sdists have one)", sdist.display())]
    SdistNotOneDirectory { sdist: PathBuf, found: usize },
    #[error("the builder root's `/{name}` ({}) is {found}, not a directory: the sandbox mounts its own there\n  hint: the image's base or a package of it puts something else at `/{name}`", path.display())]
    MountPointNotDirectory {
        name: &'static str,
        path: PathBuf,
        found: &'static str,
    },
    #[error(transparent)]
    Git(#[from] crate::fetch::git::GitError),
    #[error("the tree of `{package}` at {url} is not the one the lock records: its archive's sha256 is {found}, the lock says {expected}\n  hint: a commit names its tree, so this is a changed archive format or a repository that was tampered with; run `cudastack lock --upgrade-package {package}` and review what changed")]
    GitTreeChanged {
        package: String,
        url: String,
        expected: Digest,
        found: Digest,
    },
    #[error("the project `{package}` (`{path}`) changed since it was locked: the lock pins the sha256 of its tree, and the build takes the tree the lock names\n  hint: run `cudastack lock` again (it reads the project as it is now), then build")]
    ProjectChanged { package: String, path: String },
    #[error("the project `{package}` (`{path}`) cannot be read: {why}")]
    ProjectUnreadable {
        package: String,
        path: String,
        why: String,
    },
    #[error("the build of `{package}` runs offline, and the cache has no archive of its git commit ({url})\n  hint: build once online, which keeps it in the cache")]
    GitOffline { package: String, url: String },
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
    /// Staging the builder (the stack's layers) failed.
    #[error(transparent)]
    Assembly(Box<BuildError>),
    #[error(transparent)]
    Download(#[from] crate::fetch::download::DownloadError),
    #[error(transparent)]
    Http(#[from] crate::fetch::http::HttpError),
    #[error(transparent)]
    Credentials(#[from] crate::fetch::credentials::CredentialError),
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}):\n{output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },
}

/// What the builder is made of failed to stage: the assembly's own error, boxed (it is
/// large, and a source build's `Result` should not be).
impl From<BuildError> for SourceBuildError {
    fn from(error: BuildError) -> Self {
        SourceBuildError::Assembly(Box::new(error))
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SourceBuildError + '_ {
    move |source| SourceBuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Everything the built wheel depends on; its canonical JSON's sha256 names the cache entry.
#[derive(Debug, Clone, Serialize)]
pub struct BuildKey {
    pub builder: &'static str,
    pub package: String,
    pub version: String,
    pub sdist_sha256: Digest,
    /// The sha256 of every artifact the builder is made of (sorted): the stack's wheels and
    /// debs, the build wheels and build debs.
    pub builder_digest: Digest,
    pub arch_list: String,
    pub env: BTreeMap<String, String>,
    pub source_date_epoch: u64,
}

impl BuildKey {
    pub fn digest(&self) -> Digest {
        let json = serde_json::to_string(&serde_json::to_value(self).expect("serialises"))
            .expect("a JSON value always serialises");
        Digest::of_bytes(json.as_bytes())
    }
}

/// TORCH_CUDA_ARCH_LIST for the recipe's GPUs (`gpus:`, as validation resolved them): each
/// GPU's `major.minor` once, sorted, the newest with `+PTX` so a newer GPU can JIT it
/// (`8.0;8.9;9.0+PTX`). Each must be a target `cuda`'s nvcc compiles (the matrix's
/// `cuda_archs`).
pub fn arch_list(
    matrix: &Matrix,
    cuda: CudaVersion,
    gpus: &[TargetGpu],
    package: &str,
) -> Result<String, SourceBuildError> {
    let supported = matrix.cuda_archs(cuda);
    let mut archs: Vec<ComputeCapability> = Vec::new();
    for gpu in gpus {
        if !supported.is_empty() && !supported.contains(&gpu.cc) {
            return Err(SourceBuildError::Unsupported {
                package: package.to_string(),
                gpu: gpu.recipe_entry(),
                sm: gpu.cc.sm(),
                cuda: cuda.to_string(),
                supported: supported
                    .iter()
                    .map(|cc| cc.sm())
                    .collect::<Vec<_>>()
                    .join(" "),
            });
        }
        archs.push(gpu.cc);
    }
    archs.sort();
    archs.dedup();
    let mut list: Vec<String> = archs.iter().map(ToString::to_string).collect();
    if let Some(newest) = list.last_mut() {
        newest.push_str("+PTX");
    }
    Ok(list.join(";"))
}

/// Where the builder's paths are: the toolkit, its library directory, torch's libraries.
pub struct BuilderPaths {
    pub cuda_home: String,
    pub lib_dir: String,
    /// `<site>/torch/lib`, given to the extension as its RUNPATH.
    pub torch_lib: String,
}

/// The environment of the compiler: the entry's `env:` and what cudastack sets (after it,
/// so nothing of the recipe's can replace it; `recipe::build` refuses those names anyway).
/// LDFLAGS gets torch's library directory as RUNPATH: an extension NEEDs libc10.so and
/// libtorch*.so, which only torch's own RUNPATH finds otherwise, and the image's static
/// audit resolves every NEEDED as the loader would (the entry's LDFLAGS come first).
pub fn build_env(
    entry: &SourceBuild,
    key: &BuildKey,
    paths: &BuilderPaths,
    jobs: usize,
) -> BTreeMap<String, String> {
    let mut env = entry.env.clone();
    let rpath = format!("-Wl,-rpath,{}", paths.torch_lib);
    let ldflags = match env.get("LDFLAGS") {
        Some(flags) => format!("{flags} {rpath}"),
        None => rpath,
    };
    env.insert("LDFLAGS".into(), ldflags);
    let cuda_home = &paths.cuda_home;
    for (name, value) in [
        ("TORCH_CUDA_ARCH_LIST", key.arch_list.clone()),
        ("MAX_JOBS", jobs.to_string()),
        ("SOURCE_DATE_EPOCH", key.source_date_epoch.to_string()),
        ("CUDA_HOME", cuda_home.to_string()),
        (
            "PATH",
            format!("{cuda_home}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        ),
        ("LD_LIBRARY_PATH", paths.lib_dir.clone()),
        ("HOME", "/build/home".to_string()),
        ("TMPDIR", "/build/tmp".to_string()),
        ("PYTHONHASHSEED", "0".to_string()),
        ("PYTHONDONTWRITEBYTECODE", "1".to_string()),
        ("PIP_NO_CACHE_DIR", "1".to_string()),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1".to_string()),
        ("LC_ALL", "C.UTF-8".to_string()),
    ] {
        env.insert(name.to_string(), value);
    }
    env
}

/// A built (or reused) wheel of one sdist.
#[derive(Debug, Clone)]
pub struct BuiltWheel {
    pub package: String,
    pub(crate) wheel: FetchedWheel,
    pub log: PathBuf,
    /// Whether it came from the cache (no compiler ran).
    pub reused: bool,
}

impl BuiltWheel {
    /// Where the wheel is, in its cache entry.
    pub fn path(&self) -> &Path {
        &self.wheel.path
    }

    /// The wheel's sha256, as recorded when its entry was made and checked since.
    pub fn sha256(&self) -> Digest {
        self.wheel.sha256
    }
}

/// One sdist the lock names, with what its build reads: the recipe's `build:` entry and
/// the key its wheel is cached under.
#[derive(Debug, Clone)]
pub struct PlannedBuild {
    pub sdist: Artifact,
    pub entry: SourceBuild,
    pub key: BuildKey,
}

/// The builds of every sdist of `inputs.lock`, planned: the key of each (nothing is
/// read but the lock and the recipe). Empty without sdists.
pub(crate) fn plan_builds(
    inputs: &PlatformInputs<'_>,
) -> Result<Vec<PlannedBuild>, SourceBuildError> {
    let sdists: Vec<&Artifact> = of_kind(inputs, ArtifactKind::Sdist).collect();
    if sdists.is_empty() {
        return Ok(Vec::new());
    }
    let builder_digest = builder_digest(&inputs.lock.artifacts);
    let epoch = source_date_epoch(inputs.recipe)?;
    let mut planned = Vec::new();
    for sdist in sdists {
        let entry = match inputs
            .recipe
            .build
            .iter()
            .find(|b| b.package.as_ref() == sdist.name)
        {
            Some(entry) => entry.clone(),
            // A git requirement or local project: built like a `build:` entry with nothing
            // of its own.
            None if sdist.is_git() || sdist.is_project() => project_entry(sdist)?,
            None => {
                return Err(SourceBuildError::NotInRecipe {
                    package: sdist.name.clone(),
                    version: sdist.version.clone(),
                })
            }
        };
        let key = BuildKey {
            builder: BUILDER,
            package: sdist.name.clone(),
            version: sdist.version.clone(),
            sdist_sha256: sdist.sha256,
            builder_digest,
            arch_list: arch_list(
                inputs.matrix,
                inputs.recipe.cuda.version,
                inputs.resolved.target_gpus(),
                &sdist.name,
            )?,
            env: entry.env.clone(),
            source_date_epoch: epoch,
        };
        planned.push(PlannedBuild {
            sdist: sdist.clone(),
            entry,
            key,
        });
    }
    Ok(planned)
}

/// Build (or take from the cache) the wheel of every `planned` build ([`plan_builds`])
/// and add it to `inputs.wheels`, so the Python layers install it.
pub(crate) async fn add_built_wheels(
    settings: &BuildSettings,
    inputs: &mut PlatformInputs<'_>,
    planned: Vec<PlannedBuild>,
    store: &BlobStore,
    env: &BuildEnv<'_>,
) -> Result<Vec<BuiltWheel>, SourceBuildError> {
    // A local project's wheel is cached by the tree the lock pins: the tree must still be
    // that one, or the build would install code the lock does not name.
    let recipe_dir = settings.recipe_path.parent().unwrap_or(Path::new(""));
    for PlannedBuild { sdist, .. } in planned.iter().filter(|p| p.sdist.is_project()) {
        tokio::task::block_in_place(|| project_tree(sdist, recipe_dir))?;
    }
    let mut built = Vec::new();
    let mut missing = Vec::new();
    for PlannedBuild { sdist, entry, key } in planned {
        match cached_wheel(&settings.cache_root, &key)? {
            Some(wheel) => built.push(wheel),
            None => missing.push((sdist, entry, key)),
        }
    }
    if let Some((sdist, _, _)) = missing.first() {
        let host = crate::platform::Platform::host();
        if host != Some(inputs.platform) {
            return Err(SourceBuildError::ForeignPlatform {
                package: sdist.name.clone(),
                platform: inputs.platform.to_string(),
                host: host.map_or("unknown".into(), |h| h.to_string()),
            });
        }
    }
    if !missing.is_empty() {
        let tools = fetch_builder_inputs(settings, inputs, store, env).await?;
        let sdists: Vec<Artifact> = missing.iter().map(|(s, _, _)| s.clone()).collect();
        let blobs = fetch_sources(settings, inputs, store, env, &sdists).await?;
        let made = tokio::task::block_in_place(|| {
            build_missing(settings, inputs, env, tools, &missing, &blobs)
        })?;
        built.extend(made);
    }
    for wheel in &built {
        let how = if wheel.reused { "reused" } else { "built" };
        env.progress.stage(
            "source",
            &format!(
                "{} {}: {how} {} ({}); log {}",
                wheel.package,
                wheel.wheel.version,
                file_name(&wheel.wheel.path),
                wheel.wheel.sha256,
                wheel.log.display()
            ),
        );
        inputs
            .wheels
            .insert(wheel.package.clone(), wheel.wheel.clone());
    }
    Ok(built)
}

/// The `build:` entry a git requirement or local project is built as: no extra
/// environment, and the run requirements its pyproject.toml declared (the lock resolved
/// them).
fn project_entry(sdist: &Artifact) -> Result<SourceBuild, SourceBuildError> {
    let unlocked = || SourceBuildError::NotInRecipe {
        package: sdist.name.clone(),
        version: sdist.version.clone(),
    };
    Ok(SourceBuild {
        package: sdist.name.parse().map_err(|_| unlocked())?,
        version: sdist.version.parse().map_err(|_| unlocked())?,
        env: BTreeMap::new(),
        requires: None,
    })
}

fn of_kind<'a>(
    inputs: &'a PlatformInputs<'_>,
    kind: ArtifactKind,
) -> impl Iterator<Item = &'a Artifact> {
    inputs.lock.artifacts.iter().filter(move |a| a.kind == kind)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The sha256 of what the builder is made of: every artifact of the lock but the sdists.
fn builder_digest(artifacts: &[Artifact]) -> Digest {
    let mut parts: Vec<String> = artifacts
        .iter()
        .filter(|a| a.kind != ArtifactKind::Sdist)
        .map(|a| format!("{:?} {} {} {}", a.kind, a.name, a.version, a.sha256))
        .collect();
    parts.sort();
    Digest::of_bytes(parts.join("\n").as_bytes())
}

/// `<cache>/source-builds/<key>`: the wheel, `build.log`, `key.json`, and the `complete`
/// marker written last.
pub fn entry_dir(cache_root: &Path, key: &BuildKey) -> PathBuf {
    CacheDir::new(cache_root)
        .source_builds()
        .join(key.digest().hex())
}

/// The cached wheel of `key`, if a build with the same inputs finished before (here, or
/// elsewhere and fetched).
pub fn cached_wheel(
    cache_root: &Path,
    key: &BuildKey,
) -> Result<Option<BuiltWheel>, SourceBuildError> {
    let dir = entry_dir(cache_root, key);
    if !dir.join("complete").is_file() {
        return Ok(None);
    }
    let wheel = only_wheel(&dir)?;
    let Some(path) = wheel else {
        return Ok(None);
    };
    let sha256 = file_sha256(&path)?;
    // `complete` names the wheel's sha256 as it was built: a file changed since (or an
    // entry of an older cudastack that recorded none) is built again, not trusted.
    let recorded = fs_err::read_to_string(dir.join("complete")).unwrap_or_default();
    if !recorded
        .lines()
        .any(|line| line == format!("sha256 {} {}", sha256.hex(), file_name(&path)))
    {
        return Ok(None);
    }
    // Its last use, for `cudastack cache prune`.
    crate::cache::touch_last_use(&dir.join("complete"));
    Ok(Some(BuiltWheel {
        package: key.package.clone(),
        wheel: FetchedWheel {
            path,
            sha256,
            version: key.version.clone(),
        },
        log: dir.join("build.log"),
        reused: true,
    }))
}

/// The sha256 of a file, streamed.
fn file_sha256(path: &Path) -> Result<Digest, SourceBuildError> {
    let file = fs_err::File::open(path).map_err(io_error(path))?;
    let mut writer = crate::digest::HashingWriter::new(std::io::sink());
    std::io::copy(&mut std::io::BufReader::new(file), &mut writer).map_err(io_error(path))?;
    Ok(writer.finish().1)
}

/// The one `.whl` of `dir`, if there is exactly one.
fn only_wheel(dir: &Path) -> Result<Option<PathBuf>, SourceBuildError> {
    let mut wheels = Vec::new();
    for entry in fs_err::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    Ok((wheels.len() == 1).then(|| wheels.remove(0)))
}

/// What the builder adds to the image's inputs: the build wheels (linked under their
/// file names) and the build debs.
struct BuilderTools {
    wheels: BTreeMap<String, FetchedWheel>,
    debs: Vec<DebFile>,
}

async fn fetch_builder_inputs(
    settings: &BuildSettings,
    inputs: &PlatformInputs<'_>,
    store: &BlobStore,
    env: &BuildEnv<'_>,
) -> Result<BuilderTools, SourceBuildError> {
    let wheels: Vec<Artifact> = of_kind(inputs, ArtifactKind::BuildWheel).cloned().collect();
    let blobs = fetch_artifacts(settings, inputs, store, env, &wheels).await?;
    let named = CacheDir::new(&settings.cache_root).wheels();
    fs_err::create_dir_all(&named).map_err(io_error(&named))?;
    let mut fetched = BTreeMap::new();
    for (artifact, blob) in wheels.iter().zip(blobs) {
        let path = link_wheel(&named, artifact, &blob)?;
        let wheel = FetchedWheel {
            path,
            sha256: artifact.sha256,
            version: artifact.version.clone(),
        };
        fetched.insert(artifact.name.clone(), wheel);
    }
    let downloader = Downloader::new(
        HttpClient::with_defaults()?,
        store.clone(),
        env.progress.downloads(),
    )
    .offline(settings.offline)
    .mirrors(settings.mirrors.clone());
    let build_debs: Vec<&Artifact> = of_kind(inputs, ArtifactKind::BuildDeb).collect();
    let debs = fetch_deb_files(&downloader, &build_debs, settings.apt_mirror.as_ref()).await?;
    Ok(BuilderTools {
        wheels: fetched,
        debs,
    })
}

/// Download (or find in the blob store) `artifacts`: their blob paths, in order. A build
/// wheel the recipe's `wheels:` gave is read from there, as the image's are.
async fn fetch_artifacts(
    settings: &BuildSettings,
    inputs: &PlatformInputs<'_>,
    store: &BlobStore,
    env: &BuildEnv<'_>,
    artifacts: &[Artifact],
) -> Result<Vec<PathBuf>, SourceBuildError> {
    let context = settings.recipe_path.parent().unwrap_or(Path::new(""));
    let items: Vec<_> = artifacts.iter().map(|a| a.fetch_item(context)).collect();
    let client = HttpClient::with_defaults()?.with_credentials(index_credentials(inputs.recipe)?);
    let mut readable = settings.mirrors.clone();
    readable.extend(inputs.resolved.local_wheels().directories());
    let downloader = Downloader::new(client, store.clone(), env.progress.downloads())
        .offline(settings.offline)
        .mirrors(readable);
    Ok(downloader.fetch_all(&items).await?)
}

/// The source archive of each sdist, in order: a git requirement's made again from its
/// commit and a local project's from its directory (each checked against the lock's
/// sha256), the others downloaded.
async fn fetch_sources(
    settings: &BuildSettings,
    inputs: &PlatformInputs<'_>,
    store: &BlobStore,
    env: &BuildEnv<'_>,
    sdists: &[Artifact],
) -> Result<Vec<PathBuf>, SourceBuildError> {
    let made_here = |a: &Artifact| a.is_git() || a.is_project();
    let published: Vec<Artifact> = sdists.iter().filter(|a| !made_here(a)).cloned().collect();
    // One path per item, in order (`Downloader::fetch_all`).
    let mut downloaded = fetch_artifacts(settings, inputs, store, env, &published)
        .await?
        .into_iter();
    let recipe_dir = settings.recipe_path.parent().unwrap_or(Path::new(""));
    let mut paths = Vec::with_capacity(sdists.len());
    for sdist in sdists {
        let path = if sdist.is_project() {
            tokio::task::block_in_place(|| project_archive(sdist, recipe_dir, store))?
        } else if sdist.is_git() {
            if settings.offline && !store.contains(&sdist.sha256) {
                return Err(SourceBuildError::GitOffline {
                    package: sdist.name.clone(),
                    url: sdist.url.to_string(),
                });
            }
            tokio::task::block_in_place(|| git_archive(sdist, store))?
        } else {
            downloaded
                .next()
                .expect("a downloaded path per published sdist")
        };
        paths.push(path);
    }
    Ok(paths)
}

/// The canonical archive of a git requirement's tree at its locked commit, in the blob
/// store by the lock's sha256 (made once per cache).
fn git_archive(sdist: &Artifact, store: &BlobStore) -> Result<PathBuf, SourceBuildError> {
    if let Some(path) = store.verified(&sdist.sha256)? {
        return Ok(path);
    }
    let (source, commit) = sdist
        .git_commit()
        .map_err(|_| SourceBuildError::NotInRecipe {
            package: sdist.name.clone(),
            version: sdist.version.clone(),
        })?;
    let tree = crate::fetch::git::fetch_tree(&source, &commit)?;
    let archive = tree.archive(&format!("{}-{}", sdist.name, sdist.version));
    let found = Digest::of_bytes(&archive);
    if found != sdist.sha256 {
        return Err(SourceBuildError::GitTreeChanged {
            package: sdist.name.clone(),
            url: source.to_string(),
            expected: sdist.sha256,
            found,
        });
    }
    store.put_bytes(&archive)?;
    Ok(store.path(&found))
}

/// The canonical archive of a local project's directory, in the blob store.
fn project_archive(
    sdist: &Artifact,
    recipe_dir: &Path,
    store: &BlobStore,
) -> Result<PathBuf, SourceBuildError> {
    let archive = project_tree(sdist, recipe_dir)?;
    store.put_bytes(&archive)?;
    Ok(store.path(&sdist.sha256))
}

/// The canonical archive of a local project's directory, refused unless it is the tree
/// the lock read.
fn project_tree(sdist: &Artifact, recipe_dir: &Path) -> Result<Vec<u8>, SourceBuildError> {
    let path = sdist.url.to_string();
    let path = path.trim_start_matches("file:");
    let unreadable = |why: String| SourceBuildError::ProjectUnreadable {
        package: sdist.name.clone(),
        path: path.to_string(),
        why,
    };
    let dir = crate::lock::sdist::project_dir(recipe_dir, path).map_err(unreadable)?;
    let tree = crate::fetch::source_tree::SourceTree::read_dir(&dir).map_err(unreadable)?;
    let archive = tree.archive(&format!("{}-{}", sdist.name, sdist.version));
    let found = Digest::of_bytes(&archive);
    if found != sdist.sha256 {
        return Err(SourceBuildError::ProjectChanged {
            package: sdist.name.clone(),
            path: path.to_string(),
        });
    }
    Ok(archive)
}

/// Stage the builder once, then build each missing wheel in it.
fn build_missing(
    settings: &BuildSettings,
    inputs: &PlatformInputs,
    env: &BuildEnv,
    tools: BuilderTools,
    missing: &[(Artifact, SourceBuild, BuildKey)],
    sdist_blobs: &[PathBuf],
) -> Result<Vec<BuiltWheel>, SourceBuildError> {
    let uid = crate::base_root::rootless::effective_uid();
    if uid != 0 {
        let (sdist, _, _) = &missing[0];
        return Err(SourceBuildError::NotRoot {
            package: sdist.name.clone(),
            version: sdist.version.clone(),
            uid,
        });
    }
    // Declared first, dropped last: a signal caught while the builder root is removed
    // still waits for that.
    let signals = StopSignals::catch();
    let work = CacheDir::new(&settings.cache_root).source_builds();
    fs_err::create_dir_all(&work).map_err(io_error(&work))?;
    remove_stale_builders(&work);
    let builder = BuilderRoot::new(&work)?;
    let root = builder.dir.join("root");
    env.progress
        .stage("source", "staging the devel stack the builds run in");
    stage_builder(inputs, env, tools, &root, &signals)?;
    let mut built = Vec::new();
    for (planned, blob) in missing.iter().zip(sdist_blobs) {
        let (sdist, _, key) = planned;
        env.progress.stage(
            "source",
            &format!(
                "building {} {} for {}",
                sdist.name, sdist.version, key.arch_list
            ),
        );
        built.push(build_one(settings, inputs, &root, planned, blob, &signals)?);
    }
    Ok(built)
}

/// A builder root, `<cache>/source-builds/builder-<random>/`, removed when dropped (on
/// every return, error or stop signal:), and held by the lock of
/// `builder-<random>.lock` while it lives: a root whose lock nobody holds was left by a
/// cudastack killed outright, and the next build removes it ([`remove_stale_builders`]).
struct BuilderRoot {
    dir: PathBuf,
    lock: PathBuf,
    _held: std::fs::File,
}

impl BuilderRoot {
    fn new(work: &Path) -> Result<Self, SourceBuildError> {
        // The lock first, held before its directory exists: a sweep never sees a live
        // root without a held lock.
        let lock = tempfile::Builder::new()
            .prefix("builder-")
            .suffix(".lock")
            .tempfile_in(work)
            .map_err(io_error(work))?;
        let (held, lock) = lock.keep().map_err(|e| io_error(work)(e.error))?;
        held.lock().map_err(io_error(&lock))?;
        let dir = lock.with_extension("");
        fs_err::create_dir(&dir).map_err(io_error(&dir))?;
        Ok(Self {
            dir,
            lock,
            _held: held,
        })
    }
}

impl Drop for BuilderRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.lock);
    }
}

/// Remove the builder roots of `work` whose lock no process holds (best effort).
fn remove_stale_builders(work: &Path) {
    let Ok(entries) = std::fs::read_dir(work) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let lock = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("builder-") && name.ends_with(".lock")) {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new().write(true).open(&lock) else {
            continue;
        };
        if file.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(lock.with_extension(""));
            let _ = std::fs::remove_file(&lock);
        }
    }
}

/// The devel stack of `inputs` with the builder's tools, merged into `root`: each layer's
/// staged tree (staged now if the cache has none), hard-linked in image order.
fn stage_builder(
    inputs: &PlatformInputs,
    env: &BuildEnv,
    tools: BuilderTools,
    root: &Path,
    signals: &StopSignals,
) -> Result<(), SourceBuildError> {
    let recipe = Recipe {
        cuda: crate::recipe::CudaSpec {
            version: inputs.recipe.cuda.version,
            flavor: Flavor::Devel,
        },
        copy: Vec::new(),
        user: None,
        ..inputs.recipe.clone()
    };
    let mut wheels = inputs.wheels.clone();
    wheels.extend(tools.wheels);
    let mut apt_debs = inputs.apt_debs.clone();
    apt_debs.extend(tools.debs);
    let builder = PlatformInputs {
        matrix: inputs.matrix,
        resolved: inputs.resolved,
        recipe: &recipe,
        platform: inputs.platform,
        lock: inputs.lock.clone(),
        wheels,
        torch_build: inputs.torch_build.clone(),
        base_debs: inputs.base_debs.clone(),
        apt_debs,
        context: inputs.context.clone(),
    };
    let planned = StackLayers::plan(&builder, env)?;
    fs_err::create_dir_all(root).map_err(io_error(root))?;
    for stager in planned.software() {
        if let Some(signal) = signals.caught() {
            return Err(SourceBuildError::Stopped {
                what: "staging the builder of the source builds".into(),
                signal,
            });
        }
        let dir = env.staging.ensure(stager.key(), |dir| stager.stage(dir))?;
        stager.staged(&dir)?;
        merge_tree(&dir, root)?;
    }
    Ok(())
}

/// `tree` onto `root` as hard links (upper layers replace what lower ones put there).
/// Hard links, not copies: the staged trees are gigabytes, and nothing in the build
/// writes to a file it did not create (PYTHONDONTWRITEBYTECODE; the build writes under
/// /build only).
fn merge_tree(tree: &Path, root: &Path) -> Result<(), SourceBuildError> {
    let output = Command::new("cp")
        .args(["-a", "-l", "--remove-destination", "--no-target-directory"])
        .arg(tree)
        .arg(root)
        .output()
        .map_err(io_error(Path::new("cp")))?;
    if !output.status.success() {
        return Err(SourceBuildError::Command {
            command: format!("cp -al {} {}", tree.display(), root.display()),
            status: output.status.to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}

/// Unpack `sdist` as `/build/<name>-<version>`, run pip in the chroot, keep the wheel and
/// the log in the cache entry of `key`.
fn build_one(
    settings: &BuildSettings,
    inputs: &PlatformInputs,
    root: &Path,
    (sdist, entry, key): &(Artifact, SourceBuild, BuildKey),
    blob: &Path,
    signals: &StopSignals,
) -> Result<BuiltWheel, SourceBuildError> {
    let final_dir = entry_dir(&settings.cache_root, key);
    // One build of a key at a time on a cache: a second build waits, then reuses.
    let lock_path = final_dir.with_extension("lock");
    let _held = crate::atomic_file::lock(&lock_path).map_err(io_error(&lock_path))?;
    if let Some(done) = cached_wheel(&settings.cache_root, key)? {
        return Ok(done);
    }
    let build = root.join("build");
    let _ = fs_err::remove_dir_all(&build);
    for dir in ["home", "tmp", "out", "unpack"] {
        fs_err::create_dir_all(build.join(dir)).map_err(io_error(&build))?;
    }
    let source = format!("{}-{}", sdist.name, sdist.version);
    unpack_sdist(blob, &build.join("unpack"), &build.join(&source))?;
    give_to_builder(&build)?;
    let parent = final_dir.parent().expect("an entry has a parent");
    let partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempdir_in(parent)
        .map_err(io_error(parent))?;
    let log = partial.path().join("build.log");
    let toolkit = inputs.paths();
    let site = crate::install::Scheme::debian_local(inputs.recipe.python).platlib;
    let paths = BuilderPaths {
        cuda_home: toolkit.home(),
        lib_dir: toolkit.lib_dir(),
        torch_lib: site.join("torch/lib").display().to_string(),
    };
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let vars = build_env(entry, key, &paths, jobs);
    let started = std::time::Instant::now();
    let command = pip_wheel(&format!("/build/{source}"));
    let sandbox = Sandbox {
        root,
        vars: &vars,
        command: &command,
        log: &log,
        timeout: settings
            .source_build_timeout
            .unwrap_or(DEFAULT_SOURCE_BUILD_TIMEOUT),
    };
    let status = match sandbox.run(signals)? {
        Ended::Exited(status) => status,
        Ended::TimedOut => {
            let kept = keep_failed_log(&log, &final_dir)?;
            return Err(SourceBuildError::TimedOut {
                package: sdist.name.clone(),
                version: sdist.version.clone(),
                limit: human_duration(sandbox.timeout),
                tail: log_tail(&kept),
                log: kept,
            });
        }
        Ended::Stopped(signal) => {
            return Err(SourceBuildError::Stopped {
                what: format!("the build of `{}` {}", sdist.name, sdist.version),
                signal,
            })
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    if !status.success() {
        let kept = keep_failed_log(&log, &final_dir)?;
        return Err(SourceBuildError::Failed {
            package: sdist.name.clone(),
            version: sdist.version.clone(),
            status: status.to_string(),
            tail: log_tail(&kept),
            log: kept,
        });
    }
    let made = read_out(root, &sdist.name, &sdist.version)?;
    let [(name, file)] = made.as_slice() else {
        return Err(SourceBuildError::NoWheel {
            package: sdist.name.clone(),
            version: sdist.version.clone(),
            found: made.len(),
            log: keep_failed_log(&log, &final_dir)?,
        });
    };
    check_built_wheel(name, key)?;
    copy_out(file, &partial.path().join(name))?;
    let mut wheel = finish_entry(
        partial,
        &final_dir,
        key,
        name,
        &format!("built in {seconds:.1} s"),
    )?;
    wheel.reused = false;
    Ok(wheel)
}

/// Make `partial` (holding the wheel `name` of `key`, and its `build.log` if any) the
/// cache entry `final_dir`: `key.json`, then the `complete` record (`how` the wheel came,
/// its sha256 and name), then one rename, so that an entry is whole or absent.
fn finish_entry(
    partial: tempfile::TempDir,
    final_dir: &Path,
    key: &BuildKey,
    name: &str,
    how: &str,
) -> Result<BuiltWheel, SourceBuildError> {
    let sha256 = file_sha256(&partial.path().join(name))?;
    let key_json = serde_json::to_vec_pretty(key).expect("serialises");
    crate::atomic_file::write(&partial.path().join("key.json"), &key_json)
        .map_err(io_error(partial.path()))?;
    crate::atomic_file::write(
        &partial.path().join("complete"),
        format!("{how}\nsha256 {} {name}\n", sha256.hex()).as_bytes(),
    )
    .map_err(io_error(partial.path()))?;
    let _ = fs_err::remove_dir_all(final_dir);
    let kept = partial.keep();
    fs_err::rename(&kept, final_dir).map_err(io_error(final_dir))?;
    Ok(BuiltWheel {
        package: key.package.clone(),
        wheel: FetchedWheel {
            path: final_dir.join(name),
            sha256,
            version: key.version.clone(),
        },
        log: final_dir.join("build.log"),
        reused: true,
    })
}

/// Put a wheel of `key` that was built elsewhere (`wheel`: a file of the blob store,
/// checked against the digest its source gave) into the cache as that key's entry, with
/// its build `log`: `how` says where it came from. Its name must be a wheel of the key's
/// package and version, as a local build's must. Whole or not at all; a concurrent build
/// of the same key is waited for, and an entry it finished is kept.
pub fn store_fetched_wheel(
    cache_root: &Path,
    key: &BuildKey,
    name: &str,
    wheel: &Path,
    log: &[u8],
    how: &str,
) -> Result<BuiltWheel, SourceBuildError> {
    check_wheel_name(name, key)?;
    let final_dir = entry_dir(cache_root, key);
    let parent = final_dir.parent().expect("an entry has a parent");
    fs_err::create_dir_all(parent).map_err(io_error(parent))?;
    let lock_path = final_dir.with_extension("lock");
    let _held = crate::atomic_file::lock(&lock_path).map_err(io_error(&lock_path))?;
    if let Some(done) = cached_wheel(cache_root, key)? {
        return Ok(done);
    }
    let partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempdir_in(parent)
        .map_err(io_error(parent))?;
    let target = partial.path().join(name);
    fs_err::copy(wheel, &target).map_err(io_error(&target))?;
    let log_path = partial.path().join("build.log");
    crate::atomic_file::write(&log_path, log).map_err(io_error(&log_path))?;
    finish_entry(partial, &final_dir, key, name, how)
}

/// Refused unless `name` is one file name (never a path out of an entry), of a wheel of
/// the key's own package and version: what a wheel from elsewhere must be called, checked
/// before it is fetched.
pub fn check_wheel_name(name: &str, key: &BuildKey) -> Result<(), SourceBuildError> {
    crate::fetch::file_name::FileName::new(name)
        .map_err(|error| error.to_string())
        .and_then(|_| wheel_of(name, key))
        .map_err(|why| SourceBuildError::FetchedWheelName {
            package: key.package.clone(),
            version: key.version.clone(),
            name: name.to_string(),
            why,
        })
}

/// The uid and gid the build runs as (nobody): root in the chroot could leave it, and
/// could write through the hard links of the builder root into the cache's staged trees
/// that later images are made of. Only `/build` is theirs.
const BUILDER_UID: u32 = 65534;

/// Hand `/build` (the sdist, HOME, TMPDIR, the output directory) to [`BUILDER_UID`].
fn give_to_builder(build: &Path) -> Result<(), SourceBuildError> {
    let mut pending = vec![build.to_path_buf()];
    while let Some(path) = pending.pop() {
        std::os::unix::fs::lchown(&path, Some(BUILDER_UID), Some(BUILDER_UID))
            .map_err(io_error(&path))?;
        if fs_err::symlink_metadata(&path)
            .map_err(io_error(&path))?
            .is_dir()
        {
            for entry in fs_err::read_dir(&path).map_err(io_error(&path))? {
                pending.push(entry.map_err(io_error(&path))?.path());
            }
        }
    }
    Ok(())
}

/// The build's output is named for the sdist's own name and version (a `setup.py` saying
/// `name="torch"` must not install torch under the sdist's name).
fn check_built_wheel(name: &str, sdist: &BuildKey) -> Result<(), SourceBuildError> {
    wheel_of(name, sdist).map_err(|why| SourceBuildError::UnexpectedWheel {
        package: sdist.package.clone(),
        version: sdist.version.clone(),
        name: name.to_string(),
        why,
    })
}

/// Why `name` is not a wheel file name of `sdist`'s own package and version, if it is not.
fn wheel_of(name: &str, sdist: &BuildKey) -> Result<(), String> {
    let parsed: crate::names::WheelFilename = name
        .parse()
        .map_err(|e| format!("its name is no wheel file name ({e})"))?;
    let same_name = crate::names::normalize_name(parsed.name.as_ref())
        == crate::names::normalize_name(&sdist.package);
    let same_version = sdist
        .version
        .parse::<pep440_rs::Version>()
        .is_ok_and(|version| version == parsed.version);
    if !same_name || !same_version {
        return Err(format!(
            "it is {} {}, not the sdist's {} {}",
            parsed.name, parsed.version, sdist.package, sdist.version
        ));
    }
    Ok(())
}

/// `4 h 1 min 30 s`: a timeout as a person reads it.
fn human_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let parts = [
        (seconds / 3600, "h"),
        (seconds / 60 % 60, "min"),
        (seconds % 60, "s"),
    ];
    let shown: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n} {unit}"))
        .collect();
    if shown.is_empty() {
        format!("{} ms", duration.as_millis())
    } else {
        shown.join(" ")
    }
}

/// A failed build's log, kept as `<entry>.failed.log` beside where the wheel would be.
fn keep_failed_log(log: &Path, final_dir: &Path) -> Result<PathBuf, SourceBuildError> {
    let kept = final_dir.with_extension("failed.log");
    fs_err::copy(log, &kept).map_err(io_error(&kept))?;
    Ok(kept)
}

/// The last [`LOG_TAIL`] lines of `log`, indented.
fn log_tail(log: &Path) -> String {
    let Ok(file) = std::fs::File::open(log) else {
        return "  (no log)".into();
    };
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .collect();
    lines[lines.len().saturating_sub(LOG_TAIL)..]
        .iter()
        .map(|line| format!("  | {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The most an sdist may unpack to: flash-attn 2.6.3's, with its CUTLASS copy, is ~60 MB.
const MAX_SDIST_BYTES: u64 = 2 << 30;
const MAX_SDIST_MEMBERS: usize = 200_000;

/// The sdist's single top directory, unpacked (the tar crate keeps every member inside
/// `scratch`) and renamed to `dest`.
fn unpack_sdist(blob: &Path, scratch: &Path, dest: &Path) -> Result<(), SourceBuildError> {
    let mut file = std::io::BufReader::new(fs_err::File::open(blob).map_err(io_error(blob))?);
    // A published sdist is a gzip tar; a git requirement's tree is a plain one.
    let gzip = std::io::BufRead::fill_buf(&mut file)
        .map_err(io_error(blob))?
        .starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn std::io::Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(false);
    fs_err::create_dir_all(scratch).map_err(io_error(scratch))?;
    // An sdist is source: a bomb of a few KB must not fill the cache's disk.
    let (mut bytes, mut members) = (0u64, 0usize);
    for entry in archive.entries().map_err(io_error(blob))? {
        let mut entry = entry.map_err(io_error(blob))?;
        bytes = bytes.saturating_add(entry.header().size().unwrap_or(u64::MAX));
        members += 1;
        if bytes > MAX_SDIST_BYTES || members > MAX_SDIST_MEMBERS {
            return Err(SourceBuildError::SdistTooLarge {
                sdist: blob.to_path_buf(),
                max_bytes: MAX_SDIST_BYTES,
                max_members: MAX_SDIST_MEMBERS,
            });
        }
        entry.unpack_in(scratch).map_err(io_error(blob))?;
    }
    let tops: Vec<PathBuf> = fs_err::read_dir(scratch)
        .map_err(io_error(scratch))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    let [top] = tops.as_slice() else {
        return Err(SourceBuildError::SdistNotOneDirectory {
            sdist: blob.to_path_buf(),
            found: tops.len(),
        });
    };
    fs_err::rename(top, dest).map_err(io_error(dest))?;
    let _ = fs_err::remove_dir(scratch);
    Ok(())
}

/// The build command: `pip wheel` of `source`, its wheel to `/build/out`.
fn pip_wheel(source: &str) -> Vec<String> {
    [
        "python3",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--wheel-dir",
        "/build/out",
        "--verbose",
        source,
    ]
    .map(String::from)
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(gpus: &str) -> Recipe {
        Recipe::parse(
            &format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.1\" }}\ntorch: {{ version: \"2.4.1\" }}\ngpus: {gpus}\nbuild: [{{package: torchsort, version: 0.1.10, env: {{FORCE_CUDA: \"1\"}}}}]\n"),
            Path::new("t.yaml"),
        )
        .unwrap()
    }

    /// The arch list of a CUDA 12.1 recipe's `gpus:`, resolved as validation resolves them.
    fn arch_list_of(gpus: &[&str]) -> Result<String, SourceBuildError> {
        let matrix = Matrix::embedded();
        let gpus: Vec<TargetGpu> = gpus
            .iter()
            .map(|name| matrix.target_gpu(name).expect("in the matrix"))
            .collect();
        arch_list(matrix, "12.1".parse().unwrap(), &gpus, "torchsort")
    }

    #[test]
    fn the_arch_list_has_sass_for_each_gpu_and_ptx_for_the_newest() {
        assert_eq!(arch_list_of(&["RTX 4090"]).unwrap(), "8.9+PTX");
        assert_eq!(
            arch_list_of(&["H100", "RTX 4090", "A100", "NVIDIA A100"]).unwrap(),
            "8.0;8.9;9.0+PTX"
        );
        assert_eq!(arch_list_of(&["8.6"]).unwrap(), "8.6+PTX");
        let error = arch_list_of(&["RTX 5090"]).unwrap_err().to_string();
        assert!(
            error.contains("CUDA 12.1's nvcc cannot compile for sm_120 (GPU `GeForce RTX 5090`)"),
            "{error}"
        );
    }

    #[test]
    fn the_key_changes_with_each_input_and_the_env_is_cudastacks() {
        let recipe = recipe("[\"RTX 4090\"]");
        let key = BuildKey {
            builder: BUILDER,
            package: "torchsort".into(),
            version: "0.1.10".into(),
            sdist_sha256: Digest::of_bytes(b"sdist"),
            builder_digest: Digest::of_bytes(b"builder"),
            arch_list: "8.9+PTX".into(),
            env: recipe.build[0].env.clone(),
            source_date_epoch: 0,
        };
        let same = key.clone();
        assert_eq!(key.digest(), same.digest());
        let changed = [
            BuildKey {
                arch_list: "8.9;9.0+PTX".into(),
                ..key.clone()
            },
            BuildKey {
                sdist_sha256: Digest::of_bytes(b"other"),
                ..key.clone()
            },
            BuildKey {
                builder_digest: Digest::of_bytes(b"other"),
                ..key.clone()
            },
            BuildKey {
                env: BTreeMap::new(),
                ..key.clone()
            },
            BuildKey {
                source_date_epoch: 1,
                ..key.clone()
            },
        ];
        for other in changed {
            assert_ne!(other.digest(), key.digest(), "{other:?}");
        }
        let paths = BuilderPaths {
            cuda_home: "/usr/local/cuda-12.1".into(),
            lib_dir: "/usr/local/cuda-12.1/lib64".into(),
            torch_lib: "/usr/local/lib/python3.11/dist-packages/torch/lib".into(),
        };
        let env = build_env(&recipe.build[0], &key, &paths, 16);
        assert_eq!(
            env["LDFLAGS"],
            "-Wl,-rpath,/usr/local/lib/python3.11/dist-packages/torch/lib"
        );
        assert_eq!(env["TORCH_CUDA_ARCH_LIST"], "8.9+PTX");
        assert_eq!(env["MAX_JOBS"], "16");
        assert_eq!(env["SOURCE_DATE_EPOCH"], "0");
        assert_eq!(env["CUDA_HOME"], "/usr/local/cuda-12.1");
        assert_eq!(env["FORCE_CUDA"], "1");
        assert!(env["PATH"].starts_with("/usr/local/cuda-12.1/bin:"));
    }

    #[test]
    fn trees_merge_upper_over_lower_as_hard_links() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper, root) = (
            dir.path().join("lower"),
            dir.path().join("upper"),
            dir.path().join("root"),
        );
        for (tree, text) in [(&lower, "lower"), (&upper, "upper")] {
            std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
            std::fs::write(tree.join("usr/bin/tool"), text).unwrap();
        }
        std::fs::write(lower.join("usr/bin/only-lower"), "x").unwrap();
        std::os::unix::fs::symlink("tool", upper.join("usr/bin/alias")).unwrap();
        std::fs::create_dir(&root).unwrap();
        merge_tree(&lower, &root).unwrap();
        merge_tree(&upper, &root).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("usr/bin/tool")).unwrap(),
            "upper"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("usr/bin/only-lower")).unwrap(),
            "x"
        );
        assert_eq!(
            std::fs::read_link(root.join("usr/bin/alias")).unwrap(),
            Path::new("tool")
        );
        let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(
            inode(&root.join("usr/bin/tool")),
            inode(&upper.join("usr/bin/tool"))
        );
    }

    fn gzip_tar(members: &[&str]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for path in members {
            let mut header = tar::Header::new_gnu();
            header.set_size(1);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, path, &b"x"[..]).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn an_sdist_unpacks_under_the_fixed_path_and_its_log_tail_is_shown() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(
            &blob,
            gzip_tar(&[
                "cuda_ext-0.1.0/setup.py",
                "cuda_ext-0.1.0/cuda_ext/scale.cu",
            ]),
        )
        .unwrap();
        let dest = dir.path().join("build/cuda-ext-0.1.0");
        std::fs::create_dir_all(dir.path().join("build/unpack")).unwrap();
        unpack_sdist(&blob, &dir.path().join("build/unpack"), &dest).unwrap();
        assert!(dest.join("setup.py").is_file() && dest.join("cuda_ext/scale.cu").is_file());
        std::fs::write(&blob, gzip_tar(&["a/setup.py", "b/setup.py"])).unwrap();
        let error = unpack_sdist(&blob, &dir.path().join("other"), &dir.path().join("x"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("has 2 top-level entries"), "{error}");
        // A member claiming 3 GiB is refused from its header, before anything is written.
        let mut header = tar::Header::new_gnu();
        header.set_path("bomb-1.0/big").unwrap();
        header.set_size(3 << 30);
        header.set_mode(0o644);
        header.set_cksum();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, header.as_bytes()).unwrap();
        std::fs::write(&blob, gz.finish().unwrap()).unwrap();
        let error = unpack_sdist(&blob, &dir.path().join("bomb"), &dir.path().join("y"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unpacks to more than 2048 MiB"), "{error}");
        assert!(!dir.path().join("bomb/bomb-1.0/big").exists());
        let log = dir.path().join("build.log");
        let text: String = (1..=100).map(|n| format!("line {n}\n")).collect();
        std::fs::write(&log, text).unwrap();
        let tail = log_tail(&log);
        assert_eq!(tail.lines().count(), LOG_TAIL);
        assert!(
            tail.starts_with("  | line 61\n") && tail.ends_with("  | line 100"),
            "{tail}"
        );
    }
}
