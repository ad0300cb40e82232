//! Which torch data the matrix is built from: the one compiled into this binary, or the one
//! `cudastack matrix refresh` wrote to the cache directory (`<cache>/matrix/torch-pypi.json`).
//!
//! An installed binary cannot change its embedded data, so a refresh lives in the cache
//! and every command that reads the matrix (solve, validate, lock, check, build, matrix,
//! explain) loads it through [`load`]: the refreshed file wins while it is at least as new
//! as the embedded data. A refreshed file older than the embedded data (the binary was
//! upgraded since) is not used, with a note saying so. A refreshed file that cannot be read
//! or is not a torch matrix is an error naming the file and the fix, never a silent
//! fallback: the user asked for that data, and quietly answering from other data would give
//! different answers than they expect without telling them.
//!
//! Only the torch rows (data/torch-pypi.json) can be refreshed; NVIDIA's tables and the
//! per-CUDA index builds always come from the binary.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::{Matrix, TorchPypiData, NVIDIA_DATA, TORCH_PYPI_DATA, TORCH_VARIANTS_DATA};

/// Where a refreshed torch matrix lives under a cache root.
pub fn refreshed_path(cache_root: &Path) -> PathBuf {
    crate::cache::CacheDir::new(cache_root)
        .matrix()
        .join("torch-pypi.json")
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("failed to read the refreshed matrix `{path}`\n  hint: run `cudastack matrix refresh` again, or delete `{path}` to use the matrix built into cudastack")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the refreshed matrix `{path}` is not a valid cudastack torch matrix: {message}\n  hint: run `cudastack matrix refresh` again, or delete `{path}` to use the matrix built into cudastack")]
    Invalid { path: PathBuf, message: String },
}

/// A calendar date (UTC), `YYYY-MM-DD`: when a torch matrix was generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date(jiff::civil::Date);

#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a date of the form YYYY-MM-DD")]
pub struct DateError(String);

impl Date {
    /// Today in UTC, from the system clock.
    pub fn today() -> Date {
        Date(
            jiff::Timestamp::now()
                .to_zoned(jiff::tz::TimeZone::UTC)
                .date(),
        )
    }
}

impl FromStr for Date {
    type Err = DateError;

    /// Exactly `YYYY-MM-DD` (ISO 8601 parsers also take times and signed years; a matrix
    /// date is only ever written in this one spelling).
    fn from_str(text: &str) -> Result<Date, DateError> {
        let error = || DateError(text.to_string());
        let shape_ok = text.len() == 10
            && text.bytes().enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                _ => b.is_ascii_digit(),
            });
        if !shape_ok {
            return Err(error());
        }
        text.parse::<jiff::civil::Date>()
            .map(Date)
            .map_err(|_| error())
    }
}

impl std::fmt::Display for Date {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for Date {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Date {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Date, D::Error> {
        let text = String::deserialize(deserializer)?;
        Date::from_str(&text).map_err(serde::de::Error::custom)
    }
}

/// Which torch data a loaded matrix holds (shown by `cudastack matrix` and in `--json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Origin {
    /// Compiled into this binary.
    Embedded { generated: Option<Date> },
    /// Written by `cudastack matrix refresh` into the cache.
    Refreshed {
        generated: Date,
        index: String,
        path: PathBuf,
    },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Embedded {
                generated: Some(date),
            } => write!(f, "embedded, generated {date}"),
            Origin::Embedded { generated: None } => f.write_str("embedded"),
            Origin::Refreshed {
                generated,
                index,
                path,
            } => write!(
                f,
                "refreshed {generated} from {}, {}",
                index_host(index),
                path.display()
            ),
        }
    }
}

/// `https://pypi.org/simple/` -> `pypi.org`: the short name of an index for one-line
/// headers (the full URL is in `--json`).
fn index_host(index: &str) -> String {
    url::Url::parse(index)
        .ok()
        .and_then(|url| url.host_str().map(str::to_string))
        .unwrap_or_else(|| index.to_string())
}

/// A matrix with the origin of its torch rows, and notes for stderr (an ignored file).
#[derive(Debug)]
pub struct LoadedMatrix {
    matrix: Cow<'static, Matrix>,
    pub origin: Origin,
    pub notes: Vec<String>,
}

impl LoadedMatrix {
    pub fn matrix(&self) -> &Matrix {
        &self.matrix
    }

    /// The matrix compiled into this binary, whatever the cache holds.
    pub fn embedded() -> LoadedMatrix {
        LoadedMatrix {
            matrix: Cow::Borrowed(Matrix::embedded()),
            origin: Origin::Embedded {
                generated: embedded_generated(),
            },
            notes: Vec::new(),
        }
    }
}

/// The date the embedded torch data was generated (its `generated` field).
pub fn embedded_generated() -> Option<Date> {
    static GENERATED: OnceLock<Option<Date>> = OnceLock::new();
    *GENERATED.get_or_init(|| {
        serde_json::from_str::<TorchPypiData>(TORCH_PYPI_DATA)
            .ok()
            .and_then(|data| data.generated)
    })
}

