//! Planning an install: read a wheel's metadata (WHEEL, RECORD, METADATA's `Name:`,
//! entry_points.txt, `.data/scripts/`) and list every object the install creates, in path
//! order, before any byte is written. Each step of PEP 427's "Installing a wheel" is one
//! function below; [`plan_with_reader`] calls them in order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::entry_points::{launcher, parse_scripts, ScriptEntry};
use super::record::{parse_record, write_record, RecordRow};
use super::{
    is_normalised_absolute, relative_path, safe_member_path, EntryContent, InstallEntry,
    InstallError, InstallOptions, InstallPlan, WheelReader, INSTALLER,
};
use crate::digest::Digest;
use crate::names::{PackageName, WheelFilename};

/// One file member of the wheel (directories are not planned from the zip).
struct Member {
    index: usize,
    name: String,
    relative: PathBuf,
    executable: bool,
    size: u64,
}

/// The wheel's `<distribution>-<version>.dist-info` directory.
struct DistInfo {
    /// `demo_pkg-1.0.dist-info`.
    dir: String,
    /// The distribution name as the directory spells it (`demo_pkg`).
    distribution: String,
    version: String,
}

impl DistInfo {
    /// The member path of `file` inside the directory.
    fn member(&self, file: &str) -> String {
        format!("{}/{file}", self.dir)
    }

    /// The `<distribution>-<version>.data` directory beside it.
    fn data_dir(&self) -> String {
        format!("{}.data", self.dir.trim_end_matches(".dist-info"))
    }
}

/// Where the members of one wheel go: the options plus what the wheel's metadata decided.
struct Destinations<'a> {
    options: &'a InstallOptions,
    /// purelib or platlib, as WHEEL's `Root-Is-Purelib` says.
    root_dir: PathBuf,
    data_dir: String,
    project_name: String,
}

/// The entries planned so far, keyed by destination, and the RECORD rows they make.
struct PlannedFiles {
    wheel: PathBuf,
    files: BTreeMap<PathBuf, (String, InstallEntry)>,
    /// Image path, hash and size of every planned file.
    record: Vec<(PathBuf, Option<Digest>, Option<u64>)>,
}

/// Read a wheel's metadata and plan its install. Only WHEEL, RECORD, entry_points.txt and
/// `.data/scripts/` members are read; everything else is planned as a [`EntryContent::ZipMember`].
pub fn plan_wheel(wheel: &Path, options: &InstallOptions) -> Result<InstallPlan, InstallError> {
    let mut reader = WheelReader::open(wheel)?;
    plan_with_reader(&mut reader, options)
}

/// [`plan_wheel`] on an already-open wheel (keep it open to stream members afterwards).
pub fn plan_with_reader(
    reader: &mut WheelReader,
    options: &InstallOptions,
) -> Result<InstallPlan, InstallError> {
    let wheel = reader.path.clone();
    let wheel_name = parse_file_name(&wheel)?;
    check_options(options)?;
    let members = list_members(reader)?;
    let dist_info = find_dist_info(&wheel, &members, &wheel_name.name)?;
    let root_is_purelib = read_wheel_metadata(reader, &dist_info)?;
    let mut recorded = read_record(reader, &dist_info)?;
    let destinations = Destinations {
        options,
        root_dir: if root_is_purelib {
            options.scheme.purelib.clone()
        } else {
            options.scheme.platlib.clone()
        },
        data_dir: dist_info.data_dir(),
        project_name: read_project_name(reader, &dist_info)?,
    };
    let scripts = read_scripts(reader, &dist_info)?;
    let mut planned = PlannedFiles::new(wheel.clone());
    plan_members(
        reader,
        &destinations,
        &dist_info,
        &members,
        &mut recorded,
        &mut planned,
    )?;
    plan_generated(&destinations, &dist_info, &scripts, &mut planned)?;
    Ok(InstallPlan {
        wheel,
        distribution: dist_info.distribution,
        project_name: destinations.project_name,
        version: dist_info.version,
        dist_info: destinations.root_dir.join(&dist_info.dir),
        entries: planned.into_entries(),
    })
}

