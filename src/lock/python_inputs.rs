//! The recipe's Python input files, read into what the resolver takes: root
//! requirements, constraints that restrict versions without adding packages, and the sha256
//! each package's file must have when an input lists hashes.
//!
//! Every file read (requirements files and their includes, pyproject.toml, pylock.toml,
//! uv.lock) is hashed into the lock's digest ([`PythonInputs::lock_digest`]), so editing one
//! makes the lock stale; a recipe that reads no file keeps its recipe lock digest, so its
//! existing locks stay fresh. Markers are evaluated here, for the lock's [`Target`], as the
//! resolver evaluates them for `packages:`. Each requirement keeps where it was written
//! ([`Origin`]), so an error can say `requirements.txt:3`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use pep440_rs::{Operator, Version, VersionSpecifiers};
use pep508_rs::{
    MarkerEnvironment, PackageName, Pep508Error, Pep508ErrorSource, Pep508Url, Requirement,
    VersionOrUrl,
};
use pubgrub::Ranges;

use crate::digest::Digest;
use crate::fetch::local_wheels::LocalWheels;
use crate::lock::target::Target;
use crate::lock::LockRequest;
use crate::matrix::ResolvedRecipe;
use crate::recipe::python_inputs::PythonLockFormat;
use crate::recipe::Recipe;

/// No requirements file, pyproject or lock a team keeps is this big.
pub const MAX_INPUT_BYTES: u64 = 16 * 1024 * 1024;

/// The most requirements, constraints and locked packages all inputs of a recipe may hold
/// (each costs requests to the indexes; a 200,000-line file fits in
/// [`MAX_INPUT_BYTES`]). A large monorepo's uv.lock holds about a thousand.
pub const MAX_REQUIREMENTS: usize = 10_000;

/// The most files (inputs and their `-r`/`-c` includes) one recipe may read.
pub const MAX_INPUT_FILES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum PythonInputsError {
    #[error("failed to read `{path}`, named by the recipe (`{key}`)")]
    Read {
        path: PathBuf,
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is larger than {MAX_INPUT_BYTES} bytes; no requirements file or lock is that big\n  hint: check that the recipe names the file you meant")]
    TooLarge { path: PathBuf },
    /// A FIFO would block `lock` until something writes to it; a device may never
    /// end.
    #[error("`{display}` ({key}) is {kind}, not a regular file; cudastack reads its inputs from regular files only\n  hint: name the file itself in the recipe (or the include), not a pipe, device or directory")]
    NotAFile {
        display: String,
        key: String,
        kind: &'static str,
    },
    #[error("{origin}: more than {MAX_REQUIREMENTS} requirements in the recipe's inputs, each of which the lock asks the indexes about\n  hint: check that the recipe names the files you meant; a project's dependencies are far fewer")]
    TooManyRequirements { origin: Origin },
    #[error("`{display}` ({key}): more than {MAX_INPUT_FILES} input files (includes counted)\n  hint: check the `-r`/`-c` includes; a project's inputs are a few files")]
    TooManyFiles { display: String, key: String },
    #[error("`{path}` is not UTF-8 text (invalid byte at offset {offset})\n  hint: save it as UTF-8; pip, uv and PEP 751 read these files as UTF-8")]
    NotText { path: PathBuf, offset: usize },
    /// A line or entry of an input that cudastack refuses: what, and what to do instead.
    #[error("{origin}: {message}\n  hint: {hint}")]
    Entry {
        origin: Origin,
        message: String,
        hint: String,
    },
    #[error("`{path}` is not valid TOML")]
    Toml {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A path the recipe or an include names that leads out of the recipe's directory.
    #[error("`{path}` ({key}) is outside the recipe's directory: {why}; a recipe (one from a pull request, say) must not read other files of the machine that locks it\n  hint: move the file into the recipe's directory or a folder below it, and name it relative to the file that names it")]
    OutsideRecipe {
        path: String,
        key: String,
        why: &'static str,
    },
    #[error("{origin}: `{requirement}` conflicts with the stack: {stack}\n  hint: {hint}")]
    StackConflict {
        origin: Origin,
        requirement: String,
        stack: String,
        hint: String,
    },
}

/// Where a requirement was written: `requirements.txt:3`, or a file and the table it is in
/// (`pyproject.toml:12 ([project.optional-dependencies] train)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file relative to the recipe's directory, as the recipe and includes name it.
    pub file: String,
    pub line: Option<usize>,
    pub place: Option<String>,
}

impl Origin {
    pub fn line(file: &str, line: usize) -> Origin {
        Origin {
            file: file.to_string(),
            line: Some(line),
            place: None,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(place) = &self.place {
            write!(f, " ({place})")?;
        }
        Ok(())
    }
}

/// A requirement and where it was written.
#[derive(Debug, Clone)]
pub struct Sourced {
    pub requirement: Requirement,
    pub origin: Origin,
}

/// The files a package may be locked to: their sha256, and who listed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashPin {
    pub origin: Origin,
    pub sha256: BTreeSet<Digest>,
}

/// What the resolver must respect besides the root requirements.
#[derive(Debug, Clone, Default)]
pub struct Constraints {
    /// Version constraints (`-c constraints.txt`): they narrow a package's versions when
    /// something requires it, and install nothing themselves.
    pub versions: Vec<Sourced>,
    /// Accepted sha256 per package (`--hash`, an imported lock); other files are refused.
    pub hashes: BTreeMap<PackageName, HashPin>,
}

impl Constraints {
    /// Whether nothing is constrained.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty() && self.hashes.is_empty()
    }
}

