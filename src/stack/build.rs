//! `cudastack build`: a validated, locked recipe -> an OCI image of five layers
//! (base, CUDA toolkit, cuDNN, Python wheels, config with the verification probe), audited,
//! written to an OCI layout.
//!
//! Each layer has a cache key over exactly the inputs that decide its contents (the
//! assembler version, the digests of the artifacts it reads, the options), so a changed
//! torch version rebuilds only the Python and config layers, and a no-op rebuild does no
//! tar or compression work at all. Staged trees are kept per key under the cache so the
//! static audit can look at the whole filesystem without unpacking blobs again; when every
//! layer and the audit verdict are cached, nothing is staged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde::Serialize;

use crate::audit::{audit, AuditOptions};
use crate::cas::BlobStore;
use crate::digest::Digest;
use crate::fetch::download::{Downloader, FetchItem};
use crate::fetch::http::HttpClient;
use crate::fetch::progress::Reporter;
use crate::install::{
    apply_entries, plan_with_reader, EntryContent, InstallOptions, Scheme, WheelReader,
};
use crate::layer::{
    BuildOptions, CacheKey, Compression, DirOptions, Layer, LayerCache, LayerContents, ModePolicy,
};
use crate::lock::lockfile::{Artifact, ArtifactKind, Lockfile};
use crate::matrix::validate::{selected_torch_build, validate, Problem};
use crate::matrix::Matrix;
use crate::oci::{self, Image};
use crate::recipe::{Base, Platform, Recipe};
use crate::stack::base::{debootstrap, inspect_rootfs, DebootstrapSpec, RootfsFacts};
use crate::stack::config::{ld_so_conf, stack_config, StackFacts, ToolkitPaths};
use crate::stack::inputs::platform_lock_path;
use crate::stack::ldcache;
use crate::stack::toolkit::{self, NvidiaWheel, Placement};
use crate::verify::{self, expect::Expectations};

/// Bump when what an assembler writes changes; it is part of every cache key.
const ASSEMBLER: &str = concat!("cudastack-", env!("CARGO_PKG_VERSION"), "-stack-1");