/// The wheel's file name, parsed (PEP 427 "File name convention").
fn parse_file_name(wheel: &Path) -> Result<WheelFilename, InstallError> {
    let file_name = wheel
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    file_name
        .parse()
        .map_err(|_| InstallError::BadFileName { name: file_name })
}

/// The interpreter must fit a shebang and every scheme directory must be an image path.
fn check_options(options: &InstallOptions) -> Result<(), InstallError> {
    // Linux reads at most 127 bytes of a shebang and splits it at whitespace.
    if !options.python.starts_with('/')
        || options.python.len() > 127
        || options.python.chars().any(char::is_whitespace)
    {
        return Err(InstallError::BadInterpreter {
            python: options.python.clone(),
        });
    }
    for dir in [
        &options.scheme.purelib,
        &options.scheme.platlib,
        &options.scheme.scripts,
        &options.scheme.data,
        &options.scheme.headers,
    ] {
        if !is_normalised_absolute(dir) {
            return Err(InstallError::BadDestination { path: dir.clone() });
        }
    }
    Ok(())
}

/// Every file member: safe name, no duplicates, no symlinks. The zip reader indexes members
/// by name, so a repeated name is only visible as the archive's flag.
fn list_members(reader: &mut WheelReader) -> Result<Vec<Member>, InstallError> {
    let wheel = reader.path.clone();
    if reader.archive.has_duplicate_names() {
        return Err(InstallError::DuplicateNames { wheel });
    }
    let mut members: Vec<Member> = Vec::new();
    let mut seen = BTreeSet::new();
    for index in 0..reader.archive.len() {
        let member = reader
            .archive
            .by_index_raw(index)
            .map_err(|source| InstallError::Zip {
                path: wheel.clone(),
                source,
            })?;
        let name = String::from_utf8_lossy(member.name_raw()).into_owned();
        let relative = safe_member_path(&name).map_err(|reason| InstallError::UnsafePath {
            wheel: wheel.clone(),
            member: name.clone(),
            reason,
        })?;
        let key = name.trim_end_matches('/').to_string();
        if !seen.insert(key.clone()) {
            return Err(InstallError::DuplicateMember {
                wheel: wheel.clone(),
                member: key,
            });
        }
        if member.is_symlink() {
            return Err(InstallError::SymlinkMember {
                wheel: wheel.clone(),
                member: name,
            });
        }
        if member.is_dir() {
            continue;
        }
        members.push(Member {
            index,
            name: key,
            relative,
            executable: member.unix_mode().is_some_and(|mode| mode & 0o111 != 0),
            size: member.size(),
        });
    }
    Ok(members)
}

/// The one `.dist-info` directory whose distribution name normalises to `wanted`.
fn find_dist_info(
    wheel: &Path,
    members: &[Member],
    wanted: &PackageName,
) -> Result<DistInfo, InstallError> {
    let dirs: BTreeSet<&str> = members
        .iter()
        .filter_map(|m| m.name.split('/').next())
        .filter(|top| {
            top.strip_suffix(".dist-info")
                .and_then(|stem| stem.split_once('-'))
                .is_some_and(|(name, _)| PackageName::from_str(name).is_ok_and(|n| &n == wanted))
        })
        .collect();
    if dirs.len() != 1 {
        return Err(InstallError::DistInfo {
            wheel: wheel.to_path_buf(),
            distribution: distribution_as_written(wheel),
            found: dirs.len(),
        });
    }
    let dir = dirs.into_iter().next().expect("one");
    let (distribution, version) = dir
        .trim_end_matches(".dist-info")
        .split_once('-')
        .expect("checked above");
    Ok(DistInfo {
        dir: dir.to_string(),
        distribution: distribution.to_string(),
        version: version.to_string(),
    })
}

/// The distribution as the wheel's file name spells it (`Demo_Pkg`), for messages.
fn distribution_as_written(wheel: &Path) -> String {
    let file_name = wheel
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    file_name.split('-').next().unwrap_or_default().to_string()
}

/// A `.dist-info` member every wheel has: its bytes, or `MissingMetadata`.
fn read_required(reader: &mut WheelReader, member: &str) -> Result<Vec<u8>, InstallError> {
    reader
        .read_small(member)?
        .ok_or_else(|| InstallError::MissingMetadata {
            wheel: reader.path.clone(),
            member: member.to_string(),
        })
}