/// One file that was read, named as the recipe names it, with the sha256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InputFile {
    pub path: String,
    pub sha256: Digest,
}

/// Everything the recipe's Python input files ask for, with markers evaluated for one target.
#[derive(Debug, Clone, Default)]
pub struct PythonInputs {
    pub roots: Vec<Sourced>,
    pub constraints: Constraints,
    pub files: Vec<InputFile>,
    /// Every wheel `wheels:` offers, by path, with its sha256 ([`Self::with_wheels`]).
    pub wheels: BTreeMap<String, Digest>,
    /// The local projects named by directory (`./libs/teamlib`, `-e .`): each is a root by
    /// its name, and is built from its directory (src/lock/sdist.rs).
    pub projects: Vec<LocalProject>,
}

/// A local project a requirements file names by its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalProject {
    /// The name its pyproject.toml declares.
    pub name: PackageName,
    /// Its directory, relative to the recipe's (`.` for the recipe's own).
    pub path: String,
    pub origin: Origin,
}

impl PythonInputs {
    /// Read every Python input of `recipe` (at `recipe_path`) for `target`.
    pub fn load(
        recipe: &Recipe,
        recipe_path: &Path,
        target: &Target,
    ) -> Result<PythonInputs, PythonInputsError> {
        let dir = recipe_path.parent().unwrap_or_else(|| Path::new(""));
        let mut reader = InputReader {
            dir: dir.to_path_buf(),
            env: target.marker_environment(),
            inputs: PythonInputs::default(),
        };
        for path in &recipe.requirements {
            crate::lock::requirements_txt::read(&mut reader, path.as_path())?;
        }
        if let Some(pyproject) = &recipe.pyproject {
            crate::lock::pyproject::read(&mut reader, pyproject)?;
        }
        if let Some(lock) = &recipe.python_lock {
            match lock.format {
                PythonLockFormat::Pylock => {
                    crate::lock::pylock::import(&mut reader, lock.path.as_path())?
                }
                PythonLockFormat::UvLock => {
                    crate::lock::uv_lock::import(&mut reader, lock.path.as_path())?
                }
            }
        }
        Ok(reader.inputs)
    }

    /// These inputs and the wheels of the recipe's `wheels:`: each one offered, not only
    /// those a lock chose, is part of the digest, because adding, removing or rebuilding
    /// any of them can change what the resolver picks (a newer version, a wheel whose tags
    /// now fit).
    pub fn with_wheels(mut self, local: &LocalWheels) -> Self {
        self.wheels = local.digests();
        self
    }

