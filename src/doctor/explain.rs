//! `cudastack explain`: turn an error message into its cause, how to confirm it, and the fix.
//!
//! The knowledge is data, not code: `data/explain.yaml` (embedded at build time) holds one
//! entry per known failure with regex patterns, cause, checks, fixes, an optional decision
//! path, sources, and the real messages it must recognise (`examples`, tested). The only
//! code per entry kind is the *matrix tie-in* ([`Tie`]): numbers captured from the message
//! (`found version 12080`, `cuda>=12.4`, `sm_86`, `libcudnn.so.8`) are looked up in the
//! compatibility [`Matrix`] to say which driver is needed or which torch build fits.
//!
//! Patterns match regardless of letter case, anywhere in the text, so a message pasted with
//! log prefixes (`[rank0]:`, timestamps, progress bars) or retyped in another case is still
//! recognised. Text that matches nothing gets an honest "not recognised" and the suggestion
//! to run `cudastack doctor`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

use crate::host::driver::cuda_version_from_int;
use crate::matrix::solve::{solve, SolveQuery};
use crate::matrix::{KernelSupport, Matrix};
use crate::version::{ComputeCapability, CudaVersion, DriverVersion};

/// The embedded knowledge file.
pub const EXPLAIN_DATA: &str = include_str!("../../data/explain.yaml");

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("the knowledge file is not valid YAML for cudastack explain: {0}")]
    Yaml(String),
    #[error("entry `{id}`: pattern `{pattern}` is not a valid regex: {message}")]
    Pattern {
        id: String,
        pattern: String,
        message: String,
    },
    #[error("entry `{id}`: {problem}")]
    Entry { id: String, problem: String },
}

/// Which matrix computation an entry adds to its explanation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tie {
    /// `found version N` is the driver's CUDA ceiling; name the driver floor and a torch
    /// build that fits.
    DriverFoundVersion,
    /// Driver version and needed CUDA, when the surrounding text names them.
    DriverVsRuntime,
    /// `cuda>=X.Y` of an image: the driver it needs.
    ContainerRequirement,
    /// `sm_XY`: which torch builds carry kernels for it.
    Capability,
    /// A missing `libX.so.N`: what provides it, with versions.
    MissingLibrary,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecisionStep {
    pub when: String,
    pub then: String,
}

/// One known failure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    pub title: String,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub tie: Option<Tie>,
    pub patterns: Vec<String>,
    pub cause: String,
    pub confirm: Vec<String>,
    pub fix: Vec<String>,
    #[serde(default)]
    pub decision: Vec<DecisionStep>,
    pub sources: Vec<String>,
    pub examples: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct KnowledgeFile {
    entries: Vec<Entry>,
}

/// The parsed knowledge: entries with compiled patterns.
#[derive(Debug)]
pub struct Knowledge {
    entries: Vec<(Entry, Vec<Regex>)>,
}

/// One recognised failure in the text.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub id: String,
    pub title: String,
    /// The line of the text where the pattern matched.
    pub matched: String,
    /// Named captures of the pattern (`found`, `cuda`, `library`, ...).
    pub captures: BTreeMap<String, String>,
    pub cause: String,
    pub confirm: Vec<String>,
    pub fix: Vec<String>,
    pub decision: Vec<DecisionStep>,
    /// What the compatibility matrix adds for these numbers.
    pub matrix: Vec<String>,
    pub sources: Vec<String>,
}

/// The answer for one text.
#[derive(Debug, Clone, Serialize)]
pub struct ExplainReport {
    pub schema: &'static str,
    pub recognised: bool,
    /// Most specific first.
    pub explanations: Vec<Explanation>,
    /// What to do next when nothing (or not everything) is explained.
    pub suggestion: Option<String>,
}

pub const EXPLAIN_SCHEMA: &str = "cudastack.explain/v1";