/// Read WHEEL: check `Wheel-Version` is 1.x and return `Root-Is-Purelib`.
fn read_wheel_metadata(
    reader: &mut WheelReader,
    dist_info: &DistInfo,
) -> Result<bool, InstallError> {
    let wheel = reader.path.clone();
    let member = dist_info.member("WHEEL");
    let bytes = read_required(reader, &member)?;
    let text = String::from_utf8_lossy(&bytes);
    let header = |key: &str| {
        text.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().to_string())
        })
    };
    let wheel_version = header("Wheel-Version").ok_or_else(|| InstallError::BadMetadata {
        wheel: wheel.clone(),
        member: member.clone(),
        reason: "no Wheel-Version".into(),
    })?;
    if wheel_version.split('.').next() != Some("1") {
        return Err(InstallError::UnsupportedWheelVersion {
            wheel,
            version: wheel_version,
        });
    }
    Ok(header("Root-Is-Purelib")
        .map(|v| v.eq_ignore_ascii_case("true"))
        .unwrap_or(false))
}

/// Read RECORD into rows keyed by member path.
fn read_record(
    reader: &mut WheelReader,
    dist_info: &DistInfo,
) -> Result<BTreeMap<String, RecordRow>, InstallError> {
    let wheel = reader.path.clone();
    let member = dist_info.member("RECORD");
    let bytes = read_required(reader, &member)?;
    let rows =
        parse_record(&String::from_utf8_lossy(&bytes)).map_err(|source| InstallError::Record {
            wheel,
            member,
            source,
        })?;
    Ok(rows
        .into_iter()
        .map(|row| (row.path.clone(), row))
        .collect())
}

/// The project name as METADATA spells it, which names the headers directory (as pip
/// does); the distribution name when METADATA has none that is a plain file name.
fn read_project_name(
    reader: &mut WheelReader,
    dist_info: &DistInfo,
) -> Result<String, InstallError> {
    Ok(reader
        .read_small(&dist_info.member("METADATA"))?
        .and_then(|bytes| {
            String::from_utf8_lossy(&bytes)
                .lines()
                .take_while(|line| !line.is_empty())
                .find_map(|line| line.strip_prefix("Name:").map(|v| v.trim().to_string()))
        })
        .filter(|name| safe_member_path(name).is_ok() && !name.contains('/'))
        .unwrap_or_else(|| dist_info.distribution.clone()))
}

/// The console and GUI scripts of entry_points.txt (none without the file).
fn read_scripts(
    reader: &mut WheelReader,
    dist_info: &DistInfo,
) -> Result<Vec<ScriptEntry>, InstallError> {
    match reader.read_small(&dist_info.member("entry_points.txt"))? {
        Some(bytes) => parse_scripts(&String::from_utf8_lossy(&bytes)).map_err(|source| {
            InstallError::EntryPoints {
                wheel: reader.path.clone(),
                source,
            }
        }),
        None => Ok(Vec::new()),
    }
}

/// Plan every member against its RECORD row; then every RECORD row must have been used.
fn plan_members(
    reader: &mut WheelReader,
    destinations: &Destinations,
    dist_info: &DistInfo,
    members: &[Member],
    recorded: &mut BTreeMap<String, RecordRow>,
    planned: &mut PlannedFiles,
) -> Result<(), InstallError> {
    let wheel = reader.path.clone();
    let skipped: BTreeSet<String> = ["RECORD", "RECORD.jws", "RECORD.p7s", "INSTALLER"]
        .iter()
        .map(|file| dist_info.member(file))
        .collect();
    for member in members {
        if skipped.contains(&member.name) {
            continue;
        }
        let row = recorded
            .remove(&member.name)
            .filter(|row| row.hash.is_some())
            .ok_or_else(|| InstallError::NotInRecord {
                wheel: wheel.clone(),
                member: member.name.clone(),
            })?;
        if let Some(size) = row.size.filter(|&size| size != member.size) {
            return Err(InstallError::HashMismatch {
                wheel: wheel.clone(),
                member: member.name.clone(),
                expected: format!("{size} bytes"),
                found: format!("{} bytes", member.size),
            });
        }
        let digest = row.hash.expect("filtered");
        let entry = plan_member(reader, destinations, member, digest)?;
        planned.add(member.name.clone(), entry)?;
    }
    recorded.retain(|path, _| !skipped.contains(path));
    if let Some(path) = recorded.keys().next() {
        return Err(InstallError::RecordedButMissing {
            wheel,
            member: path.clone(),
        });
    }
    Ok(())
}