    /// The digest a lock of `recipe` records: the recipe's [`Recipe::lock_digest`] when it
    /// reads no file (what every lock recorded before these inputs existed), else that and
    /// what the files ask for: the requirements, constraints and accepted hashes as parsed
    /// (for this target, sorted, each once) and the names of the files read. A comment, a
    /// blank line, spacing or the order of lines changes none of it, so it leaves the lock
    /// fresh; a changed version or a new package does not.
    pub fn lock_digest(&self, recipe: &Recipe) -> Digest {
        if self.files.is_empty() && self.wheels.is_empty() {
            return recipe.lock_digest();
        }
        let sorted = |requirements: &[Sourced]| {
            requirements
                .iter()
                .map(|s| s.requirement.to_string())
                .collect::<BTreeSet<String>>()
        };
        let hashes: BTreeMap<String, &BTreeSet<Digest>> = self
            .constraints
            .hashes
            .iter()
            .map(|(name, pin)| (name.to_string(), &pin.sha256))
            .collect();
        let files: BTreeSet<&str> = self.files.iter().map(|f| f.path.as_str()).collect();
        let mut value = serde_json::json!({
            "recipe": recipe.lock_digest().to_string(),
            "requirements": sorted(&self.roots),
            "constraints": sorted(&self.constraints.versions),
            "hashes": hashes,
            "files": files,
        });
        self.add_wheels(&mut value);
        if !self.projects.is_empty() {
            let paths: BTreeSet<&str> = self.projects.iter().map(|p| p.path.as_str()).collect();
            value["projects"] = serde_json::json!(paths);
        }
        Digest::of_bytes(value.to_string().as_bytes())
    }

    /// The digest locks recorded before [`Self::lock_digest`] followed what the files mean:
    /// the recipe's and every file's name and bytes. A lock that recorded it is still fresh
    /// while the bytes are the same.
    pub fn byte_digest(&self, recipe: &Recipe) -> Digest {
        if self.files.is_empty() && self.wheels.is_empty() {
            return recipe.lock_digest();
        }
        let files: Vec<(&str, String)> = self
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.sha256.to_string()))
            .collect();
        let mut value =
            serde_json::json!({ "recipe": recipe.lock_digest().to_string(), "files": files });
        self.add_wheels(&mut value);
        Digest::of_bytes(value.to_string().as_bytes())
    }

    /// `wheels` in a digest's JSON, only when there are any: the digests of recipes
    /// without `wheels:` stay what their locks recorded.
    fn add_wheels(&self, value: &mut serde_json::Value) {
        if self.wheels.is_empty() {
            return;
        }
        let wheels: BTreeMap<&str, String> = self
            .wheels
            .iter()
            .map(|(path, sha256)| (path.as_str(), sha256.to_string()))
            .collect();
        value["wheels"] = serde_json::json!(wheels);
    }

    /// Refuse a requirement, constraint or locked package that the stack cannot honour:
    /// another torch, or another version of a wheel torch pins.
    pub fn check_stack(&self, stack: &[StackPin]) -> Result<(), PythonInputsError> {
        check_against_stack(self.roots.iter().chain(&self.constraints.versions), stack)
    }

    /// Add these inputs to `request`: roots after the recipe's, constraints and hashes, and
    /// the digest that makes the lock stale when a file changes. The local projects are
    /// the caller's to build (they are roots by name here).
    pub fn apply(self, recipe: &Recipe, request: &mut LockRequest) -> Vec<LocalProject> {
        request.recipe_digest = self.lock_digest(recipe);
        request.byte_digest = Some(self.byte_digest(recipe));
        request
            .requirements
            .extend(self.roots.into_iter().map(|s| s.requirement));
        request.constraints = self.constraints;
        self.projects
    }
}

/// Read the recipe's Python input files for `request`'s target, refuse what conflicts with
/// the stack, and add the rest to `request` ([`PythonInputs::apply`]).
pub fn add_to_request(
    resolved: &ResolvedRecipe,
    request: &mut LockRequest,
) -> Result<Vec<LocalProject>, PythonInputsError> {
    let (recipe, recipe_path) = (resolved.recipe(), resolved.path());
    let inputs = PythonInputs::load(recipe, recipe_path, &request.target)?
        .with_wheels(resolved.local_wheels());
    let stack = crate::lock::inputs::stack_pins(resolved);
    // `packages:` in the recipe itself are held to the same rule.
    let file = recipe_path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let packages: Vec<Sourced> = recipe
        .packages
        .iter()
        .map(|package| Sourced {
            requirement: package.0.clone(),
            origin: Origin {
                file: file.clone(),
                line: None,
                place: Some("packages:".into()),
            },
        })
        .collect();
    check_against_stack(packages.iter(), &stack)?;
    inputs.check_stack(&stack)?;
    Ok(inputs.apply(recipe, request))
}

