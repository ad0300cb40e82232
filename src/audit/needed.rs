//! The loader phases over the ELF objects of the image: read each once (malformed files are
//! findings), check executables' program interpreters, resolve every `DT_NEEDED` in ld.so's
//! order, check the symbol versions required from the library that resolved, and retry what
//! did not resolve through the `DT_RPATH` its loaders pass down.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::image::ImageFs;
use super::loader::{Loader, DEFAULT_LIBRARY_DIRS};
use super::{
    io_error, is_driver_library, is_site_fabric_dependency, AuditError, AuditOptions, Finding,
    FindingKind,
};
use crate::elf::{expand_origin, ElfError, ElfInfo, ElfProbe};
use crate::rootfs::Resolution;

/// The ELF objects of the image, with the indexes the later phases look names up in.
pub(super) struct Objects {
    /// Image path and header of every ELF file, in walk order.
    pub list: Vec<(PathBuf, ElfInfo)>,
    /// SONAME -> the files declaring it, link-time stubs excluded.
    pub providers: BTreeMap<String, Vec<PathBuf>>,
    /// File name or SONAME -> the files carrying it (for "it exists at ..." hints).
    by_name: BTreeMap<String, Vec<PathBuf>>,
}

impl Objects {
    /// Read the header of every candidate; a malformed ELF is a finding, not an error.
    pub fn read(
        loader: &mut Loader<'_>,
        candidates: &[PathBuf],
        findings: &mut Vec<Finding>,
    ) -> Result<Self, AuditError> {
        let mut list: Vec<(PathBuf, ElfInfo)> = Vec::new();
        for path in candidates {
            match loader.fs.elf(path) {
                Ok(ElfProbe::Elf(info)) => {
                    loader.remember(path, &info);
                    list.push((path.clone(), info));
                }
                Ok(ElfProbe::NotElf) => {}
                Err(ElfError::Malformed { reason, .. }) => findings.push(Finding {
                    kind: FindingKind::MalformedElf,
                    paths: vec![path.clone()],
                    evidence: reason,
                    hint: "the file is truncated or corrupt: re-fetch the artifact it came from"
                        .into(),
                }),
                Err(ElfError::Io { path, source }) => return Err(AuditError::Io { path, source }),
            }
        }
        Ok(Self::index(list))
    }

    fn index(list: Vec<(PathBuf, ElfInfo)>) -> Self {
        let mut providers: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        let mut by_name: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for (path, info) in &list {
            // Link-time stubs (`.../stubs/libcuda.so`) are never on a search path.
            let is_stub = path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d == "stubs");
            if let Some(name) = path.file_name() {
                let name = name.to_string_lossy().into_owned();
                // The loader looks a NEEDED name up by file name in each directory it
                // searches, so a file named like a library answers for that name whatever
                // its own SONAME says: a `libz.so.1` declaring another SONAME would load in
                // place of the base's.
                if !is_stub
                    && name.starts_with("lib")
                    && name.contains(".so")
                    && info.soname.as_deref() != Some(name.as_str())
                {
                    providers
                        .entry(name.clone())
                        .or_default()
                        .push(path.clone());
                }
                by_name.entry(name).or_default().push(path.clone());
            }
            if let Some(soname) = &info.soname {
                by_name
                    .entry(soname.clone())
                    .or_default()
                    .push(path.clone());
                if !is_stub {
                    providers
                        .entry(soname.clone())
                        .or_default()
                        .push(path.clone());
                }
            }
        }
        Objects {
            list,
            providers,
            by_name,
        }
    }
}

/// What NEEDED resolution learned about the image.
#[derive(Default)]
pub(super) struct Linkage {
    /// DT_NEEDED entries looked at.
    pub needed_checked: usize,
    /// Library -> the objects whose NEEDED resolved to it (its loaders).
    pub loaded_by: HashMap<PathBuf, Vec<PathBuf>>,
}