/// The entry for one member whose RECORD digest is `digest`: a zip member streamed later,
/// or, for a `.data/scripts/` file, its bytes read now (checked against `digest`) with a
/// `#!python` shebang rewritten.
fn plan_member(
    reader: &mut WheelReader,
    destinations: &Destinations,
    member: &Member,
    digest: Digest,
) -> Result<InstallEntry, InstallError> {
    let (path, is_script) = destinations.of(&reader.path, member)?;
    if !is_script {
        return Ok(InstallEntry {
            path,
            mode: if member.executable { 0o755 } else { 0o644 },
            content: EntryContent::ZipMember {
                index: member.index,
                name: member.name.clone(),
                digest,
                size: member.size,
            },
        });
    }
    let bytes = reader.read_small_index(member.index, &member.name)?;
    let found = Digest::of_bytes(&bytes);
    if found != digest {
        return Err(InstallError::HashMismatch {
            wheel: reader.path.clone(),
            member: member.name.clone(),
            expected: digest.to_string(),
            found: found.to_string(),
        });
    }
    let bytes = rewrite_shebang(&bytes, &destinations.options.python).unwrap_or(bytes);
    Ok(InstallEntry {
        path,
        mode: 0o755,
        content: EntryContent::generated(bytes),
    })
}

impl Destinations<'_> {
    /// Where `member` installs, and whether it is a script (`.data/scripts/`): members
    /// under `<name>.data/<scheme>/` go to that scheme's directory, all others under the
    /// root directory.
    fn of(&self, wheel: &Path, member: &Member) -> Result<(PathBuf, bool), InstallError> {
        let Ok(inside) = member.relative.strip_prefix(&self.data_dir) else {
            return Ok((self.root_dir.join(&member.relative), false));
        };
        let mut parts = inside.components();
        let scheme = parts
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let rest = parts.as_path();
        if rest.as_os_str().is_empty() {
            return Err(InstallError::UnsafePath {
                wheel: wheel.to_path_buf(),
                member: member.name.clone(),
                reason: "a .data member must be inside a scheme directory",
            });
        }
        let dirs = &self.options.scheme;
        Ok(match scheme.as_str() {
            "purelib" => (dirs.purelib.join(rest), false),
            "platlib" => (dirs.platlib.join(rest), false),
            "data" => (dirs.data.join(rest), false),
            "headers" => (dirs.headers.join(&self.project_name).join(rest), false),
            "scripts" => (dirs.scripts.join(rest), true),
            _ => {
                return Err(InstallError::UnknownScheme {
                    wheel: wheel.to_path_buf(),
                    member: member.name.clone(),
                    scheme,
                })
            }
        })
    }
}

/// The files the installer writes itself: script launchers, INSTALLER and RECORD (which
/// lists every file, itself without a hash).
fn plan_generated(
    destinations: &Destinations,
    dist_info: &DistInfo,
    scripts: &[ScriptEntry],
    planned: &mut PlannedFiles,
) -> Result<(), InstallError> {
    let options = destinations.options;
    for script in scripts {
        planned.add(
            format!("entry point {}", script.name),
            InstallEntry {
                path: options.scheme.scripts.join(&script.name),
                mode: 0o755,
                content: EntryContent::generated(launcher(script, &options.python)),
            },
        )?;
    }
    let dist_info_dir = destinations.root_dir.join(&dist_info.dir);
    planned.add(
        "INSTALLER".into(),
        InstallEntry {
            path: dist_info_dir.join("INSTALLER"),
            mode: 0o644,
            content: EntryContent::generated(format!("{INSTALLER}\n").into_bytes()),
        },
    )?;
    let record_path = dist_info_dir.join("RECORD");
    let record = planned.record_file(&destinations.root_dir, &record_path);
    planned.add(
        "RECORD".into(),
        InstallEntry {
            path: record_path,
            mode: 0o644,
            content: EntryContent::generated(record.into_bytes()),
        },
    )
}