/// Refuse the first of `requirements` that does not admit a version the stack decides.
fn check_against_stack<'a>(
    requirements: impl Iterator<Item = &'a Sourced>,
    stack: &[StackPin],
) -> Result<(), PythonInputsError> {
    for sourced in requirements {
        let Some(pin) = stack.iter().find(|p| p.name == sourced.requirement.name) else {
            continue;
        };
        let Some(VersionOrUrl::VersionSpecifier(wanted)) = &sourced.requirement.version_or_url
        else {
            continue;
        };
        if !pin.admits(wanted) {
            return Err(PythonInputsError::StackConflict {
                origin: sourced.origin.clone(),
                requirement: sourced.requirement.to_string(),
                stack: pin.why.clone(),
                hint: format!("drop the version of `{}` from {} (the stack decides it), or change the recipe's stack", pin.name, sourced.origin.file),
            });
        }
    }
    Ok(())
}

/// A version the stack decides, and why: the recipe's torch, a wheel torch pins, the CUDA
/// wheels of a recipe without torch.
#[derive(Debug, Clone)]
pub struct StackPin {
    pub name: PackageName,
    pub specifiers: VersionSpecifiers,
    /// `the recipe's torch is 2.4.1 (torch.version in the recipe)`.
    pub why: String,
}

impl StackPin {
    /// Whether a requirement's `wanted` versions admit what the stack installs.
    pub fn admits(&self, wanted: &VersionSpecifiers) -> bool {
        // An exact pin is tested as PEP 440 says (`==2.4.1` admits `2.4.1+cu121`).
        if let [only] = self.specifiers.iter().as_slice() {
            if *only.operator() == Operator::Equal {
                return wanted.contains(only.version());
            }
        }
        !Ranges::<Version>::from(wanted.clone())
            .intersection(&Ranges::from(self.specifiers.clone()))
            .is_empty()
    }
}

/// The state of one [`PythonInputs::load`]: where relative paths start, the marker
/// environment, and what was read so far. The readers of each format add to it.
pub(crate) struct InputReader {
    dir: PathBuf,
    pub(crate) env: MarkerEnvironment,
    pub(crate) inputs: PythonInputs,
}

