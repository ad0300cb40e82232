//! The recipe's Python inputs beyond `packages:`: requirements files, a
//! `pyproject.toml` with chosen extras and dependency groups, an existing lock
//! (PEP 751 `pylock.toml` or `uv.lock`), and directories of the team's own wheels.
//!
//! Only the recipe's own words are parsed here: paths (relative to the recipe's directory,
//! so the recipe and its lock mean the same on every machine) and names. The files are read
//! by `lock::python_inputs` when the recipe is locked, and their bytes are part of the lock's
//! digest, so editing one makes the lock stale. docs/recipe-python.md is the reference.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use pep508_rs::ExtraName;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::deserialize_from_str;
use crate::reference::escape;

/// A file the recipe reads, relative to the recipe's directory and inside it (`requirements.txt`,
/// `shared/constraints.txt`; `lock::python_inputs` refuses a `..` that climbs out).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InputPath(PathBuf);

impl InputPath {
    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// Where the file is for the recipe at `recipe_path`.
    pub fn resolve(&self, recipe_path: &Path) -> PathBuf {
        recipe_path
            .parent()
            .unwrap_or_else(|| Path::new(""))
            .join(&self.0)
    }

    /// The file's own name (`uv.lock`), empty for a path that ends in `..`.
    pub fn file_name(&self) -> &str {
        self.0.file_name().and_then(|n| n.to_str()).unwrap_or("")
    }
}

impl FromStr for InputPath {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().is_empty() {
            return Err("an input file path is empty; give the file relative to the recipe's directory, such as `requirements.txt`".into());
        }
        let path = Path::new(text);
        if path.is_absolute() || text.starts_with('~') {
            return Err(format!("the input file `{}` is an absolute path: the recipe and its lock must mean the same on every machine, so give it relative to the recipe's directory", escape(text)));
        }
        if path
            .components()
            .all(|c| matches!(c, Component::CurDir | Component::ParentDir))
        {
            return Err(format!(
                "the input file `{}` names a directory; give the file itself",
                escape(text)
            ));
        }
        Ok(InputPath(path.to_path_buf()))
    }
}

impl fmt::Display for InputPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Built from a `&str`, so always UTF-8.
        f.write_str(&self.0.to_string_lossy())
    }
}

impl Serialize for InputPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for InputPath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_from_str(deserializer)
    }
}

/// A directory of wheels the recipe offers before every index (`wheels: [wheelhouse]`),
/// relative to the recipe's directory and below it: `.` is the recipe's directory, and a
/// `..` is refused by name (a recipe must not list the machine's other directories; a link
/// that leads out is refused when the directory is read, `fetch::local_wheels`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WheelDir(PathBuf);

impl WheelDir {
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl FromStr for WheelDir {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let shown = escape(text);
        if text.trim().is_empty() {
            return Err("a `wheels:` directory is empty; give it relative to the recipe's directory, such as `wheelhouse` (or `.`)".into());
        }
        let path = Path::new(text);
        if path.is_absolute() || text.starts_with('~') {
            return Err(format!("the `wheels:` directory `{shown}` is an absolute path: the recipe and its lock must mean the same on every machine, so give it relative to the recipe's directory"));
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(format!("the `wheels:` directory `{shown}` climbs out with `..`: a recipe reads wheels from its own directory or one below it, so that a recipe from a pull request cannot list other directories of the machine that locks it\n  hint: move the wheels below the recipe's directory"));
        }
        if text.chars().any(char::is_control) {
            return Err(format!(
                "the `wheels:` directory `{shown}` holds a control character"
            ));
        }
        Ok(WheelDir(path.to_path_buf()))
    }
}

impl fmt::Display for WheelDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Built from a `&str`, so always UTF-8.
        f.write_str(&self.0.to_string_lossy())
    }
}

impl Serialize for WheelDir {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for WheelDir {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_from_str(deserializer)
    }
}

/// `pyproject: { path: pyproject.toml, extras: [train], groups: [test] }`: the project's
/// `[project].dependencies`, the chosen `[project.optional-dependencies]` and the chosen
/// PEP 735 `[dependency-groups]`. The project itself is not installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PyprojectInput {
    pub path: InputPath,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extras: Vec<GroupName>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupName>,
}

/// An extra or dependency-group name, normalised as PEP 685 and PEP 735 say
/// (`Train_GPU` is `train-gpu`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName(pub ExtraName);

impl FromStr for GroupName {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ExtraName::from_str(text)
            .map(GroupName)
            .map_err(|e| format!("`{}` is not an extra or group name: {e}", escape(text)))
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Serialize for GroupName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for GroupName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_from_str(deserializer)
    }
}

