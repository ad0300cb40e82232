//! The inputs of one platform's image, gathered before any layer is assembled: its lock
//! (present, made from this recipe, for this platform's wheels), its wheels fetched into
//! the blob store and linked under their file names, and the CUDA arch list its torch
//! wheel really carries. Gathering every platform's inputs first makes a platform that
//! cannot work fail before any layer is staged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::apt::DebFile;
use crate::cache::Staging;
use crate::cache::{BlobStore, CacheDir};
use crate::digest::Digest;
use crate::elf::Machine;
use crate::fetch::download::{Downloader, FetchItem};
use crate::fetch::http::HttpClient;
use crate::fetch::local_wheels::LocalWheels;
use crate::lock::inputs::{index_credentials, platform_lock_path};
use crate::lock::lockfile::{Artifact, ArtifactKind, DebLayer, Location, Lockfile};
use crate::lock::python_inputs::PythonInputs;
use crate::matrix::validate::kernel_errors;
use crate::matrix::{Matrix, ResolvedRecipe, TorchBuild};
use crate::recipe::{Platform, Recipe};
use crate::stack::error::{io_error, BuildError};
use crate::stack::files::write_record;
use crate::stack::layers::toolkit::layout::ToolkitPaths;
use crate::stack::settings::{BuildProgress, BuildSettings};

/// A wheel of the lock, in the blob store and linked under its file name.
#[derive(Debug, Clone)]
pub(crate) struct FetchedWheel {
    /// `wheels/<sha256>/<filename>`, a link to the blob.
    pub path: PathBuf,
    pub sha256: Digest,
    pub version: String,
}

/// Everything one platform's layers are made from.
pub(crate) struct PlatformInputs<'a> {
    pub matrix: &'a Matrix,
    /// What validation decided about the recipe (its target GPUs, the driver floor's PTX).
    pub resolved: &'a ResolvedRecipe,
    /// `resolved`'s recipe.
    pub recipe: &'a Recipe,
    pub platform: Platform,
    pub lock: Lockfile,
    /// Wheel name -> the fetched wheel, every wheel of the lock.
    pub wheels: BTreeMap<String, FetchedWheel>,
    /// The recipe's torch build with the arch list of this platform's wheel; None without
    /// torch.
    pub torch_build: Option<TorchBuild>,
    /// The base's locked .debs, fetched and checked.
    pub base_debs: Vec<DebFile>,
    /// The `apt:` layer's locked .debs (empty without `apt:`).
    pub apt_debs: Vec<DebFile>,
    /// The recipe's directory: where `copy:` sources are read from.
    pub context: PathBuf,
}

impl PlatformInputs<'_> {
    /// The wheel architecture the lock was made for.
    pub fn arch(&self) -> Platform {
        self.lock.target.arch
    }
    /// Where the toolkit lives in this image.
    pub fn paths(&self) -> ToolkitPaths {
        ToolkitPaths::new(self.recipe.cuda.version, self.arch())
    }
    /// The ELF machine of the image's code.
    pub fn machine(&self) -> Machine {
        self.arch().to_elf()
    }
}

/// Read `platform`'s lock, fetch its wheels and read its torch wheel's arch list; fail
/// when a recipe GPU has no kernels in this platform's torch wheel.
pub(crate) async fn prepare_platform<'a>(
    settings: &BuildSettings,
    matrix: &'a Matrix,
    resolved: &'a ResolvedRecipe,
    platform: Platform,
    store: &BlobStore,
    staging: &Staging,
    progress: &dyn BuildProgress,
) -> Result<PlatformInputs<'a>, BuildError> {
    let recipe = resolved.recipe();
    let lock = read_lock(settings, resolved, platform)?;
    let wheels = fetch_wheels(settings, resolved, &lock, store, progress).await?;
    verify_debs(settings, recipe, &lock, platform, progress).await?;
    let (base_debs, apt_debs) = fetch_debs(settings, &lock, store, progress).await?;
    // The arch list this platform's torch wheel really carries (aarch64 builds carry
    // fewer SASS targets than the x86_64 one the matrix was read from), so the labels
    // and the probe's expectations describe this image; the build is the locked release's.
    let selected = match wheels.get("torch") {
        Some(torch) => resolved.locked_torch_build(matrix, &torch.version),
        None => resolved.torch_build(),
    };
    let torch_build = match (selected, wheels.get("torch")) {
        (Some(build), Some(torch)) => Some(tokio::task::block_in_place(|| {
            with_wheel_arch_list(
                build,
                &torch.path,
                &staging.record_path(&format!("arch-list-{}.json", torch.sha256.hex())),
                progress,
            )
        })?),
        (build, _) => build.cloned(),
    };
    // Validation checked the recipe's GPUs against the matrix's x86_64 build; this
    // checks them against the wheel this platform fetched.
    if let Some(build) = &torch_build {
        let problems = kernel_errors(matrix, resolved.target_gpus(), build);
        if !problems.is_empty() {
            return Err(BuildError::Invalid {
                recipe: format!("{} ({platform})", recipe.name),
                problems,
            });
        }
    }
    Ok(PlatformInputs {
        matrix,
        resolved,
        recipe,
        platform,
        lock,
        wheels,
        torch_build,
        base_debs,
        apt_debs,
        context: recipe_context(&settings.recipe_path),
    })
}