/// The timestamp used when neither the recipe nor the environment gives one:
/// 2024-01-01T00:00:00Z. Fixed, so builds stay reproducible; recipes should set their own.
pub const DEFAULT_SOURCE_DATE_EPOCH: u64 = 1_704_067_200;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Recipe(#[from] crate::recipe::RecipeError),
    #[error("recipe `{recipe}` is not valid:\n{}", render_problems(problems))]
    Invalid {
        recipe: String,
        problems: Vec<Problem>,
    },
    #[error("recipe `{recipe}` has no lock file `{lock}`; run `cudastack lock {recipe}` first")]
    NoLock { recipe: PathBuf, lock: PathBuf },
    #[error("lock file `{lock}` is stale: it was made from another version of the recipe\n  Expected: {expected}\n  Found:    {found}\nrun `cudastack lock {recipe}` again")]
    StaleLock {
        recipe: PathBuf,
        lock: PathBuf,
        expected: Digest,
        found: Digest,
    },
    #[error(transparent)]
    Lockfile(#[from] crate::lock::lockfile::LockfileError),
    #[error(transparent)]
    Download(#[from] crate::fetch::download::DownloadError),
    #[error(transparent)]
    Http(#[from] crate::fetch::http::HttpError),
    #[error(transparent)]
    Cas(#[from] crate::cas::CasError),
    #[error(transparent)]
    Base(#[from] crate::stack::base::BaseError),
    #[error(transparent)]
    Toolkit(#[from] crate::stack::toolkit::ToolkitError),
    #[error(transparent)]
    Install(#[from] crate::install::InstallError),
    #[error(transparent)]
    Layer(#[from] crate::layer::LayerError),
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    #[error("the static audit of the assembled image failed:\n{0}")]
    AuditFailed(String),
    #[error(
        "the base {base} provides {what} {found}, but the wheels need {expected}\n  hint: {hint}"
    )]
    BaseMismatch {
        base: String,
        what: &'static str,
        found: String,
        expected: String,
        hint: String,
    },
    #[error("{0}")]
    Unsupported(String),
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

fn render_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  error[{}]: {}\n    hint: {}", p.code, p.what, p.hint))
        .collect::<Vec<_>>()
        .join("\n")
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What to build and where.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    pub recipe_path: PathBuf,
    /// Blob store, layer cache and staging root (`~/.cache/cudastack`).
    pub cache_root: PathBuf,
    /// The OCI layout to write; `images/NAME` when None.
    pub layout_dir: Option<PathBuf>,
    pub compression: Compression,
    /// Use only the blob cache; fail listing what is missing.
    pub offline: bool,
    /// Directories a lock's `file://` URLs may point into (`--mirror`); none by default.
    pub mirrors: Vec<PathBuf>,
    /// Substituted for `{registry}` in tag templates.
    pub registry: String,
    /// The platforms to build; the recipe's `platforms` when None.
    pub platforms: Option<Vec<Platform>>,
}

/// Progress lines, one per stage; downloads get their own reporter (bars).
pub trait BuildProgress: Send + Sync {
    fn stage(&self, stage: &str, detail: &str);
    fn downloads(&self) -> Arc<dyn Reporter>;
}

#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    pub name: &'static str,
    pub digest: Digest,
    pub diff_id: Digest,
    pub size: u64,
    /// True when the layer came from the cache with no tar or compression work.
    pub cached: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    pub recipe: String,
    /// What `ref_name` names: the image manifest, or with several platforms the image index.
    pub manifest_digest: Digest,
    pub layout: PathBuf,
    pub ref_name: String,
    pub tags: Vec<String>,
    /// The ref of the image of the build host's platform, which the verification stage and
    /// `--load` run (`latest`, or `latest-linux-amd64` beside an index); None when the
    /// host's platform was not built.
    pub host_ref: Option<String>,
    /// The first platform's layers, size and audit (the only one in a single-platform build).
    pub layers: Vec<LayerReport>,
    /// Compressed size of all layers.
    pub size: u64,
    pub audit: AuditSummary,
    pub audit_cached: bool,
    pub platforms: Vec<PlatformReport>,
}

/// One platform's image of a build.
#[derive(Debug, Clone, Serialize)]
pub struct PlatformReport {
    pub platform: String,
    pub manifest_digest: Digest,
    /// Its own ref in the layout when the build has several platforms.
    pub ref_name: String,
    pub layers: Vec<LayerReport>,
    pub size: u64,
    pub audit: AuditSummary,
    pub audit_cached: bool,
}

/// One platform's assembled image, before it is written.
struct Assembled {
    platform: Platform,
    image: Image,
    layers: Vec<LayerReport>,
    audit: AuditSummary,
    audit_cached: bool,
    facts: StackFacts,
}

/// What the static audit looked at (it found nothing wrong, or the build failed).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct AuditSummary {
    pub elf_files: usize,
    pub needed_checked: usize,
    pub symlinks: usize,
    pub distributions: usize,
}

/// Render the recipe's tag templates, each checked as an image reference
/// ([`Recipe::render_tags`]; a bad `--registry` is an error naming the tag).
pub fn render_tags(
    recipe_path: &Path,
    recipe: &Recipe,
    torch: Option<&str>,
    cudnn: Option<&str>,
    registry: &str,
) -> Result<Vec<String>, crate::recipe::RecipeError> {
    recipe
        .render_tags(&recipe.tag_values(registry, torch, cudnn))
        .map_err(|error| crate::recipe::RecipeError::Tag {
            path: recipe_path.to_path_buf(),
            error,
        })
}

/// A staged tree, kept per cache key so audits and later builds can reuse it.
///
/// Several builds may share one cache (CI runners, a user's parallel builds; issue 16).
/// Each tree has a lock file (`<key-hex>.lock`, `flock(2)`): a build stages a tree only
/// while holding it, and the tree counts only once its `.complete` marker exists, which
/// is renamed into place after the tree and its records are whole. So a second build of
/// the same tree waits and then reuses it, builds of different trees run in parallel,
/// and a complete tree is never removed or rewritten. Scratch trees (the merged root for
/// `ldconfig` and the audit) are private to each build ([`Staging::scratch`]).
struct Staging {
    root: PathBuf,
}

impl Staging {
    fn open(cache_root: &Path) -> Result<Self, BuildError> {
        let root = cache_root.join("staging");
        fs_err::create_dir_all(&root).map_err(io_error(&root))?;
        Ok(Self { root })
    }
    fn dir(&self, key: &CacheKey) -> PathBuf {
        self.root.join(key.digest().hex())
    }
    fn is_complete(&self, key: &CacheKey) -> bool {
        self.root
            .join(format!("{}.complete", key.digest().hex()))
            .exists()
    }
    /// Stage into a fresh directory with `fill`, marking it complete only on success, so an
    /// interrupted build never leaves a half-staged tree that looks finished; under the
    /// tree's lock, so concurrent builds never stage the same tree at once.
    fn ensure(
        &self,
        key: &CacheKey,
        fill: impl FnOnce(&Path) -> Result<(), BuildError>,
    ) -> Result<PathBuf, BuildError> {
        let dir = self.dir(key);
        if self.is_complete(key) && dir.is_dir() {
            return Ok(dir);
        }
        let lock_path = self.root.join(format!("{}.lock", key.digest().hex()));
        let _lock = crate::atomic_file::lock(&lock_path).map_err(io_error(&lock_path))?;
        // Another build may have staged it while this one waited.
        if self.is_complete(key) && dir.is_dir() {
            return Ok(dir);
        }
        // What is there is a partial tree of a build that died: start over.
        if fs_err::symlink_metadata(&dir).is_ok() {
            fs_err::remove_dir_all(&dir).map_err(io_error(&dir))?;
        }
        fs_err::create_dir_all(&dir).map_err(io_error(&dir))?;
        if let Err(error) = fill(&dir) {
            let _ = fs_err::remove_dir_all(&dir);
            return Err(error);
        }
        let marker = self.root.join(format!("{}.complete", key.digest().hex()));
        write_record(&marker, b"")?;
        Ok(dir)
    }
    /// A new empty directory for this build alone (named after `key`, removed when dropped),
    /// on the staging filesystem so trees can be hard-linked into it.
    fn scratch(&self, key: &CacheKey, what: &str) -> Result<tempfile::TempDir, BuildError> {
        tempfile::Builder::new()
            .prefix(&format!("{}.{what}-", key.digest().hex()))
            .tempdir_in(&self.root)
            .map_err(io_error(&self.root))
    }
}

/// Write a small record of the cache (a marker, a scan result, audit facts) whole or not
/// at all, so a concurrent build never reads half of one.
fn write_record(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    crate::atomic_file::write(path, bytes).map_err(io_error(path))
}

/// The recipe's `source_date_epoch`, else `$SOURCE_DATE_EPOCH`, else the default. The
/// environment value is checked as the recipe's is: a value that is not a number, or is past
/// year 9999, is an error rather than silently another timestamp.
fn source_date_epoch(recipe: &Recipe) -> Result<u64, BuildError> {
    if let Some(epoch) = recipe.source_date_epoch {
        return Ok(epoch);
    }
    let Some(value) = std::env::var_os("SOURCE_DATE_EPOCH") else {
        return Ok(DEFAULT_SOURCE_DATE_EPOCH);
    };
    let text = value.to_string_lossy();
    let epoch: u64 = text.trim().parse().map_err(|_| {
        BuildError::Unsupported(format!(
            "SOURCE_DATE_EPOCH is `{}`, not a number of seconds since 1970\n  hint: unset it, or set it to e.g. `date -d 2024-06-01 +%s`",
            text.escape_debug()
        ))
    })?;
    crate::recipe::check_source_date_epoch(epoch)
        .map_err(|why| BuildError::Unsupported(format!("SOURCE_DATE_EPOCH: {why}")))
}

pub async fn build(
    settings: &BuildSettings,
    matrix: &Matrix,
    progress: &dyn BuildProgress,
) -> Result<BuildReport, BuildError> {
    // 1. Recipe, validation, lock.
    let recipe = Recipe::load(&settings.recipe_path)?;
    let validation = validate(matrix, &recipe);
    if !validation.is_valid() {
        return Err(BuildError::Invalid {
            recipe: recipe.name.clone(),
            problems: validation.errors().cloned().collect(),
        });
    }
    // The tags with this build's --registry, before anything is fetched.
    render_tags(
        &settings.recipe_path,
        &recipe,
        None,
        None,
        &settings.registry,
    )?;
    let platforms = match &settings.platforms {
        Some(requested) => {
            let declared = recipe.platforms();
            if let Some(missing) = requested.iter().find(|p| !declared.contains(p)) {
                return Err(BuildError::Unsupported(format!(
                    "recipe `{}` is not made for {missing} (its platforms: {}); add it to `platforms:` and run `cudastack lock` again",
                    recipe.name,
                    declared.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
                )));
            }
            requested.clone()
        }
        None => recipe.platforms(),
    };
    let torch_build = selected_torch_build(matrix, &recipe);
    let epoch = source_date_epoch(&recipe)?;
    let options = BuildOptions::new(epoch, settings.compression);
    let store = BlobStore::open(&settings.cache_root)?;
    let cache = LayerCache::open(store.clone())?;
    let staging = Staging::open(&settings.cache_root)?;

    // 2. Every platform's lock and artifacts first, so a platform that cannot work (no
    //    kernels for a recipe GPU in its own wheel) fails before any layer is assembled.
    let mut inputs = Vec::new();
    for &platform in &platforms {
        if platforms.len() > 1 {
            progress.stage("platform", platform.as_str());
        }
        let lock = read_lock(settings, &recipe, platform)?;
        let wheel_paths = fetch_wheels(settings, &lock, &store, progress).await?;
        // The arch list this platform's torch wheel really carries (aarch64 builds carry
        // fewer SASS targets than the x86_64 one the matrix was read from), so the labels
        // and the probe's expectations describe this image.
        let platform_build = match (torch_build, wheel_paths.get("torch")) {
            (Some(build), Some((wheel, sha256, _))) => Some(tokio::task::block_in_place(|| {
                with_wheel_arch_list(
                    build,
                    wheel,
                    &staging
                        .root
                        .join(format!("arch-list-{}.json", sha256.hex())),
                    progress,
                )
            })?),
            (build, _) => build.cloned(),
        };
        if let Some(build) = &platform_build {
            let problems = crate::matrix::validate::gpu_errors(matrix, &recipe, build);
            if !problems.is_empty() {
                return Err(BuildError::Invalid {
                    recipe: format!("{} ({platform})", recipe.name),
                    problems,
                });
            }
        }
        inputs.push((platform, lock, wheel_paths, platform_build));
    }
    // 3. Layers. Heavy work runs on blocking threads.
    let mut assembled = Vec::new();
    for (platform, lock, wheel_paths, platform_build) in &inputs {
        if platforms.len() > 1 {
            progress.stage("platform", &format!("{platform}: layers"));
        }
        assembled.push(tokio::task::block_in_place(|| {
            assemble(
                matrix,
                &recipe,
                platform_build.as_ref(),
                lock,
                *platform,
                wheel_paths,
                &cache,
                &staging,
                &options,
                progress,
            )
        })?);
    }
    write_output(settings, &recipe, assembled, progress)
}

/// `build` with the CUDA arch list read from `wheel`'s libtorch_python.so (streamed out of
/// the zip, as `matrix refresh` reads it over HTTP); the matrix's list when none is found.
fn with_wheel_arch_list(
    build: &crate::matrix::TorchBuild,
    wheel: &Path,
    record: &Path,
    progress: &dyn BuildProgress,
) -> Result<crate::matrix::TorchBuild, BuildError> {
    // What a wheel carries never changes: scanned once per wheel digest.
    let scanned: Option<(Vec<crate::version::ComputeCapability>, bool)> = match fs_err::read(record)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
    {
        Some(found) => found,
        None => {
            let found = scan_wheel_arch_list(wheel)?;
            write_record(record, &serde_json::to_vec(&found).expect("serialises"))?;
            found
        }
    };
    let Some((arch_list, ptx)) = scanned else {
        progress.stage(
            "torch",
            &format!(
                "no CUDA arch list found in {}: labels use the matrix row's",
                crate::matrix::refresh::ARCH_MEMBER
            ),
        );
        return Ok(build.clone());
    };
    if arch_list != build.arch_list {
        let sm = |list: &[crate::version::ComputeCapability]| {
            list.iter().map(|cc| cc.sm()).collect::<Vec<_>>().join(" ")
        };
        progress.stage(
            "torch",
            &format!(
                "this wheel carries {} (the matrix row, read from another wheel: {})",
                sm(&arch_list),
                sm(&build.arch_list)
            ),
        );
    }
    Ok(crate::matrix::TorchBuild {
        arch_list,
        ptx,
        ..build.clone()
    })
}

/// The arch list in `wheel`'s libtorch_python.so, streamed out of the zip.
fn scan_wheel_arch_list(
    wheel: &Path,
) -> Result<Option<(Vec<crate::version::ComputeCapability>, bool)>, BuildError> {
    use std::io::Read;
    let file = fs_err::File::open(wheel).map_err(io_error(wheel))?;
    let zip_error = |e: zip::result::ZipError| BuildError::Io {
        path: wheel.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    };
    let mut archive = zip::ZipArchive::new(file).map_err(zip_error)?;
    let mut member = match archive.by_name(crate::matrix::refresh::ARCH_MEMBER) {
        Ok(member) => member,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(zip_error(e)),
    };
    let mut scanner = crate::matrix::refresh::ArchScanner::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let read = member.read(&mut chunk).map_err(io_error(wheel))?;
        if read == 0 {
            break;
        }
        scanner.feed(&chunk[..read]);
    }
    Ok(scanner.finish())
}

/// The lock of `platform`, present and made from this recipe.
fn read_lock(
    settings: &BuildSettings,
    recipe: &Recipe,
    platform: Platform,
) -> Result<Lockfile, BuildError> {
    let lock_file = platform_lock_path(&settings.recipe_path, platform);
    if !lock_file.exists() {
        return Err(BuildError::NoLock {
            recipe: settings.recipe_path.clone(),
            lock: lock_file,
        });
    }
    let lock = Lockfile::read(&lock_file)?;
    if lock.is_stale(&recipe.digest()) {
        return Err(BuildError::StaleLock {
            recipe: settings.recipe_path.clone(),
            lock: lock_file,
            expected: recipe.digest(),
            found: lock.recipe_digest,
        });
    }
    let wanted = crate::stack::inputs::platform_arch(platform);
    if lock.target.arch != wanted {
        return Err(BuildError::Unsupported(format!(
            "lock file `{}` is for {} wheels, but {platform} needs {wanted}; run `cudastack lock {}` again",
            lock_file.display(),
            lock.target.arch,
            settings.recipe_path.display()
        )));
    }
    Ok(lock)
}

/// Download (or find in the blob store) every wheel of `lock`, each linked under its file
/// name: wheel name -> (path, sha256, version).
async fn fetch_wheels(
    settings: &BuildSettings,
    lock: &Lockfile,
    store: &BlobStore,
    progress: &dyn BuildProgress,
) -> Result<BTreeMap<String, (PathBuf, Digest, String)>, BuildError> {
    let wheels: Vec<_> = lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Wheel)
        .collect();
    if lock
        .artifacts
        .iter()
        .any(|a| a.kind == ArtifactKind::RedistArchive)
    {
        return Err(BuildError::Unsupported("this lock names NVIDIA redist archives; `cudastack build` installs the CUDA stack from nvidia-* wheels so far".into()));
    }
    // URLs and file names were checked when the lock was read (`Artifact::check`).
    let items: Vec<FetchItem> = wheels.iter().map(|a| a.fetch_item()).collect();
    let downloader = Downloader::new(
        HttpClient::with_defaults()?,
        store.clone(),
        progress.downloads(),
    )
    .offline(settings.offline)
    .mirrors(settings.mirrors.clone());
    let missing = downloader.missing(&items).len();
    progress.stage(
        "fetch",
        &format!("{} artifacts, {} to download", items.len(), missing),
    );
    let paths = downloader.fetch_all(&items).await?;
    // Blobs are named by digest; the installer reads a wheel's tags from its file name, so
    // each gets a link under its real name.
    let named = settings.cache_root.join("wheels");
    fs_err::create_dir_all(&named).map_err(io_error(&named))?;
    let mut wheel_paths: BTreeMap<String, (PathBuf, Digest, String)> = BTreeMap::new();
    for (artifact, blob) in wheels.iter().zip(paths) {
        let link = link_wheel(&named, artifact, &blob)?;
        wheel_paths.insert(
            artifact.name.clone(),
            (link, artifact.sha256, artifact.version.clone()),
        );
    }
    Ok(wheel_paths)
}

/// `wheels/<sha256>/<filename>` -> the blob. One directory per digest: two indexes may serve
/// different bytes under one file name (PyPI's and PyTorch's torch wheels), and neither may
/// replace the other's link. The link is made under a temp name and renamed into place, so a
/// concurrent build of the same wheel sees the old link or the new one, never none (the
/// remove-then-create it replaced failed with "File exists" when two builds met).
fn link_wheel(named: &Path, artifact: &Artifact, blob: &Path) -> Result<PathBuf, BuildError> {
    let dir = named.join(artifact.sha256.hex());
    fs_err::create_dir_all(&dir).map_err(io_error(&dir))?;
    // A `FileName` is one plain component: the link is always directly in `dir`.
    let link = dir.join(artifact.filename.as_path());
    if fs_err::read_link(&link).is_ok_and(|target| target == blob) {
        return Ok(link);
    }
    let temp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        artifact.filename.as_path().display()
    ));
    let _ = std::fs::remove_file(&temp);
    std::os::unix::fs::symlink(blob, &temp).map_err(io_error(&temp))?;
    fs_err::rename(&temp, &link).map_err(|source| {
        let _ = std::fs::remove_file(&temp);
        BuildError::Io {
            path: link.clone(),
            source,
        }
    })?;
    Ok(link)
}