impl InputReader {
    /// Read `display` (a path relative to the recipe's directory) whole, record its digest,
    /// and return its text. `key` names the recipe key in errors.
    pub(crate) fn read_text(
        &mut self,
        display: &str,
        key: &str,
    ) -> Result<String, PythonInputsError> {
        use std::io::Read;
        let path = self.dir.join(display);
        let read_error = |source| PythonInputsError::Read {
            path: path.clone(),
            key: key.to_string(),
            source,
        };
        // By name the path is inside (`join_relative`); a symbolic link may still lead out.
        let root = if self.dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            self.dir.as_path()
        };
        let root = std::fs::canonicalize(root).map_err(read_error)?;
        let real = std::fs::canonicalize(&path).map_err(read_error)?;
        if !real.starts_with(&root) {
            return Err(PythonInputsError::OutsideRecipe {
                path: crate::reference::escape(display),
                key: key.to_string(),
                why: "it is or passes through a symbolic link that leads out of it",
            });
        }
        if self.inputs.files.len() >= MAX_INPUT_FILES {
            return Err(PythonInputsError::TooManyFiles {
                display: crate::reference::escape(display),
                key: key.to_string(),
            });
        }
        let not_a_file = |kind| PythonInputsError::NotAFile {
            display: crate::reference::escape(display),
            key: key.to_string(),
            kind,
        };
        let file = match crate::contained_file::open_regular(&real) {
            Ok(Ok(file)) => file,
            Ok(Err(kind)) => return Err(not_a_file(kind)),
            Err(error) => return Err(read_error(error)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 > MAX_INPUT_BYTES {
            return Err(PythonInputsError::TooLarge { path });
        }
        let sha256 = Digest::of_bytes(&bytes);
        if !self.inputs.files.iter().any(|f| f.path == display) {
            self.inputs.files.push(InputFile {
                path: display.to_string(),
                sha256,
            });
        }
        String::from_utf8(bytes).map_err(|e| PythonInputsError::NotText {
            path,
            offset: e.utf8_error().valid_up_to(),
        })
    }

    /// Keep the project at `display` (a directory relative to the recipe's) as a root by
    /// the name its pyproject.toml declares.
    pub(crate) fn add_project(
        &mut self,
        display: &str,
        origin: Origin,
    ) -> Result<(), PythonInputsError> {
        let dir = if display.is_empty() { "." } else { display };
        let pyproject = format!(
            "{}pyproject.toml",
            if display.is_empty() {
                String::new()
            } else {
                format!("{display}/")
            }
        );
        let text = self.read_text(&pyproject, &format!("the project at {origin}"))?;
        let refused = |message: String, hint: &str| PythonInputsError::Entry {
            origin: origin.clone(),
            message,
            hint: hint.to_string(),
        };
        let name = project_name(&text).map_err(|why| {
            refused(
                format!("the project `{dir}`: {why}"),
                "a project named by its directory is locked by the static `[project]` table of its pyproject.toml (PEP 621): give it `name`, `version` and `dependencies`",
            )
        })?;
        // The same directory named again (two included files both say `-e .`): once.
        if self
            .inputs
            .projects
            .iter()
            .any(|p| p.name == name && p.path == dir)
        {
            return Ok(());
        }
        if self.inputs.projects.iter().any(|p| p.name == name) {
            return Err(refused(
                format!("the project `{name}` is named by two directories"),
                "keep one of them",
            ));
        }
        let requirement = crate::names::parse_requirement(name.as_ref())
            .expect("a package name is a requirement");
        self.add_root(requirement, origin.clone())?;
        self.inputs.projects.push(LocalProject {
            name,
            path: dir.to_string(),
            origin,
        });
        Ok(())
    }

    /// Keep `requirement` as a root when its marker holds for the target; refuse one past
    /// [`MAX_REQUIREMENTS`].
    pub(crate) fn add_root(
        &mut self,
        requirement: Requirement,
        origin: Origin,
    ) -> Result<(), PythonInputsError> {
        self.count(&origin)?;
        if requirement.evaluate_markers(&self.env, &[]) {
            self.inputs.roots.push(Sourced {
                requirement,
                origin,
            });
        }
        Ok(())
    }

    /// Keep `requirement` as a version constraint when its marker holds for the target;
    /// refuse one past [`MAX_REQUIREMENTS`].
    pub(crate) fn add_constraint(
        &mut self,
        requirement: Requirement,
        origin: Origin,
    ) -> Result<(), PythonInputsError> {
        self.count(&origin)?;
        if requirement.evaluate_markers(&self.env, &[]) {
            self.inputs.constraints.versions.push(Sourced {
                requirement,
                origin,
            });
        }
        Ok(())
    }

    /// Refuse the requirement at `origin` when the inputs already hold [`MAX_REQUIREMENTS`].
    fn count(&self, origin: &Origin) -> Result<(), PythonInputsError> {
        let held = self.inputs.roots.len() + self.inputs.constraints.versions.len();
        if held >= MAX_REQUIREMENTS {
            return Err(PythonInputsError::TooManyRequirements {
                origin: origin.clone(),
            });
        }
        Ok(())
    }

    /// Accept only `sha256` for `name`'s files (added to what an earlier line listed).
    pub(crate) fn add_hashes(
        &mut self,
        name: PackageName,
        origin: Origin,
        sha256: BTreeSet<Digest>,
    ) {
        self.inputs
            .constraints
            .hashes
            .entry(name)
            .or_insert_with(|| HashPin {
                origin,
                sha256: BTreeSet::new(),
            })
            .sha256
            .extend(sha256);
    }
}

/// The URL of a `name @ git+...` requirement as written, when it is one.
pub(crate) fn git_url_text<T: fmt::Display>(url: &T) -> Option<String> {
    let text = url.to_string();
    text.starts_with("git+").then_some(text)
}

/// Whether `requirement` is a git requirement (`name @ git+https://...`), which is locked by
/// commit and built from source (src/fetch/git.rs); a git URL cudastack does not fetch
/// from is refused here, naming `origin`.
pub(crate) fn is_git_requirement(
    requirement: &Requirement,
    origin: &Origin,
) -> Result<bool, PythonInputsError> {
    let Some(VersionOrUrl::Url(url)) = &requirement.version_or_url else {
        return Ok(false);
    };
    let Some(text) = git_url_text(url) else {
        return Ok(false);
    };
    crate::fetch::git::GitSource::parse(&text).map_err(|error| PythonInputsError::Entry {
        origin: origin.clone(),
        message: format!("the requirement `{}`: {error}", requirement.name),
        hint: "see docs/source-builds.md (git requirements)".into(),
    })?;
    Ok(true)
}

/// The `[project] name` of a pyproject.toml.
fn project_name(text: &str) -> Result<PackageName, String> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| format!("its pyproject.toml is not TOML: {e}"))?;
    let name = table
        .get("project")
        .and_then(|p| p.get("name"))
        .and_then(toml::Value::as_str)
        .ok_or("its pyproject.toml has no `[project] name`")?;
    PackageName::from_str(name).map_err(|e| format!("`{name}` is not a package name: {e}"))
}