/// A NEEDED no search directory of its requester provides, with the finding it becomes if
/// no loader's DT_RPATH provides it either.
struct Unresolved {
    path: PathBuf,
    needed: String,
    finding: Finding,
}

/// The directories ld.so searches for one object's NEEDED, in its order.
struct SearchPath {
    /// DT_RPATH, only when there is no DT_RUNPATH.
    rpath: Vec<PathBuf>,
    ld_library_path: Vec<PathBuf>,
    runpath: Vec<PathBuf>,
    conf: Vec<PathBuf>,
    defaults: Vec<PathBuf>,
}

impl SearchPath {
    fn of(info: &ElfInfo, origin: &Path, options: &AuditOptions, conf: &[PathBuf]) -> Self {
        SearchPath {
            rpath: if info.runpath.is_empty() {
                info.expanded_rpath(origin)
            } else {
                Vec::new()
            },
            ld_library_path: options
                .ld_library_path
                .iter()
                .map(|dir| expand_origin(&dir.to_string_lossy(), origin))
                .collect(),
            runpath: info.expanded_runpath(origin),
            conf: conf.to_vec(),
            defaults: DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from).collect(),
        }
    }

    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.rpath
            .iter()
            .chain(&self.ld_library_path)
            .chain(&self.runpath)
            .chain(&self.conf)
            .chain(&self.defaults)
    }
}

/// Resolve every object's NEEDED entries (findings for missing interpreters, unresolved
/// libraries and missing symbol versions). Unresolved entries wait until every object has
/// been looked at, because glibc also searches the DT_RPATH of the objects that loaded the
/// requester (auditwheel's vendored `numpy.libs` rely on it).
pub(super) fn resolve(
    loader: &mut Loader<'_>,
    options: &AuditOptions,
    objects: &Objects,
    findings: &mut Vec<Finding>,
) -> Result<Linkage, AuditError> {
    let mut linkage = Linkage::default();
    let mut unresolved = Vec::new();
    for (path, info) in &objects.list {
        findings.extend(missing_interpreter(loader.fs, path, info)?);
        let resolved_needed = resolve_object(
            loader,
            options,
            objects,
            path,
            info,
            &mut linkage,
            &mut unresolved,
        )?;
        findings.extend(missing_symbol_versions(
            loader,
            path,
            info,
            &resolved_needed,
        )?);
    }
    findings.extend(resolve_through_loaders(
        loader,
        objects,
        &mut linkage.loaded_by,
        unresolved,
    )?);
    Ok(linkage)
}

fn missing_interpreter(
    fs: &dyn ImageFs,
    path: &Path,
    info: &ElfInfo,
) -> Result<Option<Finding>, AuditError> {
    let Some(interpreter) = info.interpreter.as_deref().filter(|_| info.is_executable()) else {
        return Ok(None);
    };
    if matches!(
        fs.resolve(Path::new(interpreter)).map_err(io_error(path))?,
        Resolution::Found(_)
    ) {
        return Ok(None);
    }
    Ok(Some(Finding {
        kind: FindingKind::MissingInterpreter,
        paths: vec![path.to_path_buf()],
        evidence: format!("its program interpreter `{interpreter}` does not exist in the image"),
        hint: "the binary was built for another C library or layout: use a build for this base image, or add the loader".into(),
    }))
}

/// Resolve the NEEDED entries of one object: NEEDED name -> the file the loader would map.
/// What resolves is recorded in `linkage.loaded_by`; what does not goes to `unresolved`.
fn resolve_object<'i>(
    loader: &mut Loader<'_>,
    options: &AuditOptions,
    objects: &Objects,
    path: &Path,
    info: &'i ElfInfo,
    linkage: &mut Linkage,
    unresolved: &mut Vec<Unresolved>,
) -> Result<HashMap<&'i str, PathBuf>, AuditError> {
    let origin = path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let search = SearchPath::of(info, &origin, options, &loader.ld_so_conf);
    let mut resolved_needed: HashMap<&str, PathBuf> = HashMap::new();
    for needed in &info.needed {
        linkage.needed_checked += 1;
        if is_driver_library(needed) || is_site_fabric_dependency(path, needed) {
            continue;
        }
        match resolve_needed(loader, options, objects, info, &origin, &search, needed)? {
            Some(resolved) => {
                linkage
                    .loaded_by
                    .entry(resolved.clone())
                    .or_default()
                    .push(path.to_path_buf());
                resolved_needed.insert(needed, resolved);
            }
            None => unresolved.push(Unresolved {
                path: path.to_path_buf(),
                needed: needed.clone(),
                finding: unresolved_finding(objects, path, info, &search, needed),
            }),
        }
    }
    Ok(resolved_needed)
}