/// Which format an existing lock is, told by its file name as PEP 751 and uv name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonLockFormat {
    /// PEP 751: `pylock.toml` or `pylock.NAME.toml`.
    Pylock,
    /// uv's own lock, `uv.lock`.
    UvLock,
}

/// `python_lock: pylock.toml` (or `uv.lock`): every package of the lock is installed at its
/// version, and only the files whose sha256 the lock lists are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonLockInput {
    pub path: InputPath,
    pub format: PythonLockFormat,
}

impl FromStr for PythonLockInput {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let path = InputPath::from_str(text)?;
        let name = path.file_name();
        let format = if name == "uv.lock" {
            PythonLockFormat::UvLock
        } else if name == "pylock.toml"
            || name
                .strip_prefix("pylock.")
                .and_then(|rest| rest.strip_suffix(".toml"))
                .is_some_and(|middle| !middle.is_empty() && !middle.contains('.'))
        {
            PythonLockFormat::Pylock
        } else {
            return Err(format!("`python_lock: {}`: cudastack reads PEP 751 locks, named `pylock.toml` or `pylock.NAME.toml`, and `uv.lock`; the file name says which format it is", escape(text)));
        };
        Ok(PythonLockInput { path, format })
    }
}

impl fmt::Display for PythonLockInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.path, f)
    }
}

impl Serialize for PythonLockInput {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for PythonLockInput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_from_str(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::Recipe;

    const BASE: &str = "name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4.1\" }\n";

    fn parse(extra: &str) -> Result<Recipe, String> {
        Recipe::parse(&format!("{BASE}{extra}"), Path::new("r.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn inputs_parse_and_change_the_digest() {
        let plain = parse("").unwrap();
        let with = parse("requirements: [requirements.txt, reqs/dev.txt]\npyproject: { path: pyproject.toml, extras: [Train_GPU], groups: [test] }\npython_lock: uv.lock\n").unwrap();
        assert_eq!(with.requirements.len(), 2);
        let pyproject = with.pyproject.as_ref().unwrap();
        assert_eq!(pyproject.extras[0].to_string(), "train-gpu");
        assert_eq!(
            with.python_lock.as_ref().unwrap().format,
            PythonLockFormat::UvLock
        );
        assert_ne!(plain.digest(), with.digest());
        assert!(!plain.canonical_json().contains("requirements"));
        assert_eq!(
            with.requirements[1].resolve(Path::new("recipes/r.yaml")),
            PathBuf::from("recipes/reqs/dev.txt")
        );
        let pylock = parse("python_lock: locks/pylock.train.toml\n").unwrap();
        assert_eq!(pylock.python_lock.unwrap().format, PythonLockFormat::Pylock);
    }

    #[test]
    fn wheel_directories_stay_below_the_recipe() {
        let recipe = parse("wheels: [wheelhouse, ., vendor/wheels]\n").unwrap();
        let dirs: Vec<String> = recipe.wheels.iter().map(ToString::to_string).collect();
        assert_eq!(dirs, ["wheelhouse", ".", "vendor/wheels"]);
        assert_ne!(recipe.lock_digest(), parse("").unwrap().lock_digest());
        for (extra, expected) in [
            ("wheels: [../wheelhouse]\n", "climbs out with `..`"),
            ("wheels: [a/../../b]\n", "climbs out with `..`"),
            ("wheels: [/srv/wheels]\n", "is an absolute path"),
            ("wheels: [\"~/wheels\"]\n", "is an absolute path"),
            ("wheels: [\"\"]\n", "is empty"),
        ] {
            let error = parse(extra).unwrap_err();
            assert!(error.contains(expected), "{extra}: {error}");
            assert!(error.starts_with("r.yaml:7:"), "{extra}: {error}");
        }
    }

    #[test]
    fn input_errors_say_why() {
        for (extra, expected) in [
            (
                "requirements: [/etc/requirements.txt]\n",
                "is an absolute path",
            ),
            ("requirements: [\"\"]\n", "is empty"),
            ("requirements: [\"..\"]\n", "names a directory"),
            (
                "python_lock: poetry.lock\n",
                "cudastack reads PEP 751 locks",
            ),
            ("python_lock: pylock.a.b.toml\n", "`pylock.NAME.toml`"),
            (
                "pyproject: { path: pyproject.toml, extra: [x] }\n",
                "unknown field `extra`",
            ),
            (
                "pyproject: { path: pyproject.toml, extras: [\"not a name\"] }\n",
                "is not an extra or group name",
            ),
        ] {
            let error = parse(extra).unwrap_err();
            assert!(error.contains(expected), "{extra}: {error}");
            assert!(error.starts_with("r.yaml:7:"), "{extra}: {error}");
        }
    }
}