/// `base` joined with `relative`, `.` and `..` resolved by name: the path as the recipe's
/// directory sees it, for messages and the lock's digest. A path that is absolute or whose
/// `..` climbs out of the recipe's directory is refused (`key` names who asked for it): a
/// recipe must not read `/home/ci/.netrc` or `../../.git-credentials` into an error or a lock.
pub(crate) fn join_relative(
    base: &Path,
    relative: &Path,
    key: &str,
) -> Result<String, PythonInputsError> {
    let outside = |why| PythonInputsError::OutsideRecipe {
        path: crate::reference::escape(&relative.to_string_lossy()),
        key: key.to_string(),
        why,
    };
    let mut parts: Vec<String> = Vec::new();
    for component in base.join(relative).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(outside("its `..` climbs out of it"));
                }
            }
            Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            Component::RootDir | Component::Prefix(_) => {
                return Err(outside("it is an absolute path"))
            }
        }
    }
    Ok(parts.join("/"))
}

/// What to do with a package that is not on an index.
pub(crate) const PUBLISH_OR_COPY: &str = "put its wheel in a directory named in the recipe's `wheels:` and require it by name, publish the package to an index named in the recipe's `indexes:`, name a project's directory (`./libs/teamlib`) or git repository (`name @ git+https://...@TAG`) to have it built, or put your own code in the image with `copy:`";

/// The leading name-like token of a line (`torch` of `torch==2.5.1`), all an error may quote
/// of a line that is not a requirement: the line may be a secret (`-r` of a credentials file).
pub(crate) fn name_token(text: &str) -> &str {
    let text = text.trim_start();
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(text.len());
    &text[..end]
}

/// Why `text` is not a PEP 508 requirement: its name token, the column, and the parser's
/// reason with every part of the rest of the line cut out, so that no error prints more of
/// an input than its first word.
pub(crate) fn invalid_requirement<T: Pep508Url>(text: &str, error: &Pep508Error<T>) -> String {
    let name = name_token(text);
    let rest = &text.trim_start()[name.len()..];
    let reason = match &error.message {
        Pep508ErrorSource::UrlError(_) => "its URL is not valid".to_string(),
        other => redact(&other.to_string(), rest),
    };
    let what = if name.is_empty() {
        "the line".to_string()
    } else {
        format!("`{name}`...")
    };
    format!(
        "{what} is not a valid PEP 508 requirement (at character {}): {reason}",
        error.start + 1
    )
}