/// The file one NEEDED maps: a path when it has a `/` and exists, else the first accepted
/// file along the search path, else the one copy of a preloaded SONAME.
fn resolve_needed(
    loader: &mut Loader<'_>,
    options: &AuditOptions,
    objects: &Objects,
    info: &ElfInfo,
    origin: &Path,
    search: &SearchPath,
    needed: &str,
) -> Result<Option<PathBuf>, AuditError> {
    if needed.contains('/') {
        let target = if needed.starts_with('/') {
            PathBuf::from(needed)
        } else {
            origin.join(needed)
        };
        if let Resolution::Found(resolved) =
            loader.fs.resolve(&target).map_err(io_error(&target))?
        {
            return Ok(Some(resolved));
        }
    }
    for dir in search.dirs() {
        if let Some(found) = loader.try_dir(dir, needed, info.class, info.machine)? {
            return Ok(Some(found));
        }
    }
    if options.preloaded.contains(needed) {
        if let Some([only]) = objects.providers.get(needed).map(Vec::as_slice) {
            return Ok(Some(only.clone()));
        }
    }
    Ok(None)
}

fn unresolved_finding(
    objects: &Objects,
    path: &Path,
    info: &ElfInfo,
    search: &SearchPath,
    needed: &str,
) -> Finding {
    let elsewhere: Vec<String> = objects
        .by_name
        .get(needed)
        .map(|paths| paths.iter().map(|p| p.display().to_string()).collect())
        .unwrap_or_default();
    let mut evidence = format!("needs `{needed}`, which no search directory provides\n");
    if !info.rpath.is_empty() && info.runpath.is_empty() {
        let _ = writeln!(evidence, "RPATH: {}", display_dirs(&search.rpath));
    }
    let _ = writeln!(
        evidence,
        "LD_LIBRARY_PATH: {}",
        display_dirs(&search.ld_library_path)
    );
    let _ = writeln!(evidence, "RUNPATH: {}", display_dirs(&search.runpath));
    let _ = writeln!(evidence, "ld.so.conf: {}", display_dirs(&search.conf));
    let _ = write!(evidence, "default: {}", display_dirs(&search.defaults));
    let hint = if elsewhere.is_empty() {
        format!("add the library that provides `{needed}` to the image")
    } else {
        format!(
            "`{needed}` exists at {} but not on this object's search path: add its directory to the RUNPATH, LD_LIBRARY_PATH or an /etc/ld.so.conf.d entry",
            elsewhere.join(", ")
        )
    };
    Finding {
        kind: FindingKind::UnresolvedNeeded,
        paths: vec![path.to_path_buf()],
        evidence,
        hint,
    }
}