/// The matrix commands use: the refreshed torch data under `cache_root` when there is one
/// and it is not older than the embedded data, else the embedded matrix.
pub fn load(cache_root: &Path) -> Result<LoadedMatrix, SourceError> {
    let path = refreshed_path(cache_root);
    let text = match fs_err::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LoadedMatrix::embedded())
        }
        Err(source) => return Err(SourceError::Read { path, source }),
    };
    let invalid = |message: String| SourceError::Invalid {
        path: path.clone(),
        message,
    };
    let data: TorchPypiData = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let generated = data.generated.ok_or_else(|| {
        invalid("it has no `generated` date (written by an older cudastack)".into())
    })?;
    if data.releases.is_empty() {
        return Err(invalid("it holds no torch release".into()));
    }
    let mut loaded = LoadedMatrix::embedded();
    if let Some(embedded) = embedded_generated().filter(|embedded| generated < *embedded) {
        loaded.notes.push(format!(
            "note: not using the refreshed matrix `{}` (generated {generated}): the matrix built into this cudastack is newer (generated {embedded}); run `cudastack matrix refresh` to refresh it again, or delete the file",
            path.display()
        ));
        return Ok(loaded);
    }
    let matrix = Matrix::from_sources(NVIDIA_DATA, &text, TORCH_VARIANTS_DATA)
        .map_err(|e| invalid(e.to_string()))?;
    loaded.matrix = Cow::Owned(matrix);
    loaded.origin = Origin::Refreshed {
        generated,
        index: data.index,
        path,
    };
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_parse_strictly_and_order_by_time() {
        let date: Date = "2026-12-01".parse().unwrap();
        assert_eq!(date.to_string(), "2026-12-01");
        assert!("2026-11-29".parse::<Date>().unwrap() < date);
        assert!("2025-12-31".parse::<Date>().unwrap() < date);
        for bad in [
            "",
            "2026-13-01",
            "2026-02-30",
            "2025-02-29",
            "26-12-01",
            "2026-1-01",
            "2026-12-01T00:00",
            "+026-12-01",
            "2026-12-0x",
        ] {
            assert!(bad.parse::<Date>().is_err(), "{bad}");
        }
        assert!("2024-02-29".parse::<Date>().is_ok());
    }

    #[test]
    fn today_is_a_plausible_date() {
        assert!(Date::today() >= "2026-01-01".parse().unwrap());
    }

    #[test]
    fn the_embedded_data_has_a_date() {
        assert!(embedded_generated().is_some());
    }

    #[test]
    fn origins_read_as_one_line() {
        let refreshed = Origin::Refreshed {
            generated: "2026-12-01".parse().unwrap(),
            index: "https://pypi.org/simple/".into(),
            path: "/c/matrix/torch-pypi.json".into(),
        };
        assert_eq!(
            refreshed.to_string(),
            "refreshed 2026-12-01 from pypi.org, /c/matrix/torch-pypi.json"
        );
        assert_eq!(
            Origin::Embedded {
                generated: Some("2026-11-29".parse().unwrap())
            }
            .to_string(),
            "embedded, generated 2026-11-29"
        );
    }

    #[test]
    fn no_file_means_the_embedded_matrix() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load(dir.path()).unwrap();
        assert!(matches!(loaded.origin, Origin::Embedded { .. }));
        assert!(loaded.notes.is_empty());
    }

    fn write_cache(dir: &Path, text: &str) -> PathBuf {
        let path = refreshed_path(dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_corrupt_file_is_an_error_that_names_it_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "{\"releases\": [",
            "[]",
            "{\"generated_by\": \"x\", \"index\": \"i\", \"releases\": []}",
        ] {
            let path = write_cache(dir.path(), text);
            let message = load(dir.path()).unwrap_err().to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("cudastack matrix refresh"), "{message}");
            assert!(message.contains("delete"), "{message}");
        }
    }

    /// The embedded torch data with another `generated` date.
    fn dated(date: &str) -> String {
        let mut data: serde_json::Value = serde_json::from_str(TORCH_PYPI_DATA).unwrap();
        data["generated"] = date.into();
        data.to_string()
    }

    #[test]
    fn an_older_refreshed_file_is_ignored_with_a_note_and_a_newer_one_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_cache(dir.path(), &dated("2020-01-01"));
        let loaded = load(dir.path()).unwrap();
        assert!(matches!(loaded.origin, Origin::Embedded { .. }));
        assert_eq!(loaded.notes.len(), 1);
        assert!(loaded.notes[0].contains(&path.display().to_string()));
        assert!(loaded.notes[0].contains("2020-01-01"));

        write_cache(dir.path(), &dated("2099-01-01"));
        let loaded = load(dir.path()).unwrap();
        assert!(loaded.notes.is_empty());
        assert_eq!(
            loaded.origin,
            Origin::Refreshed {
                generated: "2099-01-01".parse().unwrap(),
                index: "https://pypi.org/simple/".into(),
                path,
            }
        );
    }
}