/// `message` with every quoted part longer than a character that appears in `secret`, and
/// every word of `secret` of 3 characters or more, replaced by `…`.
fn redact(message: &str, secret: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(open) = rest.find(['`', '\'']) {
        let quote = rest[open..].chars().next().unwrap_or('`');
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            break;
        };
        let inner = &after[..close];
        out.push_str(&rest[..=open]);
        if inner.chars().count() > 1 && secret.contains(inner) {
            out.push('…');
        } else {
            out.push_str(inner);
        }
        out.push(quote);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    for word in secret.split_whitespace().filter(|w| w.chars().count() >= 3) {
        out = out.replace(word, "…");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// Load the inputs of a recipe with `requirements: [main.txt]` and these files.
    fn load(files: &[(&str, &[u8])]) -> Result<PythonInputs, String> {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        let path = dir.path().join("r.yaml");
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\nrequirements: [main.txt]\n", &path).unwrap();
        let target = Target::new(
            "3.11".parse().unwrap(),
            crate::platform::Platform::LinuxAmd64,
            "2.36".parse().unwrap(),
        )
        .unwrap();
        PythonInputs::load(&recipe, &path, &target).map_err(|e| e.to_string())
    }

    /// Every offered wheel (not only a chosen one) is part of both digests, by path and
    /// bytes; a recipe without `wheels:` keeps the digests its locks recorded.
    #[test]
    fn offered_wheels_make_the_lock_stale() {
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\n", Path::new("r.yaml")).unwrap();
        let none = PythonInputs::default();
        assert_eq!(none.lock_digest(&recipe), recipe.lock_digest());
        assert_eq!(none.byte_digest(&recipe), recipe.lock_digest());
        let with = |entries: &[(&str, &[u8])]| PythonInputs {
            wheels: entries
                .iter()
                .map(|(path, bytes)| (path.to_string(), Digest::of_bytes(bytes)))
                .collect(),
            ..Default::default()
        };
        let one = with(&[("w/a-1.0-py3-none-any.whl", b"a")]);
        let rebuilt = with(&[("w/a-1.0-py3-none-any.whl", b"a2")]);
        let added = with(&[
            ("w/a-1.0-py3-none-any.whl", b"a"),
            ("w/b-1.0-py3-none-any.whl", b"b"),
        ]);
        let digests = [&none, &one, &rebuilt, &added]
            .map(|i| (i.lock_digest(&recipe), i.byte_digest(&recipe)));
        for (i, a) in digests.iter().enumerate() {
            for b in &digests[i + 1..] {
                assert_ne!(a.0, b.0);
                assert_ne!(a.1, b.1);
            }
        }
    }

    #[test]
    fn includes_are_read_once_and_cycles_are_named() {
        let inputs = load(&[
            (
                "main.txt",
                b"-r a/one.txt\n-r two.txt\n-c two.txt\nsix ; sys_platform == 'win32'\n",
            ),
            ("a/one.txt", b"-r ../two.txt\nidna==3.7\n"),
            ("two.txt", b"packaging<24\n"),
        ])
        .unwrap();
        let files: Vec<&str> = inputs.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(files, ["main.txt", "a/one.txt", "two.txt"]);
        let roots: Vec<String> = inputs
            .roots
            .iter()
            .map(|r| format!("{} {}", r.origin, r.requirement))
            .collect();
        assert_eq!(roots, ["two.txt:1 packaging<24", "a/one.txt:2 idna==3.7"]);
        assert_eq!(
            inputs.constraints.versions.len(),
            1,
            "read once as constraints"
        );
        let error = load(&[
            ("main.txt", b"-r a.txt\n"),
            ("a.txt", b"six\n-r main.txt\n"),
        ])
        .unwrap_err();
        assert!(
            error.starts_with("a.txt:2: the includes form a cycle: main.txt -> a.txt -> main.txt"),
            "{error}"
        );
    }

    #[test]
    fn file_errors_name_the_file() {
        let error = load(&[
            ("main.txt", b"-c c.txt\n"),
            ("c.txt", b"requests[socks]<3\n"),
        ])
        .unwrap_err();
        assert!(
            error.starts_with("c.txt:1: the constraint `requests[socks]<3` has extras"),
            "{error}"
        );
        let error = load(&[("main.txt", b"six\n\xff\n")]).unwrap_err();
        assert!(
            error.contains("main.txt` is not UTF-8 text (invalid byte at offset 4)"),
            "{error}"
        );
        let big = vec![b'#'; MAX_INPUT_BYTES as usize + 1];
        let error = load(&[("main.txt", &big)]).unwrap_err();
        assert!(error.contains("is larger than 16777216 bytes"), "{error}");
        let error = load(&[]).unwrap_err();
        assert!(
            error.contains("main.txt`, named by the recipe (`requirements:`)"),
            "{error}"
        );
    }

    #[test]
    fn relative_paths_resolve_by_name_inside_the_recipe_directory() {
        let join = |base: &str, relative: &str| {
            join_relative(Path::new(base), Path::new(relative), "requirements:")
                .map_err(|e| e.to_string())
        };
        assert_eq!(join("reqs", "../base.txt").unwrap(), "base.txt");
        assert_eq!(join("", "./a/b.txt").unwrap(), "a/b.txt");
        assert_eq!(join("a", "b/../../c.txt").unwrap(), "c.txt");
        for (base, relative, why) in [
            ("", "../x.txt", "its `..` climbs out of it"),
            (
                "reqs",
                "../../.git-credentials",
                "its `..` climbs out of it",
            ),
            ("", "a/../../x.txt", "its `..` climbs out of it"),
            ("", "/home/ci/.netrc", "it is an absolute path"),
            ("reqs", "/etc/passwd", "it is an absolute path"),
        ] {
            let error = join(base, relative).unwrap_err();
            assert!(
                error.starts_with(&format!(
                    "`{relative}` (requirements:) is outside the recipe's directory: {why}; a recipe (one from a pull request, say) must not read"
                )),
                "{error}"
            );
            assert!(error.contains("hint: move the file into"), "{error}");
        }
    }

    /// A recipe in `dir/recipe/` whose `main.txt` is `main`; `dir/secret` holds a netrc.
    fn load_beside_secret(main: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "machine h login u password SECRET\n").unwrap();
        let recipe_dir = dir.path().join("recipe");
        std::fs::create_dir(&recipe_dir).unwrap();
        let main = main.replace("SECRET_PATH", &secret.to_string_lossy());
        std::fs::write(recipe_dir.join("main.txt"), main).unwrap();
        std::os::unix::fs::symlink(&secret, recipe_dir.join("link.txt")).unwrap();
        std::os::unix::fs::symlink(dir.path(), recipe_dir.join("up")).unwrap();
        let path = recipe_dir.join("r.yaml");
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\nrequirements: [main.txt]\n", &path).unwrap();
        let target = Target::new(
            "3.11".parse().unwrap(),
            crate::platform::Platform::LinuxAmd64,
            "2.36".parse().unwrap(),
        )
        .unwrap();
        let error = PythonInputs::load(&recipe, &path, &target)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        (dir, error)
    }

    /// `-r /home/ci/.netrc` printed the file in a parse error. Includes that
    /// leave the recipe's directory, by path or by symbolic link, are refused before reading.
    #[test]
    fn includes_cannot_read_host_files() {
        for (main, path, why) in [
            ("-r SECRET_PATH\n", "SECRET_PATH", "it is an absolute path"),
            ("-c ../secret\n", "../secret", "its `..` climbs out of it"),
            ("six\n-r link.txt\n", "link.txt", "symbolic link"),
            ("-r up/secret\n", "up/secret", "symbolic link"),
        ] {
            let (dir, error) = load_beside_secret(main);
            let path = path.replace("SECRET_PATH", &dir.path().join("secret").to_string_lossy());
            assert!(
                error.starts_with(&format!("`{path}` (included from main.txt:")),
                "{main}: {error}"
            );
            assert!(error.contains(why), "{main}: {error}");
            assert!(!error.contains("SECRET"), "{main}: {error}");
        }
    }

    /// A line that is not a requirement is named by file:line and its first word only.
    #[test]
    fn parse_errors_quote_no_more_than_the_name() {
        for (text, shown) in [
            (
                "machine h login u password SECRET",
                "`machine`... is not a valid PEP 508 requirement (at character 9)",
            ),
            ("login u password SECRET", "`login`..."),
            ("numpy==SECRET", "`numpy`..."),
            ("numpy>=1.0; SECRET_marker == 'x'", "`numpy`..."),
            ("numpy[SECRET-extra!] ", "`numpy`..."),
            (
                "numpy @ file:///SECRET path",
                "the requirement `numpy` names a URL",
            ),
            ("numpy @ ht!tp:SECRET", "`numpy`"),
            (
                "https://u:SECRET@example.org/x",
                "URL requirement must be preceded by a package name",
            ),
            (
                "pkg @ https://u:SECRET@example.org/x.whl",
                "the requirement `pkg` names a URL",
            ),
            ("six --SECRET=1", "`--SECRET` is not an option"),
        ] {
            let error = load(&[
                ("main.txt", b"-r creds.txt\n"),
                ("creds.txt", format!("\n{text}\n").as_bytes()),
            ])
            .unwrap_err();
            assert!(error.starts_with("creds.txt:2: "), "{text}: {error}");
            assert!(error.contains(shown), "{text}: {error}");
            if !shown.contains("--SECRET") {
                assert!(!error.contains("SECRET"), "{text}: {error}");
            }
        }
    }

    #[test]
    fn stack_pins_admit_by_pep_440() {
        let pin = |spec: &str| StackPin {
            name: PackageName::from_str("torch").unwrap(),
            specifiers: VersionSpecifiers::from_str(spec).unwrap(),
            why: String::new(),
        };
        let wanted = |spec: &str| VersionSpecifiers::from_str(spec).unwrap();
        assert!(pin("==2.4.1+cu121").admits(&wanted("==2.4.1")));
        assert!(pin("==2.4.1").admits(&wanted(">=2.0,<3")));
        assert!(!pin("==2.4.1").admits(&wanted("==2.5.1")));
        assert!(pin("==12.4.*").admits(&wanted(">=12.4.127")));
        assert!(!pin("==12.4.*").admits(&wanted("==12.6.77")));
    }
}