/// Symbol versions: ld.so refuses to load when a required version (`GLIBC_2.34`) is not
/// defined by the library that resolved.
fn missing_symbol_versions(
    loader: &mut Loader<'_>,
    path: &Path,
    info: &ElfInfo,
    resolved_needed: &HashMap<&str, PathBuf>,
) -> Result<Vec<Finding>, AuditError> {
    let mut findings = Vec::new();
    for need in &info.version_needs {
        let Some(provider_path) = resolved_needed.get(need.file.as_str()) else {
            continue;
        };
        let Some(provider) = loader.elf_at(provider_path)? else {
            continue;
        };
        if provider.version_definitions.is_empty() {
            continue;
        }
        let missing: Vec<&String> = need
            .versions
            .iter()
            .filter(|version| !provider.version_definitions.contains(version))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let missing_text = missing
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let newest = match provider.glibc_provided() {
            Some(glibc) => format!("it provides glibc {glibc}"),
            None => format!("it defines {}", provider.version_definitions.join(", ")),
        };
        let hint = match missing.iter().filter_map(|v| v.parse::<crate::elf::GlibcVersion>().ok()).max() {
            Some(needed_glibc) => format!(
                "use a base image with glibc >= {needed_glibc}, or a build of this package for an older glibc (a manylinux tag at or below the image's glibc)"
            ),
            None => format!(
                "install the `{}` this object was built against",
                need.file
            ),
        };
        findings.push(Finding {
            kind: FindingKind::MissingSymbolVersion,
            paths: vec![path.to_path_buf(), provider_path.clone()],
            evidence: format!(
                "requires version {missing_text} of `{}`, resolved to {}, but {newest}",
                need.file,
                provider_path.display()
            ),
            hint,
        });
    }
    Ok(findings)
}

/// Inherited DT_RPATH: an object without DT_RUNPATH also searches the DT_RPATH of every
/// object up its chain of loaders (glibc `_dl_map_object`: "then that object's dependent,
/// and on up"). Loaders are the objects whose NEEDED resolved to it. A library found this
/// way becomes a loader in turn (libopenblas -> libgfortran -> libquadmath), so repeat until
/// nothing more resolves. Returns the findings of what still does not resolve.
fn resolve_through_loaders(
    loader: &mut Loader<'_>,
    objects: &Objects,
    loaded_by: &mut HashMap<PathBuf, Vec<PathBuf>>,
    unresolved: Vec<Unresolved>,
) -> Result<Vec<Finding>, AuditError> {
    let rpath_of: HashMap<&Path, &ElfInfo> =
        objects.list.iter().map(|(p, i)| (p.as_path(), i)).collect();
    let mut pending = unresolved;
    loop {
        let mut still = Vec::new();
        let mut progressed = false;
        for entry in pending {
            match inherited_rpath_lookup(loader, &rpath_of, loaded_by, &entry.path, &entry.needed)?
            {
                Some(found) => {
                    loaded_by.entry(found).or_default().push(entry.path.clone());
                    progressed = true;
                }
                None => still.push(entry),
            }
        }
        pending = still;
        if !progressed || pending.is_empty() {
            break;
        }
    }
    Ok(pending.into_iter().map(|entry| entry.finding).collect())
}

/// Search the DT_RPATH of `path`'s loaders, and theirs, for `needed` (only when `path`
/// itself has no DT_RUNPATH, as glibc does).
fn inherited_rpath_lookup(
    library_loader: &mut Loader<'_>,
    objects: &HashMap<&Path, &ElfInfo>,
    loaded_by: &HashMap<PathBuf, Vec<PathBuf>>,
    path: &Path,
    needed: &str,
) -> Result<Option<PathBuf>, AuditError> {
    let Some(requester) = objects.get(path) else {
        return Ok(None);
    };
    if !requester.runpath.is_empty() {
        return Ok(None);
    }
    let mut queue: Vec<PathBuf> = loaded_by.get(path).cloned().unwrap_or_default();
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    while let Some(loader) = queue.pop() {
        if !seen.insert(loader.clone()) {
            continue;
        }
        if let Some(info) = objects.get(loader.as_path()) {
            if info.runpath.is_empty() && !info.rpath.is_empty() {
                let origin = loader.parent().unwrap_or(Path::new("/")).to_path_buf();
                for dir in info.expanded_rpath(&origin) {
                    if let Some(found) =
                        library_loader.try_dir(&dir, needed, requester.class, requester.machine)?
                    {
                        return Ok(Some(found));
                    }
                }
            }
        }
        queue.extend(loaded_by.get(&loader).cloned().unwrap_or_default());
    }
    Ok(None)
}

fn display_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        "(none)".into()
    } else {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }
}