impl PlannedFiles {
    fn new(wheel: PathBuf) -> Self {
        PlannedFiles {
            wheel,
            files: BTreeMap::new(),
            record: Vec::new(),
        }
    }

    /// Plan `entry` (made from `source`, for messages) and its RECORD row; two entries for
    /// one destination are an error.
    fn add(&mut self, source: String, entry: InstallEntry) -> Result<(), InstallError> {
        if let Some((first, _)) = self.files.get(&entry.path) {
            return Err(InstallError::DuplicateDestination {
                wheel: self.wheel.clone(),
                first: first.clone(),
                second: source,
                destination: entry.path.clone(),
            });
        }
        let (hash, size) = match &entry.content {
            EntryContent::Generated { bytes, digest } => (Some(*digest), Some(bytes.len() as u64)),
            EntryContent::ZipMember { digest, size, .. } => (Some(*digest), Some(*size)),
            EntryContent::Directory | EntryContent::Symlink { .. } => (None, None),
        };
        self.record.push((entry.path.clone(), hash, size));
        self.files.insert(entry.path.clone(), (source, entry));
        Ok(())
    }

    /// The RECORD text: every planned file relative to `root_dir`, plus RECORD itself at
    /// `record_path` without hash or size, sorted by path.
    fn record_file(&self, root_dir: &Path, record_path: &Path) -> String {
        let mut rows: Vec<RecordRow> = self
            .record
            .iter()
            .map(|(path, hash, size)| (path.as_path(), *hash, *size))
            .chain(std::iter::once((record_path, None, None)))
            .map(|(path, hash, size)| RecordRow {
                path: relative_path(root_dir, path).to_string_lossy().into_owned(),
                hash,
                size,
            })
            .collect();
        rows.sort_by(|a, b| a.path.cmp(&b.path));
        write_record(&rows)
    }

    /// Every planned file plus the parent directories they need, sorted by path (parents
    /// before children).
    fn into_entries(self) -> Vec<InstallEntry> {
        let mut directories = BTreeSet::new();
        for path in self.files.keys() {
            for ancestor in path.ancestors().skip(1) {
                if ancestor != Path::new("/") && !ancestor.as_os_str().is_empty() {
                    directories.insert(ancestor.to_path_buf());
                }
            }
        }
        directories.retain(|dir| !self.files.contains_key(dir));
        let mut entries: Vec<InstallEntry> = directories
            .into_iter()
            .map(|path| InstallEntry {
                path,
                mode: 0o755,
                content: EntryContent::Directory,
            })
            .chain(self.files.into_values().map(|(_, entry)| entry))
            .collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        entries
    }
}

/// PEP 427: a script whose first line is `#!python` (or `#!pythonw`) gets the target
/// interpreter. Returns None when the script has another shebang.
fn rewrite_shebang(bytes: &[u8], python: &str) -> Option<Vec<u8>> {
    let rest = bytes.strip_prefix(b"#!python")?;
    let rest = rest.strip_prefix(b"w").unwrap_or(rest);
    let line_end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let arguments = &rest[..line_end];
    // `#!python3` or `#!python-foo` is not the placeholder.
    if !(arguments.is_empty() || arguments[0] == b' ' || arguments[0] == b'\r') {
        return None;
    }
    let mut out = format!("#!{python}").into_bytes();
    out.extend_from_slice(arguments.strip_suffix(b"\r").unwrap_or(arguments));
    out.extend_from_slice(&rest[line_end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebang_rewriting() {
        assert_eq!(
            rewrite_shebang(b"#!python\nprint(1)\n", "/usr/bin/python3").unwrap(),
            b"#!/usr/bin/python3\nprint(1)\n"
        );
        assert_eq!(
            rewrite_shebang(b"#!pythonw -u\r\nx", "/p").unwrap(),
            b"#!/p -u\nx"
        );
        assert!(rewrite_shebang(b"#!python3\n", "/p").is_none());
        assert!(rewrite_shebang(b"#!/bin/sh\n", "/p").is_none());
    }
}