/// The directory `copy:` sources are relative to: the recipe's own.
pub(crate) fn recipe_context(recipe_path: &Path) -> PathBuf {
    match recipe_path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `build` with the CUDA arch list read from `wheel`'s libtorch_python.so (streamed out of
/// the zip, as `matrix refresh` reads it over HTTP); the matrix's list when none is found.
fn with_wheel_arch_list(
    build: &TorchBuild,
    wheel: &Path,
    record: &Path,
    progress: &dyn BuildProgress,
) -> Result<TorchBuild, BuildError> {
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
    Ok(TorchBuild {
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
    resolved: &ResolvedRecipe,
    platform: Platform,
) -> Result<Lockfile, BuildError> {
    let recipe = resolved.recipe();
    let lock_file = platform_lock_path(&settings.recipe_path, platform);
    if !lock_file.exists() {
        return Err(BuildError::NoLock {
            recipe: settings.recipe_path.clone(),
            lock: lock_file,
        });
    }
    let lock = Lockfile::read(&lock_file)?;
    // The recipe and what every Python input file it reads asks for; a lock made before
    // that recorded the files' bytes, and stays fresh while they are the same.
    let inputs = PythonInputs::load(recipe, &settings.recipe_path, &lock.target)
        .map_err(Box::new)?
        .with_wheels(resolved.local_wheels());
    // Before staleness: a locked wheel of `wheels:` whose bytes changed is named.
    check_local_wheels(&lock, resolved.local_wheels(), &lock_file)?;
    let expected = inputs.lock_digest(recipe);
    if lock.is_stale(&expected) && lock.is_stale(&inputs.byte_digest(recipe)) {
        return Err(BuildError::StaleLock {
            recipe: settings.recipe_path.clone(),
            lock: lock_file,
            expected,
            found: lock.recipe_digest,
        });
    }
    // Every image carries pip from the lock now; a lock made before that has none.
    if !lock
        .artifacts
        .iter()
        .any(|a| a.kind == ArtifactKind::Wheel && a.name == crate::lock::inputs::PIP)
    {
        return Err(BuildError::Unsupported(format!(
            "lock file `{}` has no `pip`: it was made before every image carried pip and its constraints file (so that `FROM image` + `RUN pip install` works)\n  hint: run `cudastack lock {}` again",
            lock_file.display(),
            settings.recipe_path.display()
        )));
    }
    if lock.target.arch != platform {
        let wanted = platform.wheel_arch();
        return Err(BuildError::Unsupported(format!(
            "lock file `{}` is for {} wheels, but {platform} needs {wanted}; run `cudastack lock {}` again",
            lock_file.display(),
            lock.target.arch.wheel_arch(),
            settings.recipe_path.display()
        )));
    }
    Ok(lock)
}

/// Refuse a lock whose wheel of the recipe's `wheels:` is gone or holds other bytes now
/// (swapped after locking), saying which and how.
fn check_local_wheels(
    lock: &Lockfile,
    local: &LocalWheels,
    lock_file: &Path,
) -> Result<(), BuildError> {
    // A local project's tree is checked by its source build.
    for artifact in lock.artifacts.iter().filter(|a| !a.is_project()) {
        let Location::Recipe(path) = &artifact.url else {
            continue;
        };
        match local.by_path(path) {
            Some(wheel) if wheel.sha256 == artifact.sha256 => {}
            found => {
                return Err(BuildError::LocalWheelChanged {
                    path: path.clone(),
                    lock: lock_file.to_path_buf(),
                    expected: artifact.sha256,
                    found: found.map_or_else(
                        || "no such wheel in the recipe's `wheels:`".to_string(),
                        |w| w.sha256.to_string(),
                    ),
                })
            }
        }
    }
    Ok(())
}

/// Download (or find in the blob store) every wheel of `lock`, each linked under its file
/// name: wheel name -> (path, sha256, version). Wheels of the recipe's private indexes are
/// fetched with the same credentials `lock` used (sent only to each index's origin).
async fn fetch_wheels(
    settings: &BuildSettings,
    resolved: &ResolvedRecipe,
    lock: &Lockfile,
    store: &BlobStore,
    progress: &dyn BuildProgress,
) -> Result<BTreeMap<String, FetchedWheel>, BuildError> {
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
    let recipe = resolved.recipe();
    // URLs and file names were checked when the lock was read (`Artifact::check`).
    let context = settings.recipe_path.parent().unwrap_or(Path::new(""));
    let items: Vec<FetchItem> = wheels.iter().map(|a| a.fetch_item(context)).collect();
    let client = HttpClient::with_defaults()?.with_credentials(index_credentials(recipe)?);
    // The recipe's `wheels:` are read like a mirror's: copied into the store, hash-checked.
    let mut readable = settings.mirrors.clone();
    readable.extend(resolved.local_wheels().directories());
    let downloader = Downloader::new(client, store.clone(), progress.downloads())
        .offline(settings.offline)
        .mirrors(readable);
    let missing = downloader.missing(&items).len();
    progress.stage(
        "fetch",
        &format!("{} artifacts, {} to download", items.len(), missing),
    );
    let paths = downloader.fetch_all(&items).await?;
    // Blobs are named by digest; the installer reads a wheel's tags from its file name, so
    // each gets a link under its real name.
    let named = CacheDir::new(&settings.cache_root).wheels();
    fs_err::create_dir_all(&named).map_err(io_error(&named))?;
    let mut wheel_paths: BTreeMap<String, FetchedWheel> = BTreeMap::new();
    for (artifact, blob) in wheels.iter().zip(paths) {
        let link = link_wheel(&named, artifact, &blob)?;
        wheel_paths.insert(
            artifact.name.clone(),
            FetchedWheel {
                path: link,
                sha256: artifact.sha256,
                version: artifact.version.clone(),
            },
        );
    }
    Ok(wheel_paths)
}

/// Check every .deb of `lock` (the image's and the builder's) against the base's archive
/// before any is fetched: URLs under the archive, its snapshot or the build's
/// `--apt-mirror`, and each listed in the archive's signed index. Remembered per cache.
async fn verify_debs(
    settings: &BuildSettings,
    recipe: &Recipe,
    lock: &Lockfile,
    platform: Platform,
    progress: &dyn BuildProgress,
) -> Result<(), BuildError> {
    use crate::apt::trust::{check_origins, verify_signed, LockedDeb, VerifiedSets};
    use crate::apt::AptSources;
    let debs: Vec<LockedDeb> = lock
        .artifacts
        .iter()
        .filter(|a| a.kind.is_deb())
        // `Artifact::check` gives only wheels a location beside the recipe: every deb's is a URL.
        .filter_map(|a| {
            Some(LockedDeb {
                name: a.name.clone(),
                version: a.version.clone(),
                architecture: a.platform.clone().unwrap_or_default(),
                sha256: a.sha256,
                size: a.size,
                url: a.url.as_url()?.clone(),
                fallback_url: a.fallback_url.clone(),
            })
        })
        .collect();
    if debs.is_empty() {
        return Ok(());
    }
    let Some((distro, release)) = recipe.base.distro() else {
        return Err(BuildError::Unsupported(format!(
            "the lock names Debian packages, but the recipe's base `{}` has no Debian or Ubuntu archive to check them against",
            recipe.base
        )));
    };
    let architecture = platform.to_debian();
    let public = AptSources::for_release(distro, release, architecture, None, None);
    let mirror = settings.apt_mirror.as_ref().map(|url| {
        AptSources::for_release(
            distro,
            release,
            architecture,
            Some(url),
            settings.apt_keyring.clone(),
        )
    });
    let mut trusted = vec![&public];
    trusted.extend(mirror.as_ref());
    check_origins(&debs, &trusted, settings.apt_snapshot.as_ref())?;
    let index = mirror.unwrap_or(public);
    let verified = VerifiedSets::new(&CacheDir::new(&settings.cache_root).apt_verified());
    if verified.contains(&debs, &index)? {
        return Ok(());
    }
    progress.stage(
        "verify",
        &format!(
            "{} Debian packages against the archive's signed index",
            debs.len()
        ),
    );
    let (as_of, snapshot, release) = (
        lock.as_of,
        settings.apt_snapshot.clone(),
        release.to_string(),
    );
    let (debs, index) = tokio::task::spawn_blocking(move || {
        verify_signed(&debs, &index, &release, as_of, snapshot.as_ref()).map(|()| (debs, index))
    })
    .await
    .map_err(|e| BuildError::Unsupported(format!("the .deb check stopped: {e}")))??;
    verified.remember(&debs, &index)?;
    Ok(())
}

/// Download (or find in the blob store) every deb of `lock`, each from the first of its
/// URLs that serves the locked bytes: `--apt-mirror`, the archive, the snapshot archive.
/// Every deb that none of them has is named in one error. Returns (base, apt layer).
async fn fetch_debs(
    settings: &BuildSettings,
    lock: &Lockfile,
    store: &BlobStore,
    progress: &dyn BuildProgress,
) -> Result<(Vec<DebFile>, Vec<DebFile>), BuildError> {
    let debs: Vec<&Artifact> = lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Deb)
        .collect();
    if debs.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let downloader = Downloader::new(
        HttpClient::with_defaults()?,
        store.clone(),
        progress.downloads(),
    )
    .offline(settings.offline)
    .mirrors(deb_mirror_dirs(settings));
    let items: Vec<FetchItem> = debs.iter().map(|a| a.fetch_item(Path::new(""))).collect();
    let missing = downloader.missing(&items).len();
    progress.stage(
        "fetch",
        &format!("{} Debian packages, {} to download", debs.len(), missing),
    );
    let fetched = fetch_deb_files(&downloader, &debs, settings.apt_mirror.as_ref()).await?;
    let (mut base, mut apt) = (Vec::new(), Vec::new());
    for (artifact, file) in debs.iter().zip(fetched) {
        match artifact.layer {
            Some(DebLayer::Apt) => apt.push(file),
            _ => base.push(file),
        }
    }
    Ok((base, apt))
}

/// The directories a deb's `file://` URL may name: `--mirror`, and a `file://` apt mirror.
fn deb_mirror_dirs(settings: &BuildSettings) -> Vec<PathBuf> {
    let mut dirs = settings.mirrors.clone();
    if let Some(path) = settings
        .apt_mirror
        .as_ref()
        .filter(|url| url.scheme() == "file")
        .and_then(|url| url.to_file_path().ok())
    {
        dirs.push(path);
    }
    dirs
}

/// Where a locked deb may be fetched from, in order: the mirror given to this build (the
/// same pool path under its root), the URL it was locked from, the snapshot archive.
/// Fetch every .deb of `debs` (each from its candidate URLs, at the same time), in order;
/// the ones no URL served are one error naming them all.
pub(crate) async fn fetch_deb_files(
    downloader: &Downloader,
    debs: &[&Artifact],
    apt_mirror: Option<&reqwest::Url>,
) -> Result<Vec<DebFile>, BuildError> {
    let fetches = debs.iter().map(|artifact| {
        let candidates = deb_urls(artifact, apt_mirror);
        let item = artifact.fetch_item(Path::new(""));
        async move { fetch_first(downloader, item, candidates).await }
    });
    let results = futures_util::future::join_all(fetches).await;
    let mut files = Vec::new();
    let mut unavailable = Vec::new();
    for (artifact, result) in debs.iter().zip(results) {
        match result {
            Ok(path) => files.push(DebFile {
                name: artifact.name.clone(),
                version: artifact.version.clone(),
                architecture: artifact.platform.clone().unwrap_or_default(),
                filename: artifact.filename.to_string(),
                sha256: artifact.sha256,
                size: artifact.size,
                path,
            }),
            Err(tried) => unavailable.push(format!(
                "{} {} ({})",
                artifact.name,
                artifact.version,
                tried.join("; ")
            )),
        }
    }
    if !unavailable.is_empty() {
        return Err(BuildError::DebsUnavailable {
            missing: unavailable,
        });
    }
    Ok(files)
}

pub(crate) fn deb_urls(
    artifact: &Artifact,
    apt_mirror: Option<&reqwest::Url>,
) -> Vec<reqwest::Url> {
    let mut urls = Vec::new();
    if let Some(mirror) = apt_mirror {
        let url = artifact.url.to_string();
        let pool_path = url
            .strip_prefix(artifact.source.trim_end_matches('/'))
            .map(|p| p.trim_start_matches('/'));
        if let Some(url) = pool_path.and_then(|p| {
            reqwest::Url::parse(&format!("{}/{p}", mirror.as_str().trim_end_matches('/'))).ok()
        }) {
            urls.push(url);
        }
    }
    urls.extend(artifact.url.as_url().cloned());
    urls.extend(artifact.fallback_url.clone());
    urls
}

/// The blob of `item` from the first of `urls` that serves its bytes; on failure, what
/// each URL answered.
pub(crate) async fn fetch_first(
    downloader: &Downloader,
    item: FetchItem,
    urls: Vec<reqwest::Url>,
) -> Result<PathBuf, Vec<String>> {
    let mut tried = Vec::new();
    for url in urls {
        let attempt = FetchItem {
            url: url.clone(),
            ..item.clone()
        };
        match downloader.fetch(&attempt).await {
            Ok(path) => return Ok(path),
            Err(error) => tried.push(format!(
                "{url}: {}",
                crate::fetch::http::error_chain(&error)
            )),
        }
        // What this URL left must not be resumed from the next one (its bytes may differ);
        // under the blob's lock, so another build's transfer of it is never cut.
        if let Ok(_lock) = downloader.store().lock_partial(&item.sha256) {
            let _ = fs_err::remove_file(downloader.store().partial_path(&item.sha256));
        }
        // Offline, no URL can help.
        if tried.last().is_some_and(|t| t.contains("Offline")) {
            break;
        }
    }
    Err(tried)
}

/// `wheels/<sha256>/<filename>` -> the blob. One directory per digest: two indexes may serve
/// different bytes under one file name (PyPI's and PyTorch's torch wheels), and neither may
/// replace the other's link. The link is made under a temp name and renamed into place, so a
/// concurrent build of the same wheel sees the old link or the new one, never none (the
/// remove-then-create it replaced failed with "File exists" when two builds met).
pub(crate) fn link_wheel(
    named: &Path,
    artifact: &Artifact,
    blob: &Path,
) -> Result<PathBuf, BuildError> {
    let dir = named.join(artifact.sha256.hex());
    fs_err::create_dir_all(&dir).map_err(io_error(&dir))?;
    // A relative target would resolve against the link's directory, not the working
    // directory a relative `--cache-dir` was given in.
    let blob = std::path::absolute(blob).map_err(io_error(blob))?;
    let blob = blob.as_path();
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

/// The recipe platform of the build host, if it is one cudastack builds.
pub fn host_platform() -> Option<Platform> {
    Platform::host()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relative cache root (`--cache-dir cache`) gave relative blob paths, and a symlink
    /// with a relative target resolves against its own directory: the link dangled and the
    /// CUDA layer failed with "No such file" (found by the rootless build in a container).
    #[test]
    fn a_wheel_link_to_a_relative_blob_path_resolves() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(&blob, b"wheel bytes").unwrap();
        // The same file, named relative to the working directory.
        let cwd = std::env::current_dir().unwrap();
        let up = "../".repeat(cwd.components().count() - 1);
        let relative = Path::new(&up).join(blob.strip_prefix("/").unwrap());
        assert!(relative.is_relative() && relative.exists());
        let artifact: Artifact = serde_json::from_value(serde_json::json!({
            "kind": "wheel",
            "name": "demo",
            "version": "1.0",
            "filename": "demo-1.0-py3-none-any.whl",
            "url": "https://example.invalid/demo-1.0-py3-none-any.whl",
            "sha256": Digest::of_bytes(b"wheel bytes").to_string(),
            "size": 11,
            "source": "https://example.invalid/simple/",
        }))
        .unwrap();
        let link = link_wheel(&dir.path().join("wheels"), &artifact, &relative).unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), b"wheel bytes");
    }
}