/// The OCI platform of a recipe platform.
fn oci_platform(platform: Platform) -> oci_spec::image::Platform {
    let mut oci = oci_spec::image::Platform::default();
    oci.set_os(oci_spec::image::Os::Linux);
    oci.set_architecture(match platform {
        Platform::LinuxAmd64 => oci_spec::image::Arch::Amd64,
        Platform::LinuxArm64 => oci_spec::image::Arch::ARM64,
    });
    oci
}

/// `latest` -> `latest-linux-arm64`: the ref of one platform's image beside the index.
pub fn platform_ref(ref_name: &str, platform: Platform) -> String {
    oci::layout::platform_ref_name(ref_name, platform.oci_architecture())
}

/// Write the assembled images into the OCI layout: one image under `latest` and the
/// recipe's tags, or with several platforms each image under its platform ref and an image
/// index over them under `latest` and the tags.
fn write_output(
    settings: &BuildSettings,
    recipe: &Recipe,
    assembled: Vec<Assembled>,
    progress: &dyn BuildProgress,
) -> Result<BuildReport, BuildError> {
    let first = assembled.first().expect("at least one platform");
    let tags = render_tags(
        &settings.recipe_path,
        recipe,
        first.facts.torch.as_deref(),
        first.facts.cudnn.as_deref(),
        &settings.registry,
    )?;
    let layout = settings
        .layout_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("images").join(&recipe.name));
    progress.stage("output", &format!("OCI layout {}", layout.display()));
    let host = host_platform();
    let mut platforms = Vec::new();
    let (manifest_digest, host_ref) = if assembled.len() == 1 {
        let manifest_digest = oci::layout::write(&first.image, &layout, "latest")?;
        for tag in &tags {
            oci::layout::write(&first.image, &layout, tag)?;
        }
        (
            manifest_digest,
            (Some(first.platform) == host).then(|| "latest".to_string()),
        )
    } else {
        let mut children = Vec::new();
        for built in &assembled {
            let ref_name = platform_ref("latest", built.platform);
            oci::layout::write(&built.image, &layout, &ref_name)?;
            children.push((
                built.image.documents()?.manifest_descriptor(),
                oci_platform(built.platform),
            ));
        }
        let digest = oci::layout::write_index(&layout, &children, "latest")?;
        for tag in &tags {
            oci::layout::write_index(&layout, &children, tag)?;
        }
        let host_ref = host
            .filter(|h| assembled.iter().any(|a| a.platform == *h))
            .map(|h| platform_ref("latest", h));
        (digest, host_ref)
    };
    for built in &assembled {
        platforms.push(PlatformReport {
            platform: built.platform.as_str().to_string(),
            manifest_digest: built.image.digest()?,
            ref_name: if assembled.len() == 1 {
                "latest".to_string()
            } else {
                platform_ref("latest", built.platform)
            },
            size: built.layers.iter().map(|l| l.size).sum(),
            layers: built.layers.clone(),
            audit: built.audit.clone(),
            audit_cached: built.audit_cached,
        });
    }
    let first = &platforms[0];
    Ok(BuildReport {
        recipe: recipe.name.clone(),
        manifest_digest,
        layout,
        ref_name: "latest".into(),
        tags,
        host_ref,
        layers: first.layers.clone(),
        size: first.size,
        audit: first.audit.clone(),
        audit_cached: first.audit_cached,
        platforms,
    })
}

