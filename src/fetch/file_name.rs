//! [`FileName`]: one path component that came from outside (a lock, an index page, a wheel,
//! a manifest) and is about to become part of a path on this machine.
//!
//! A lock's `"filename": "../../x"` or `"/tmp/x"` was joined onto the wheels
//! directory and the target replaced by a symlink, as root. Every such name is now parsed
//! once into this type, which cannot hold a separator, `.`/`..`, a NUL or control character,
//! or be empty or longer than a file name may be; `dir.join(name)` is then always a direct
//! child of `dir`. Serde goes through the same check, so a bad lock is refused when it is
//! read, naming the field.

use std::fmt;
use std::ops::Deref;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest file name Linux file systems accept (`NAME_MAX`).
pub const MAX_FILE_NAME_BYTES: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{}` is not a plain file name: {reason}", name.escape_debug())]
pub struct FileNameError {
    /// The refused text (shown escaped: it may hold control characters).
    pub name: String,
    pub reason: &'static str,
}

/// A validated single path component: no `/` or `\`, not `.` or `..`, not empty, no NUL
/// or control characters, at most [`MAX_FILE_NAME_BYTES`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FileName(String);

impl FileName {
    /// Check `name` and wrap it.
    pub fn new(name: impl Into<String>) -> Result<Self, FileNameError> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("it is empty")
        } else if name == "." || name == ".." {
            Some("`.` and `..` name directories, not files")
        } else if name.contains('/') {
            Some("it contains `/`")
        } else if name.contains('\\') {
            Some("it contains `\\`")
        } else if name.chars().any(char::is_control) {
            Some("it contains a NUL or control character")
        } else if name.len() > MAX_FILE_NAME_BYTES {
            Some("it is longer than 255 bytes")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(FileNameError { name, reason }),
            None => Ok(FileName(name)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a relative path of exactly one normal component.
    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }
}

impl Deref for FileName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for FileName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<Path> for FileName {
    fn as_ref(&self) -> &Path {
        self.as_path()
    }
}

impl fmt::Display for FileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for FileName {
    type Err = FileNameError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        FileName::new(name)
    }
}

impl TryFrom<String> for FileName {
    type Error = FileNameError;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        FileName::new(name)
    }
}

impl From<FileName> for String {
    fn from(name: FileName) -> String {
        name.0
    }
}

impl PartialEq<str> for FileName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for FileName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Component;

    #[test]
    fn refuses_every_way_out_of_a_directory() {
        for bad in [
            "",
            ".",
            "..",
            "/tmp/x",
            "../../x",
            "a/b",
            "a\\b",
            "x\0y",
            "x\ny",
            &"a".repeat(256),
        ] {
            let error = FileName::new(bad).unwrap_err();
            assert!(
                error.to_string().contains("not a plain file name"),
                "{error}"
            );
        }
    }

    #[test]
    fn keeps_real_names() {
        for good in [
            "torch-2.4.1+cu124-cp311-cp311-linux_x86_64.whl",
            "cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz",
            "..whl",
            ".hidden",
        ] {
            assert_eq!(FileName::new(good).unwrap(), good);
        }
    }

    #[test]
    fn serde_checks_too() {
        let error = serde_json::from_str::<FileName>(r#""../../etc/passwd""#).unwrap_err();
        assert!(
            error.to_string().contains("not a plain file name"),
            "{error}"
        );
        let name: FileName = serde_json::from_str(r#""a.whl""#).unwrap();
        assert_eq!(serde_json::to_string(&name).unwrap(), r#""a.whl""#);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Whatever is accepted joins onto a directory as exactly one normal component.
        #[test]
        fn accepted_names_stay_in_their_directory(name in "\\PC{0,40}|[./\\\\a]{0,6}") {
            if let Ok(name) = FileName::new(name) {
                let joined = Path::new("/cache/wheels").join(&name);
                proptest::prop_assert_eq!(joined.parent(), Some(Path::new("/cache/wheels")));
                let components: Vec<Component> = name.as_path().components().collect();
                proptest::prop_assert!(matches!(components.as_slice(), [Component::Normal(_)]));
            }
        }
    }
}