impl Knowledge {
    /// The knowledge embedded in the binary. Its validity is a unit test, so a broken data
    /// file fails the build's tests, not a user's command.
    pub fn embedded() -> &'static Knowledge {
        static KNOWLEDGE: OnceLock<Knowledge> = OnceLock::new();
        KNOWLEDGE.get_or_init(|| {
            Knowledge::parse(EXPLAIN_DATA).expect("data/explain.yaml is checked by unit tests")
        })
    }

    pub fn parse(yaml: &str) -> Result<Knowledge, ExplainError> {
        let file: KnowledgeFile =
            serde_saphyr::from_str(yaml).map_err(|e| ExplainError::Yaml(e.to_string()))?;
        let mut entries = Vec::new();
        for entry in file.entries {
            if entry.patterns.is_empty() || entry.examples.is_empty() || entry.fix.is_empty() {
                return Err(ExplainError::Entry {
                    id: entry.id,
                    problem: "needs at least one pattern, one example and one fix".into(),
                });
            }
            if entries.iter().any(|(e, _): &(Entry, _)| e.id == entry.id) {
                return Err(ExplainError::Entry {
                    id: entry.id,
                    problem: "duplicate id".into(),
                });
            }
            if let Some(problem) = placeholder_problem(&entry) {
                return Err(ExplainError::Entry {
                    id: entry.id,
                    problem,
                });
            }
            let regexes = entry
                .patterns
                .iter()
                .map(|pattern| {
                    // Pasted messages come lower-cased, upper-cased or retyped: letter
                    // case never decides whether a failure is recognised.
                    RegexBuilder::new(pattern)
                        .case_insensitive(true)
                        .build()
                        .map_err(|e| ExplainError::Pattern {
                            id: entry.id.clone(),
                            pattern: pattern.clone(),
                            message: e.to_string(),
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            entries.push((entry, regexes));
        }
        Ok(Knowledge { entries })
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().map(|(entry, _)| entry)
    }

    /// Explain a text (one message or a whole log).
    pub fn explain(&self, text: &str, matrix: &Matrix) -> ExplainReport {
        let context = Context::read(text);
        let mut found: Vec<(i32, usize, Explanation)> = Vec::new();
        for (entry, regexes) in &self.entries {
            let Some((position, captures)) = regexes.iter().find_map(|regex| {
                let caps = regex.captures(text)?;
                let position = caps.get(0)?.start();
                let named = regex
                    .capture_names()
                    .flatten()
                    .filter_map(|name| {
                        caps.name(name)
                            .map(|m| (name.to_string(), m.as_str().trim().to_string()))
                    })
                    .filter(|(_, value)| !value.is_empty())
                    .collect::<BTreeMap<_, _>>();
                Some((position, named))
            }) else {
                continue;
            };
            let matrix_notes = entry
                .tie
                .map(|tie| tie_in(tie, &captures, &context, matrix))
                .unwrap_or_default();
            let values = with_derived(&captures);
            let fill_all = |texts: &[String]| -> Vec<String> {
                texts.iter().map(|text| fill(text, &values)).collect()
            };
            found.push((
                entry.priority,
                position,
                Explanation {
                    id: entry.id.clone(),
                    title: entry.title.clone(),
                    matched: line_at(text, position),
                    captures,
                    cause: fill(&entry.cause, &values),
                    confirm: fill_all(&entry.confirm),
                    fix: fill_all(&entry.fix),
                    decision: entry.decision.clone(),
                    matrix: matrix_notes,
                    sources: entry.sources.clone(),
                },
            ));
        }
        found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let explanations: Vec<Explanation> = found.into_iter().map(|(_, _, e)| e).collect();
        let recognised = !explanations.is_empty();
        ExplainReport {
            schema: EXPLAIN_SCHEMA,
            recognised,
            explanations,
            suggestion: (!recognised).then(|| {
                "This message is not in cudastack's knowledge. Run `cudastack doctor` to check the host layer by layer (driver, container runtime, libraries on the loader path, the Python in use).".to_string()
            }),
        }
    }
}

/// `%{name|default}` in an entry's cause, checks and fixes: the number or name the message
/// carried under that capture, else the default (so "found version 11040" is
/// answered with CUDA 11.4, not with the entry's example).
fn placeholder() -> &'static Regex {
    static PLACEHOLDER: OnceLock<Regex> = OnceLock::new();
    PLACEHOLDER.get_or_init(|| Regex::new(r"%\{([a-z_]+)(\|[^{}]*)?\}").expect("valid"))
}

/// Why an entry's placeholders cannot be filled: one without a default (a message that
/// lacks the capture would show the braces).
fn placeholder_problem(entry: &Entry) -> Option<String> {
    let texts = std::iter::once(&entry.cause)
        .chain(&entry.confirm)
        .chain(&entry.fix);
    texts
        .flat_map(|text| placeholder().captures_iter(text))
        .find(|found| found.get(2).is_none())
        .map(|found| {
            format!(
                "placeholder `{}` has no default: write it `%{{{}|...}}`",
                &found[0], &found[1]
            )
        })
}

/// The captures, and what follows from them: `found_cuda` for a cuDriverGetVersion
/// number, `cc` for an `sm_XY`.
fn with_derived(captures: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut values = captures.clone();
    if let Some(found) = captures.get("found").and_then(|f| f.parse::<i32>().ok()) {
        values.insert(
            "found_cuda".into(),
            cuda_version_from_int(found).to_string(),
        );
    }
    if let Some(cc) = captures
        .get("sm")
        .and_then(|sm| sm.parse::<ComputeCapability>().ok())
    {
        values.insert("cc".into(), cc.to_string());
    }
    values
}

/// `text` with each placeholder replaced by its value, or its default.
fn fill(text: &str, values: &BTreeMap<String, String>) -> String {
    placeholder()
        .replace_all(text, |found: &regex::Captures| {
            values.get(&found[1]).cloned().unwrap_or_else(|| {
                found
                    .get(2)
                    .map_or("", |default| &default.as_str()[1..])
                    .to_string()
            })
        })
        .into_owned()
}

/// The line containing byte `position`, trimmed and bounded.
fn line_at(text: &str, position: usize) -> String {
    let start = text[..position].rfind('\n').map_or(0, |i| i + 1);
    let end = text[position..]
        .find('\n')
        .map_or(text.len(), |i| position + i);
    let line = text[start..end].trim();
    if line.chars().count() > 400 {
        let cut: String = line.chars().take(400).collect();
        format!("{cut}...")
    } else {
        line.to_string()
    }
}

/// Versions named elsewhere in the text (an nvidia-smi header, a pip line), used by the
/// tie-ins that need both sides of a comparison.
#[derive(Debug, Default)]
struct Context {
    driver: Option<DriverVersion>,
    /// The CUDA a program needs: `torch 2.4.1+cu124`, `torch.version.cuda: 12.4`, `cu124`.
    needed_cuda: Option<CudaVersion>,
}

impl Context {
    fn read(text: &str) -> Context {
        static DRIVER: OnceLock<Regex> = OnceLock::new();
        static NEEDED: OnceLock<Regex> = OnceLock::new();
        let driver = DRIVER.get_or_init(|| {
            Regex::new(r"(?i)driver(?:[ _]version)?[:= ]+(\d{3}\.\d+(?:\.\d+)?)").expect("valid")
        });
        let needed = NEEDED.get_or_init(|| {
            Regex::new(r"(?i)(?:\+cu(\d{3,4})\b|torch\.version\.cuda\W+(\d+\.\d+)|CUDA runtime(?: version)?[:= ]+(\d+\.\d+))")
                .expect("valid")
        });
        let driver = driver
            .captures(text)
            .and_then(|c| c.get(1)?.as_str().parse().ok());
        let needed_cuda = needed.captures(text).and_then(|c| {
            if let Some(variant) = c.get(1) {
                format!("cu{}", variant.as_str()).parse().ok()
            } else {
                c.get(2).or(c.get(3))?.as_str().parse().ok()
            }
        });
        Context {
            driver,
            needed_cuda,
        }
    }
}

/// The matrix notes for an entry's tie.
fn tie_in(
    tie: Tie,
    captures: &BTreeMap<String, String>,
    context: &Context,
    matrix: &Matrix,
) -> Vec<String> {
    match tie {
        Tie::DriverFoundVersion => captures
            .get("found")
            .and_then(|found| found.parse::<i32>().ok())
            .map(|found| driver_found_version(found, context, matrix))
            .unwrap_or_default(),
        Tie::DriverVsRuntime => driver_vs_runtime(context, matrix),
        Tie::ContainerRequirement => captures
            .get("cuda")
            .and_then(|cuda| cuda.parse::<CudaVersion>().ok())
            .map(|cuda| container_requirement(cuda, matrix))
            .unwrap_or_default(),
        Tie::Capability => captures
            .get("sm")
            .and_then(|sm| sm.parse::<ComputeCapability>().ok())
            .map(|cc| capability(cc, captures.get("supported"), matrix))
            .unwrap_or_default(),
        Tie::MissingLibrary => captures
            .get("library")
            .map(|library| missing_library(library, matrix))
            .unwrap_or_default(),
    }
}

fn driver_found_version(found: i32, context: &Context, matrix: &Matrix) -> Vec<String> {
    let ceiling = cuda_version_from_int(found);
    let mut notes = vec![format!(
        "found version {found} means the driver supports CUDA <= {ceiling} (cuDriverGetVersion encodes 1000*major + 10*minor)"
    )];
    let floor = matrix.min_driver_for(&ceiling).cloned();
    let next = matrix
        .cuda_releases
        .iter()
        .filter(|row| row.version.line() > ceiling)
        .min_by(|a, b| a.version.cmp(&b.version));
    match (&floor, next) {
        (Some(floor), Some(next)) => notes.push(format!(
            "so the driver is between {floor} and {}: CUDA {} and newer need >= {}",
            next.min_driver,
            next.version.line(),
            next.min_driver
        )),
        (Some(floor), None) => notes.push(format!("so the driver is >= {floor}")),
        _ => {}
    }
    if let Some(needed) = context.needed_cuda {
        if let Some(need) = matrix.min_driver_for(&needed) {
            notes.push(format!(
                "the text names CUDA {needed}: that needs a driver >= {need}"
            ));
        }
    }
    // The torch build solve ranks first on the lowest driver consistent with this ceiling
    // (on PyPI, confirmed rows first: what a recipe locks where only PyPI is reachable).
    if let Some(driver) = floor {
        let solution = solve(
            matrix,
            &SolveQuery {
                driver: Some(driver.clone()),
                allow_minor_compat: false,
                ..Default::default()
            },
        );
        match solution.best() {
            Some(best) => notes.push(format!(
                "a torch build this driver runs natively: {} (CUDA {}, index {}; solve's first pick: on PyPI, from a confirmed row); `cudastack solve --driver {driver}` lists all",
                best.torch_build, best.cuda, best.index
            )),
            None => {
                let with_compat = solve(
                    matrix,
                    &SolveQuery {
                        driver: Some(driver.clone()),
                        allow_minor_compat: true,
                        ..Default::default()
                    },
                );
                notes.push(match with_compat.best() {
                    Some(best) => format!(
                        "no torch build in the matrix runs natively on a CUDA {ceiling} driver; with CUDA {}.x minor-version compatibility {} (CUDA {}) could, if the driver is >= {}; otherwise upgrade the driver",
                        best.cuda.major,
                        best.torch_build,
                        best.cuda,
                        matrix
                            .minor_compat_floor(best.cuda.major)
                            .map(|m| m.min_driver.to_string())
                            .unwrap_or_default()
                    ),
                    None => format!(
                        "no torch build in the matrix runs on a CUDA {ceiling} driver; upgrade the driver"
                    ),
                });
            }
        }
    }
    notes
}

fn driver_vs_runtime(context: &Context, matrix: &Matrix) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(driver) = &context.driver {
        match matrix.cuda_ceiling(driver) {
            Some(ceiling) => notes.push(format!("driver {driver} supports CUDA <= {ceiling}")),
            None => notes.push(format!(
                "driver {driver} is older than every CUDA release in the matrix"
            )),
        }
    }
    if let Some(needed) = context.needed_cuda {
        if let Some(need) = matrix.min_driver_for(&needed) {
            notes.push(format!("CUDA {needed} needs a driver >= {need}"));
            if let Some(driver) = &context.driver {
                if driver < need {
                    let minor = matrix
                        .minor_compat_floor(needed.major)
                        .filter(|m| m.min_driver <= *driver);
                    notes.push(match minor {
                        Some(m) => format!("driver {driver} is below that, but >= {} so CUDA {}.x minor-version compatibility could run the runtime API (not PTX JIT, not the container check)", m.min_driver, needed.major),
                        None => format!("driver {driver} is below that: upgrade the driver or use a build for CUDA <= {}", matrix.cuda_ceiling(driver).map(|c| c.to_string()).unwrap_or_else(|| "none".into())),
                    });
                }
            }
        }
    }
    if notes.is_empty() {
        notes.push("the message names no versions: `nvidia-smi` shows the driver's CUDA ceiling, `python -c \"import torch; print(torch.version.cuda)\"` the runtime needed; `cudastack doctor` compares them".into());
    }
    notes
}

fn container_requirement(cuda: CudaVersion, matrix: &Matrix) -> Vec<String> {
    let mut notes = Vec::new();
    match matrix.min_driver_for(&cuda) {
        Some(need) => notes.push(format!(
            "cuda>={cuda} needs a host driver >= {need} (CUDA {cuda} GA, NVIDIA release notes Table 3)"
        )),
        None => notes.push(format!("CUDA {cuda} has no driver row in the matrix")),
    }
    if let Some(minor) = matrix.minor_compat_floor(cuda.major) {
        notes.push(format!(
            "minor-version compatibility (CUDA {}.x from {}) does not help here: the container runtime compares the driver's CUDA version with {cuda} directly",
            cuda.major, minor.min_driver
        ));
    }
    notes
}

/// Notes on a compute capability: which GPUs have it, what the installed torch has, which
/// toolkits compile for it, and which torch builds carry its kernels.
fn capability(cc: ComputeCapability, supported: Option<&String>, matrix: &Matrix) -> Vec<String> {
    let mut notes = vec![gpus_note(cc, matrix)];
    notes.extend(supported.and_then(|supported| installed_archs_note(cc, supported)));
    notes.extend(toolkit_support_note(cc, matrix));
    notes.extend(torch_builds_notes(cc, matrix));
    notes
}

fn gpus_note(cc: ComputeCapability, matrix: &Matrix) -> String {
    let gpu_names: Vec<&str> = matrix
        .gpus
        .iter()
        .filter(|g| g.cc == cc)
        .map(|g| g.name.as_str())
        .collect();
    if gpu_names.is_empty() {
        format!("{} is compute capability {cc}", cc.sm())
    } else {
        format!(
            "{} is compute capability {cc} ({})",
            cc.sm(),
            gpu_names.join(", ")
        )
    }
}

/// What the installed torch's arch list (`supported`) offers for this major.
fn installed_archs_note(cc: ComputeCapability, supported: &str) -> Option<String> {
    let archs: Vec<ComputeCapability> = supported
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    if archs.is_empty() {
        return None;
    }
    let same_major: Vec<String> = archs
        .iter()
        .filter(|a| a.major == cc.major)
        .map(|a| a.sm())
        .collect();
    Some(if same_major.is_empty() {
        format!(
            "the installed torch has no sm_{}x kernels at all; cubins never cross a major version",
            cc.major
        )
    } else {
        format!(
            "the installed torch has {} but a cubin only runs on the same major with an equal or higher minor",
            same_major.join(" ")
        )
    })
}

/// The CUDA releases that compile for this capability.
fn toolkit_support_note(cc: ComputeCapability, matrix: &Matrix) -> Option<String> {
    let arch = matrix.arch_support.iter().find(|a| a.cc == cc)?;
    match (arch.first_cuda, arch.removed_in) {
        (Some(first), Some(removed)) => Some(format!(
            "CUDA toolkits compile for {} from {first} until {removed} (removed there)",
            cc.sm()
        )),
        (Some(first), None) => Some(format!(
            "CUDA toolkits compile for {} from {first}",
            cc.sm()
        )),
        (None, Some(removed)) => Some(format!(
            "CUDA {removed} and newer no longer compile for {}",
            cc.sm()
        )),
        (None, None) => None,
    }
}

/// The newest torch builds with native kernels for this capability, PyPI first.
fn torch_builds_notes(cc: ComputeCapability, matrix: &Matrix) -> Vec<String> {
    let mut notes = Vec::new();
    let fitting = |pypi_only: bool| {
        matrix
            .torch_builds
            .iter()
            .filter(|b| !pypi_only || b.pypi_default)
            .filter(|b| matches!(b.kernels_for(&cc), KernelSupport::Sass(_)))
            .max_by(|a, b| a.torch.cmp(&b.torch).then(a.cuda.cmp(&b.cuda)))
    };
    match (fitting(true), fitting(false)) {
        (Some(pypi), newest) => {
            notes.push(format!(
                "newest PyPI torch with {} kernels: {} (CUDA {}); `cudastack solve --cc {cc}` ranks all",
                cc.sm(),
                pypi.label(),
                pypi.cuda
            ));
            if let Some(index) = newest.filter(|b| b.torch > pypi.torch) {
                notes.push(format!(
                    "newer builds with {} kernels exist on PyTorch's own index: {} from download.pytorch.org/whl/{}",
                    cc.sm(),
                    index.label(),
                    index.variant
                ));
            }
        }
        (None, Some(index)) => notes.push(format!(
            "no PyPI default build has {} kernels; newest build that does: {} from download.pytorch.org/whl/{}",
            cc.sm(),
            index.label(),
            index.variant
        )),
        (None, None) => notes.push(format!(
            "no torch build in the matrix has {} kernels",
            cc.sm()
        )),
    }
    notes
}

fn missing_library(library: &str, matrix: &Matrix) -> Vec<String> {
    let mut notes = Vec::new();
    let Some((stem, version)) = library.split_once(".so") else {
        return notes;
    };
    let major: Option<u32> = version
        .trim_start_matches('.')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok());
    match (stem, major) {
        ("libcudart", Some(major)) => {
            notes.push(format!(
                "{library} is the CUDA {major} runtime (pip: nvidia-cuda-runtime-cu{major}, or a CUDA {major}.x toolkit's lib64)"
            ));
            let ga = CudaVersion::new(major, 0, Some(0));
            if let Some(need) = matrix.min_driver_for(&ga) {
                notes.push(format!("CUDA {major}.0 needs a driver >= {need}"));
            }
            if let Some(minor) = matrix.minor_compat_floor(major) {
                notes.push(format!(
                    "any CUDA {major}.x runtime runs on >= {} with minor-version compatibility",
                    minor.min_driver
                ));
            }
        }
        ("libcudnn", Some(major)) => {
            notes.push(format!("{library} is cuDNN {major}"));
            let builds: Vec<_> = matrix
                .torch_builds
                .iter()
                .filter(|b| b.cudnn.as_ref().is_some_and(|c| c.major() == major))
                .collect();
            if let (Some(oldest), Some(newest)) = (
                builds.iter().min_by(|a, b| a.torch.cmp(&b.torch)),
                builds.iter().max_by(|a, b| a.torch.cmp(&b.torch)),
            ) {
                notes.push(format!(
                    "torch builds {} .. {} pin cuDNN {major} (e.g. {} pins {})",
                    oldest.torch,
                    newest.torch,
                    newest.label(),
                    newest
                        .cudnn
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default()
                ));
            }
        }
        (sub, Some(major)) if sub.starts_with("libcudnn_") => {
            if let Some(set) = matrix.cudnn_library_set(major) {
                notes.push(format!(
                    "a complete cuDNN {major} is these {} files: {}",
                    set.libs.len(),
                    set.libs.join(", ")
                ));
                if !set.libs.iter().any(|l| l == library) {
                    notes.push(format!(
                        "{library} is not part of cuDNN {major}'s library set"
                    ));
                }
            }
            if major == 8 {
                if let Some(set9) = matrix.cudnn_library_set(9) {
                    notes.push(format!(
                        "cuDNN 9 renamed the split ({}), so installing cuDNN 9 does not provide it",
                        set9.libs.join(", ")
                    ));
                }
            }
        }
        ("libcuda", _) => notes.push(
            "libcuda.so.1 comes with the NVIDIA driver (host) or is mounted by the NVIDIA container runtime; no pip package or toolkit provides a working one (the toolkit's stubs/libcuda.so only satisfies the linker)".into(),
        ),
        _ => {}
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_knowledge_parses_and_every_example_hits_its_own_entry_first() {
        let knowledge = Knowledge::parse(EXPLAIN_DATA).unwrap();
        let matrix = Matrix::embedded();
        let mut count = 0;
        for entry in knowledge.entries() {
            for example in &entry.examples {
                let report = knowledge.explain(example, matrix);
                assert!(report.recognised, "{}: not recognised: {example}", entry.id);
                assert_eq!(
                    report.explanations[0].id, entry.id,
                    "{}: example explained first by {}: {example}",
                    entry.id, report.explanations[0].id
                );
                count += 1;
            }
        }
        assert!(count >= 40, "only {count} examples");
    }

    /// A message's numbers are in its answer: the driver's "found version" is
    /// read as the CUDA it means, the GPU's sm and the wheel's list are named; an entry's
    /// placeholder without a default is refused when the knowledge loads.
    #[test]
    fn the_answer_carries_the_messages_numbers() {
        let knowledge = Knowledge::parse(EXPLAIN_DATA).unwrap();
        let matrix = Matrix::embedded();
        let cause = |text: &str| {
            knowledge.explain(text, matrix).explanations[0]
                .cause
                .clone()
        };
        let old = cause(
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).",
        );
        assert!(old.contains("found version 11040 means CUDA 11.4"), "{old}");
        assert!(!old.contains("12080") && !old.contains("12.8"), "{old}");
        let sm = cause("NVIDIA RTX A6000 with CUDA capability sm_86 is not compatible with the current PyTorch installation.\nThe current PyTorch install supports CUDA capabilities sm_37 sm_50 sm_60 sm_70.");
        assert!(
            sm.contains("this one is sm_86 (compute capability 8.6)"),
            "{sm}"
        );
        assert!(sm.contains("the wheel has sm_37 sm_50 sm_60 sm_70"), "{sm}");
        let unlisted = cause("Tesla K80 with CUDA capability sm_37 is not compatible with the current PyTorch installation.");
        assert!(
            unlisted.contains("the wheel has other architectures"),
            "{unlisted}"
        );
        // Every example's answer is filled: no placeholder is left for a reader to see.
        for entry in knowledge.entries() {
            for example in &entry.examples {
                for explanation in knowledge.explain(example, matrix).explanations {
                    let texts = [explanation.cause.clone()]
                        .into_iter()
                        .chain(explanation.confirm.clone())
                        .chain(explanation.fix.clone());
                    for text in texts {
                        assert!(!placeholder().is_match(&text), "{}: {text}", entry.id);
                    }
                }
            }
        }
        let without_default = EXPLAIN_DATA.replacen("%{found|N}", "%{found}", 1);
        let error = Knowledge::parse(&without_default)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("placeholder `%{found}` has no default"),
            "{error}"
        );
    }

    /// The entries added from the corpus answer with the message's own numbers too: the
    /// nvJitLink release a symbol needs, the CUDA versions on both sides of an extension build,
    /// the GPU and capability vLLM or Triton refused, the architecture nvcc does not know.
    #[test]
    fn corpus_entries_answer_with_the_messages_numbers() {
        let knowledge = Knowledge::parse(EXPLAIN_DATA).unwrap();
        let matrix = Matrix::embedded();
        let first = |text: &str| knowledge.explain(text, matrix).explanations[0].clone();
        let nvjitlink = first("libcusparse.so.12: undefined symbol: __nvJitLinkComplete_12_4, version libnvJitLink.so.12");
        assert_eq!(nvjitlink.id, "nvjitlink-symbol-skew");
        assert!(
            nvjitlink.cause.contains("from CUDA 12.4 on"),
            "{}",
            nvjitlink.cause
        );
        let extension = first("The detected CUDA version (12.0) mismatches the version that was used to compile PyTorch (11.6). Please make sure to use the same CUDA versions.");
        assert!(
            extension.cause.contains("CUDA 12.0") && extension.cause.contains("11.6"),
            "{}",
            extension.cause
        );
        assert!(
            extension.fix[0].contains("cuda-toolkit=11.6"),
            "{:?}",
            extension.fix
        );
        let bf16 = first("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has compute capability 7.5.");
        assert!(
            bf16.cause.contains("Tesla T4 is compute capability 7.5"),
            "{}",
            bf16.cause
        );
        let triton = first("RuntimeError: Found NVIDIA GeForce GTX 1080 which is too old to be supported by the triton GPU compiler, which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of CUDA capability 6.1");
        assert!(
            triton
                .cause
                .contains("NVIDIA GeForce GTX 1080 is compute capability 6.1"),
            "{}",
            triton.cause
        );
        assert!(
            triton.matrix.iter().any(|n| n.contains("sm_61")),
            "{:?}",
            triton.matrix
        );
        let nvcc = first("nvcc fatal : Unsupported gpu architecture 'compute_89'");
        assert!(
            nvcc.cause.contains("compute capability 8.9"),
            "{}",
            nvcc.cause
        );
        assert!(
            nvcc.matrix.iter().any(|n| n.contains("11.8")),
            "{:?}",
            nvcc.matrix
        );
        let duplicate = first("[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 1000");
        assert!(
            duplicate.cause.contains("rank 2 and rank 0") && duplicate.cause.contains("1000"),
            "{}",
            duplicate.cause
        );
        let shared = first("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: 49152. Reducing block sizes or `num_stages` may help.");
        assert!(
            shared.cause.contains("98304") && shared.cause.contains("allows 49152"),
            "{}",
            shared.cause
        );
    }

    #[test]
    fn issue_8_messages_are_all_covered() {
        let knowledge = Knowledge::embedded();
        let ids: Vec<&str> = knowledge.entries().map(|e| e.id.as_str()).collect();
        for id in [
            "no-kernel-image",
            "driver-too-old-found-version",
            "cuda-driver-insufficient",
            "libcudart-missing",
            "libcudnn-missing",
            "cudnn8-sublibrary-missing",
            "cudnn-not-initialized",
            "cudnn-execution-failed",
            "undefined-reference-cudnn",
            "cuda-is-available-false",
            "torch-not-compiled-with-cuda",
            "no-nvidia-driver",
            "cuda-out-of-memory",
            "nvml-driver-library-mismatch",
            "container-cuda-requirement",
            "corrupt-installer-download",
            "nvcc-not-found",
            "cudnn-header-missing",
            "windows-dll-load-failed",
        ] {
            assert!(ids.contains(&id), "missing entry {id}");
        }
    }

    #[test]
    fn sources_are_public_not_project_notes() {
        // Sources reach users (`explain`, `explain --json`); project-internal notes are no
        // source, and each entry points at least once at a document users can open.
        for entry in Knowledge::embedded().entries() {
            assert!(
                entry.sources.iter().any(|s| s.contains("https://")),
                "{}: no source with a public URL",
                entry.id
            );
            for source in &entry.sources {
                for internal in [
                    "seeds/",
                    "compat-facts",
                    "shared/compat",
                    "data/",
                    "the log below",
                    "not captured",
                    "cudastack's reading",
                ] {
                    assert!(
                        !source.contains(internal),
                        "{}: source names project-internal `{internal}`: {source}",
                        entry.id
                    );
                }
            }
        }
    }

    #[test]
    fn patterns_match_whatever_the_letter_case() {
        let knowledge = Knowledge::embedded();
        let matrix = Matrix::embedded();
        for entry in knowledge.entries() {
            for example in &entry.examples {
                for text in [example.to_lowercase(), example.to_uppercase()] {
                    let report = knowledge.explain(&text, matrix);
                    assert!(
                        report.explanations.iter().any(|e| e.id == entry.id),
                        "{}: not recognised in other case: {text}",
                        entry.id
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_text_is_not_recognised() {
        let report =
            Knowledge::embedded().explain("Segmentation fault (core dumped)", Matrix::embedded());
        assert!(!report.recognised);
        assert!(report.suggestion.unwrap().contains("cudastack doctor"));
    }

    #[test]
    fn broken_knowledge_is_rejected() {
        let bad = "entries:\n  - id: x\n    title: t\n    patterns: ['(unclosed']\n    cause: c\n    confirm: []\n    fix: [f]\n    sources: []\n    examples: [e]\n";
        assert!(matches!(
            Knowledge::parse(bad),
            Err(ExplainError::Pattern { .. })
        ));
        let no_example = "entries:\n  - id: x\n    title: t\n    patterns: ['a']\n    cause: c\n    confirm: []\n    fix: [f]\n    sources: []\n    examples: []\n";
        assert!(matches!(
            Knowledge::parse(no_example),
            Err(ExplainError::Entry { .. })
        ));
    }

    #[test]
    fn context_reads_driver_and_needed_cuda() {
        let context = Context::read("| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |\ntorch 2.5.1+cu124");
        assert_eq!(context.driver.unwrap().to_string(), "535.104.05");
        assert_eq!(context.needed_cuda, Some(CudaVersion::new(12, 4, None)));
    }
}