/// The recipe platform of the build host, if it is one cudastack builds.
pub fn host_platform() -> Option<Platform> {
    match std::env::consts::ARCH {
        "x86_64" => Some(Platform::LinuxAmd64),
        "aarch64" => Some(Platform::LinuxArm64),
        _ => None,
    }
}

/// Fills a staging directory with a layer's tree.
type StageFn<'a> = Box<dyn Fn(&Path) -> Result<(), BuildError> + 'a>;

/// One layer to produce: its name, cache key, how to stage its tree, how to walk it.
struct LayerPlan<'a> {
    name: &'static str,
    key: CacheKey,
    stage: StageFn<'a>,
    walk: DirOptions,
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    matrix: &Matrix,
    recipe: &Recipe,
    torch_build: Option<&crate::matrix::TorchBuild>,
    lock: &Lockfile,
    platform: Platform,
    wheels: &BTreeMap<String, (PathBuf, Digest, String)>,
    cache: &LayerCache,
    staging: &Staging,
    options: &BuildOptions,
    progress: &dyn BuildProgress,
) -> Result<Assembled, BuildError> {
    let arch = lock.target.arch;
    let paths = ToolkitPaths::new(recipe.cuda.version, arch);
    let machine = match arch {
        crate::lock::target::Arch::X86_64 => crate::elf::Machine::X86_64,
        crate::lock::target::Arch::Aarch64 => crate::elf::Machine::Aarch64,
    };
    let flavor = recipe.cuda.flavor;

    // Base.
    let (distro, release) = match &recipe.base {
        Base::Debian(release) => ("debian", release.as_str()),
        Base::Ubuntu(release) => ("ubuntu", release.as_str()),
        other => return Err(BuildError::Unsupported(format!("base {other} is not supported by `cudastack build` yet; build from `debian:` or `ubuntu:` releases"))),
    };
    let mut base_spec = DebootstrapSpec::for_python_stack(distro, release, options.mtime)
        .for_architecture(platform.debian_architecture());
    // cuFile's RDMA plugin (GPUDirect Storage, nvidia-cufile wheels from torch 2.7 on) links
    // the rdma-core user-space libraries; the distribution's packages provide them, so every
    // DT_NEEDED in the image resolves.
    if lock
        .artifacts
        .iter()
        .any(|a| a.name.starts_with("nvidia-cufile"))
    {
        base_spec
            .packages
            .extend(["libibverbs1", "librdmacm1", "ibverbs-providers"].map(String::from));
    }
    let base_assembler = match base_spec.foreign_architecture {
        None => format!("{ASSEMBLER}/base-mmdebstrap"),
        Some(_) => format!(
            "{ASSEMBLER}/base-mmdebstrap-{}",
            crate::stack::foreign_base::ASSEMBLER
        ),
    };
    let base_key = CacheKey::new(&base_assembler, &[], &base_spec);
    let base_dir = staging.dir(&base_key);

    // CUDA toolkit and cuDNN from the nvidia-* wheels.
    let nvidia: Vec<NvidiaWheel> = wheels
        .iter()
        .filter(|(name, _)| name.starts_with("nvidia-"))
        .map(|(name, (path, _, version))| NvidiaWheel {
            path: path.clone(),
            project: name.clone(),
            version: version.clone(),
        })
        .collect();
    let digest_of = |wheel: &NvidiaWheel| wheels[&wheel.project].1;
    let toolkit_wheels: Vec<&NvidiaWheel> = nvidia.iter().filter(|w| !w.is_cudnn()).collect();
    let cudnn_wheels: Vec<&NvidiaWheel> = nvidia.iter().filter(|w| w.is_cudnn()).collect();
    let toolkit_key = CacheKey::new(
        &format!("{ASSEMBLER}/toolkit"),
        &toolkit_wheels
            .iter()
            .map(|w| digest_of(w))
            .collect::<Vec<_>>(),
        &(
            recipe.cuda.version.line().to_string(),
            format!("{flavor:?}"),
        ),
    );
    let cudnn_key = CacheKey::new(
        &format!("{ASSEMBLER}/cudnn"),
        &cudnn_wheels
            .iter()
            .map(|w| digest_of(w))
            .collect::<Vec<_>>(),
        &recipe.cuda.version.line().to_string(),
    );
    let (toolkit_dir, cudnn_dir) = (staging.dir(&toolkit_key), staging.dir(&cudnn_key));
    // Which wheel members the toolkit layers hold, recorded beside each staged tree.
    let placement_record = |dir: &Path| dir.with_extension("placement.json");
    let stage_toolkit =
        |dir: &Path, wheels: &[&NvidiaWheel], top_links: bool| -> Result<(), BuildError> {
            let placed = toolkit::stage(wheels, &paths, flavor, top_links, dir)?;
            let record = placement_record(dir);
            write_record(
                &record,
                &serde_json::to_vec(&placed).expect("placement serialises"),
            )
        };

    // Python wheels, with nvidia/*/lib pointing at the toolkit's copies.
    let install_options = InstallOptions::new(Scheme::debian_local(recipe.python));
    let wheel_digests: Vec<Digest> = wheels.values().map(|(_, digest, _)| *digest).collect();
    let python_key = CacheKey::new(
        &format!("{ASSEMBLER}/python"),
        &wheel_digests,
        &(
            recipe.python.to_string(),
            toolkit_key.digest(),
            cudnn_key.digest(),
        ),
    );
    let python_dir = staging.dir(&python_key);
    let stage_python = |dir: &Path| -> Result<(), BuildError> {
        let mut placement = Placement::new();
        for toolkit in [&toolkit_dir, &cudnn_dir] {
            let record = placement_record(toolkit);
            let bytes = fs_err::read(&record).map_err(io_error(&record))?;
            placement.extend(serde_json::from_slice::<Placement>(&bytes).map_err(|e| {
                BuildError::Io {
                    path: record.clone(),
                    source: e.into(),
                }
            })?);
        }
        for (path, _, _) in wheels.values() {
            let mut reader = WheelReader::open(path)?;
            let mut plan = plan_with_reader(&mut reader, &install_options)?;
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
    };

    // Config: ld.so.conf.d, the loader cache over the whole tree, provenance files.
    let (conf_path, conf_text) = ld_so_conf(&paths);
    let recipe_json = recipe.canonical_json();
    let lock_json = lock.to_json();
    // The verification probe and what it should find travel in the config layer, so every
    // runner (Docker, a Kubernetes Job, enroot) runs the same probe with nothing to mount.
    let expect_json = Expectations::for_stack(matrix, recipe, torch_build, lock).to_json();
    // Images without torch get the native probe too (if built, and if it can run there).
    let has_torch = lock.artifacts.iter().any(|a| a.name == "torch");
    let native_probe = if has_torch {
        None
    } else {
        match verify::native_probe::locate(recipe.cuda.version.major, machine) {
            Ok(probe) => Some(probe),
            Err(why) => {
                progress.stage(
                    "probe",
                    &format!("{why}: the probe runs the static level alone"),
                );
                None
            }
        }
    };
    let config_key = CacheKey::new(
        &format!("{ASSEMBLER}/config"),
        &[
            base_key.digest(),
            toolkit_key.digest(),
            cudnn_key.digest(),
            python_key.digest(),
            Digest::of_bytes(recipe_json.as_bytes()),
            Digest::of_bytes(lock_json.as_bytes()),
            Digest::of_bytes(verify::PROBE_SOURCE.as_bytes()),
            Digest::of_bytes(&expect_json),
        ]
        .into_iter()
        .chain(native_probe.as_ref().map(|p| p.digest))
        .collect::<Vec<_>>(),
        &conf_text,
    );
    let config_dir = staging.dir(&config_key);
    let stage_config = |dir: &Path| -> Result<(), BuildError> {
        write_file(&dir.join(&conf_path), conf_text.as_bytes())?;
        write_file(
            &dir.join("usr/share/cudastack/recipe.json"),
            recipe_json.as_bytes(),
        )?;
        write_file(
            &dir.join("usr/share/cudastack/lock.json"),
            lock_json.as_bytes(),
        )?;
        write_file(
            &dir.join(verify::EXPECT_PATH.trim_start_matches('/')),
            &expect_json,
        )?;
        let probe = dir.join(verify::PROBE_PATH.trim_start_matches('/'));
        write_file(&probe, verify::PROBE_SOURCE.as_bytes())?;
        std::fs::set_permissions(&probe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(io_error(&probe))?;
        if let Some(native) = &native_probe {
            let glibc = inspect_rootfs(&base_dir)?.glibc;
            match (native.required_glibc, glibc) {
                (Some(need), Some(have)) if need > have => progress.stage(
                    "probe",
                    &verify::glibc::can_run_on(Some(need), have).unwrap_err(),
                ),
                _ => {
                    let path =
                        dir.join(verify::native_probe::NATIVE_PROBE_PATH.trim_start_matches('/'));
                    write_file(&path, &native.bytes)?;
                    std::fs::set_permissions(
                        &path,
                        std::os::unix::fs::PermissionsExt::from_mode(0o755),
                    )
                    .map_err(io_error(&path))?;
                }
            }
        }
        // A merged root private to this build: two builds of one recipe must not merge
        // into (or run ldconfig over) the same directory.
        let scratch = staging.scratch(&config_key, "merged")?;
        let merged = scratch.path();
        merge_trees(
            &[&base_dir, &toolkit_dir, &cudnn_dir, &python_dir, dir],
            merged,
        )?;
        let cache_bytes = if Some(platform) == host_platform() {
            run(Command::new("ldconfig").arg("-r").arg(merged))?;
            fs_err::read(merged.join("etc/ld.so.cache")).map_err(io_error(merged))?
        } else {
            // The host's ldconfig skips objects of another machine.
            ldcache::ld_so_cache(merged, machine)
                .map_err(|e| BuildError::Unsupported(e.to_string()))?
        };
        write_file(&dir.join("etc/ld.so.cache"), &cache_bytes)
    };

    let plans = vec![
        LayerPlan {
            name: "base",
            key: base_key,
            stage: Box::new(|dir| Ok(debootstrap(&base_spec, dir)?)),
            walk: DirOptions {
                modes: ModePolicy::Exact,
                keep_owners: true,
                prefix: None,
            },
        },
        LayerPlan {
            name: "cuda",
            key: toolkit_key,
            stage: Box::new(|dir| stage_toolkit(dir, &toolkit_wheels, true)),
            walk: DirOptions::default(),
        },
        LayerPlan {
            name: "cudnn",
            key: cudnn_key,
            stage: Box::new(|dir| stage_toolkit(dir, &cudnn_wheels, false)),
            walk: DirOptions::default(),
        },
        LayerPlan {
            name: "python",
            key: python_key,
            stage: Box::new(stage_python),
            walk: DirOptions::default(),
        },
        LayerPlan {
            name: "config",
            key: config_key,
            stage: Box::new(stage_config),
            walk: DirOptions::default(),
        },
    ];

    // When every layer and the audit verdict are cached there is nothing to stage.
    let mut cached_layers = Vec::new();
    for plan in &plans {
        cached_layers.push(cache.get(&plan.key, options)?);
    }
    let audit_record = |diff_ids: &[Digest]| {
        staging.root.join(format!(
            "{}.audit.json",
            Digest::of_bytes(
                serde_json::to_string(diff_ids)
                    .unwrap_or_default()
                    .as_bytes()
            )
            .hex()
        ))
    };
    let facts_record = base_dir.with_extension("facts.json");
    let fully_cached = cached_layers.iter().all(Option::is_some)
        && audit_record(
            &cached_layers
                .iter()
                .flatten()
                .map(|l| l.diff_id)
                .collect::<Vec<_>>(),
        )
        .exists()
        && facts_record.exists();

    let mut layers: Vec<(LayerReport, Layer)> = Vec::new();
    for (plan, cached) in plans.iter().zip(cached_layers) {
        let (layer, was_cached) = match cached {
            Some(layer) if fully_cached => (layer, true),
            cached => {
                if !staging.is_complete(&plan.key) {
                    progress.stage(plan.name, "staging");
                }
                let dir = staging.ensure(&plan.key, &*plan.stage)?;
                if plan.name == "base" {
                    let facts = inspect_rootfs(&dir)?;
                    check_base(recipe, &facts, lock)?;
                    write_record(
                        &facts_record,
                        &serde_json::to_vec(&facts).expect("facts serialise"),
                    )?;
                }
                match cached {
                    Some(layer) => (layer, true),
                    None => {
                        progress.stage(plan.name, "writing layer");
                        let contents = LayerContents::from_dir(&dir, &plan.walk)?;
                        (
                            cache.get_or_build(&plan.key, options, || Ok(contents))?,
                            false,
                        )
                    }
                }
            }
        };
        progress.stage(
            plan.name,
            &format!(
                "{} ({}){}",
                layer.digest,
                human_bytes(layer.size),
                if was_cached { ", cached" } else { "" }
            ),
        );
        layers.push((
            LayerReport {
                name: plan.name,
                digest: layer.digest,
                diff_id: layer.diff_id,
                size: layer.size,
                cached: was_cached,
            },
            layer,
        ));
    }
    drop(plans);

    let base_facts: RootfsFacts = fs_err::read(&facts_record)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(RootfsFacts {
            python: None,
            glibc: None,
            os: None,
        });
    let stack_facts = StackFacts {
        cuda_runtime: torch_build
            .and_then(|b| b.cuda_runtime.clone())
            .or_else(|| {
                lock.artifacts
                    .iter()
                    .find(|a| a.name.starts_with("nvidia-cuda-runtime"))
                    .map(|a| a.version.clone())
            }),
        cudnn: lock
            .artifacts
            .iter()
            .find(|a| a.name.starts_with("nvidia-cudnn"))
            .map(|a| a.version.clone()),
        torch: lock
            .artifacts
            .iter()
            .find(|a| a.name == "torch")
            .map(|a| a.version.clone()),
        os: base_facts.os.clone(),
        created: oci::rfc3339(options.mtime),
    };
    let config = stack_config(matrix, recipe, torch_build, &stack_facts, arch);

    // The static audit of the assembled filesystem, cached per set of layers.
    let diff_ids: Vec<Digest> = layers.iter().map(|(report, _)| report.diff_id).collect();
    let record = audit_record(&diff_ids);
    let (summary, audit_cached) = match fs_err::read(&record)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<AuditSummary>(&bytes).ok())
    {
        Some(summary) => (summary, true),
        None => {
            progress.stage(
                "audit",
                "every ELF's NEEDED, one copy per SONAME, symlinks, cuDNN header, pins",
            );
            let scratch = staging.scratch(&config_key, "audit")?;
            let merged = scratch.path();
            merge_trees(
                &[
                    &base_dir,
                    &toolkit_dir,
                    &cudnn_dir,
                    &python_dir,
                    &config_dir,
                ],
                merged,
            )?;
            let ld_library_path = config
                .env
                .iter()
                .find(|(k, _)| k == "LD_LIBRARY_PATH")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let pins: BTreeMap<String, String> = torch_build
                .map(|b| {
                    b.pins
                        .iter()
                        .filter(|(k, _)| k.starts_with("nvidia-"))
                        .map(|(k, v)| (k.clone(), v.trim_end_matches(".*").to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let report = audit(
                merged,
                &AuditOptions {
                    pins,
                    ..Default::default()
                }
                .with_ld_library_path(&ld_library_path),
            );
            drop(scratch);
            let report = report?;
            if !report.is_clean() {
                return Err(BuildError::AuditFailed(report.render()));
            }
            let summary = AuditSummary {
                elf_files: report.elf_files,
                needed_checked: report.needed_checked,
                symlinks: report.symlinks,
                distributions: report.distributions,
            };
            write_record(
                &record,
                &serde_json::to_vec(&summary).expect("summary serialises"),
            )?;
            (summary, false)
        }
    };
    let mut image = Image::new(options.mtime).with_platform(
        oci_platform(platform).architecture().clone(),
        oci_spec::image::Os::Linux,
    );
    for (report, layer) in &layers {
        image = image.with_layer(layer.clone(), &format!("cudastack {} layer", report.name));
    }
    for (name, value) in &config.env {
        image = image.with_env(name, value);
    }
    for (name, value) in &config.labels {
        image = image.with_label(name, value);
    }
    image = image.with_cmd(config.cmd.clone());
    Ok(Assembled {
        platform,
        image,
        layers: layers.into_iter().map(|(r, _)| r).collect(),
        audit: summary,
        audit_cached,
        facts: stack_facts,
    })
}

/// The base must provide the Python and glibc the locked wheels were chosen for.
fn check_base(recipe: &Recipe, facts: &RootfsFacts, lock: &Lockfile) -> Result<(), BuildError> {
    match facts.python {
        Some(python) if python == recipe.python => {}
        found => {
            return Err(BuildError::BaseMismatch {
                base: recipe.base.to_string(),
                what: "Python",
                found: found
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "no python3".into()),
                expected: recipe.python.to_string(),
                hint: "set `python:` to the base's version, or pick a base release that ships it"
                    .into(),
            })
        }
    }
    let target = (lock.target.glibc.major, lock.target.glibc.minor);
    if let Some(glibc) = facts.glibc {
        if glibc < target {
            return Err(BuildError::BaseMismatch {
                base: recipe.base.to_string(),
                what: "glibc",
                found: format!("{}.{}", glibc.0, glibc.1),
                expected: format!(">= {}.{} (the lock's manylinux level)", target.0, target.1),
                hint: "lock again for this base, or use a newer base release".into(),
            });
        }
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    if let Some(parent) = path.parent() {
        fs_err::create_dir_all(parent).map_err(io_error(parent))?;
    }
    fs_err::write(path, bytes).map_err(io_error(path))
}

/// Overlay staged layer trees into `merged` as hard links (no bytes copied), later trees
/// winning, the way the container runtime will stack the layers.
fn merge_trees(trees: &[&Path], merged: &Path) -> Result<(), BuildError> {
    if merged.exists() {
        fs_err::remove_dir_all(merged).map_err(io_error(merged))?;
    }
    fs_err::create_dir_all(merged).map_err(io_error(merged))?;
    for tree in trees {
        run(Command::new("cp")
            .arg("-a")
            .arg("-l")
            .arg("--remove-destination")
            .arg(format!("{}/.", tree.display()))
            .arg(merged))?;
    }
    Ok(())
}

fn run(command: &mut Command) -> Result<(), BuildError> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|source| BuildError::Io {
        path: PathBuf::from(&shown),
        source,
    })?;
    if !output.status.success() {
        return Err(BuildError::Command {
            command: shown,
            status: output.status.to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}

pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    /// Concurrent builds staging the same trees (and scratch dirs) in one cache: each tree
    /// is filled once, nobody sees a half-filled tree, and scratch dirs are private.
    #[test]
    fn concurrent_staging_fills_each_tree_once_and_never_shows_a_partial_one() {
        let cache = tempfile::tempdir().unwrap();
        let fills = Arc::new(AtomicUsize::new(0));
        const THREADS: usize = 6;
        let barrier = Arc::new(Barrier::new(THREADS));
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (fills, barrier, root) = (fills.clone(), barrier.clone(), cache.path());
                scope.spawn(move || {
                    let staging = Staging::open(root).unwrap();
                    // Two trees, three threads each.
                    let key = CacheKey::new("staging-test", &[], &(thread % 2));
                    barrier.wait();
                    let dir = staging
                        .ensure(&key, |dir| {
                            fills.fetch_add(1, Ordering::SeqCst);
                            for i in 0..200 {
                                write_file(&dir.join(format!("f/{i}")), b"x")?;
                            }
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            write_file(&dir.join("last"), b"done")
                        })
                        .unwrap();
                    assert_eq!(fs_err::read(dir.join("last")).unwrap(), b"done");
                    assert_eq!(fs_err::read_dir(dir.join("f")).unwrap().count(), 200);
                    let scratch = staging.scratch(&key, "merged").unwrap();
                    merge_trees(&[&dir], scratch.path()).unwrap();
                    assert!(scratch.path().join("last").is_file());
                });
            }
        });
        assert_eq!(fills.load(Ordering::SeqCst), 2, "a tree was staged twice");
        let names: Vec<String> = fs_err::read_dir(cache.path().join("staging"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("merged") || n.contains(".tmp-"))
            .collect();
        assert!(names.is_empty(), "scratch left behind: {names:?}");
    }

    #[test]
    fn a_failed_fill_leaves_no_tree_and_the_next_build_restages() {
        let cache = tempfile::tempdir().unwrap();
        let staging = Staging::open(cache.path()).unwrap();
        let key = CacheKey::new("staging-test", &[], &"fail");
        let error = staging
            .ensure(&key, |dir| {
                write_file(&dir.join("half"), b"x")?;
                Err(BuildError::Unsupported("disk full".into()))
            })
            .unwrap_err();
        assert!(error.to_string().contains("disk full"));
        assert!(!staging.dir(&key).exists());
        assert!(!staging.is_complete(&key));
        let dir = staging
            .ensure(&key, |dir| write_file(&dir.join("whole"), b"y"))
            .unwrap();
        assert!(dir.join("whole").is_file() && !dir.join("half").exists());
    }
}
