//! Kernel coverage: the GPU code every library of the image embeds, and for each target GPU
//! of the recipe, whether every library with device code has code that GPU can run.
//!
//! A library without code for the GPU loads fine and fails at its first kernel launch
//! ("no kernel image is available for execution on the device"), hours into a job. It
//! needs SASS the GPU runs (same major, equal or lower minor; `sm_90a` only on 9.0), or
//! PTX the driver can JIT-compile for it: a target at or below the GPU and an ISA no newer
//! than what the recipe's driver floor can read (see [`crate::version::PtxIsa`]). The code
//! of both fatbin sections counts (see [`DeviceCode::runnable`]).
//!
//! The scan reads fatbin headers only ([`crate::elf::fatbin`]) on a few threads: the ~900
//! ELF files of a torch image take well under a second. Libraries with identical code are
//! grouped ([`CoverageGroup`]): the groups are what the image's labels record and what
//! `check` and `inspect` read back, and the check against the targets runs on them, so a
//! cached audit can be checked against other targets without reading the tree again.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{AuditError, Finding, FindingKind};
use crate::elf::fatbin::{DeviceCode, FatbinError, PtxTarget};
use crate::target_gpu::TargetGpu;
use crate::version::{ComputeCapability, GpuArch, PtxIsa};

/// One library (ELF file) with device code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LibraryKernels {
    /// Path inside the image.
    pub path: PathBuf,
    pub code: DeviceCode,
}

/// Libraries whose runnable code is the same sets of SASS and PTX targets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CoverageGroup {
    pub sass: BTreeSet<GpuArch>,
    pub ptx: BTreeSet<PtxTarget>,
    /// Image paths, sorted.
    pub libraries: Vec<PathBuf>,
}

impl CoverageGroup {
    /// `sm_50 sm_60 ... sm_90`, or `-`.
    pub fn sass_text(&self) -> String {
        words(self.sass.iter().map(ToString::to_string))
    }

    /// `compute_90 (PTX ISA 8.1)`, or `-`.
    pub fn ptx_text(&self) -> String {
        words(self.ptx.iter().map(ToString::to_string))
    }

    /// How a GPU of capability `cc` runs this code: its best SASS, else PTX the driver
    /// can JIT (`jit`: the newest ISA it reads; None: any).
    pub fn reach(&self, cc: &ComputeCapability, jit: Option<PtxIsa>) -> Reach {
        if let Some(sass) = self.sass.iter().filter(|a| a.sass_runs_on(cc)).max() {
            return Reach::Sass(*sass);
        }
        let jittable = |ptx: &&PtxTarget| match (ptx.isa, jit) {
            (_, None) => true,
            (Some(isa), Some(limit)) => isa <= limit,
            (None, Some(_)) => false,
        };
        let targets: Vec<&PtxTarget> = self
            .ptx
            .iter()
            .filter(|p| p.arch.ptx_jits_for(cc))
            .collect();
        match targets.iter().copied().filter(jittable).max() {
            Some(ptx) => Reach::Ptx(*ptx),
            None => match targets.into_iter().max() {
                Some(ptx) => Reach::PtxTooNew(*ptx),
                None => Reach::None,
            },
        }
    }

    /// File names of the libraries, for short messages.
    pub fn library_names(&self) -> Vec<String> {
        self.libraries
            .iter()
            .map(|p| {
                p.file_name()
                    .unwrap_or(p.as_os_str())
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

fn words(items: impl Iterator<Item = String>) -> String {
    let list: Vec<String> = items.collect();
    if list.is_empty() {
        "-".to_string()
    } else {
        list.join(" ")
    }
}

/// How a GPU runs a group's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Native code.
    Sass(GpuArch),
    /// PTX the driver JIT-compiles at first use.
    Ptx(PtxTarget),
    /// PTX for the GPU whose ISA is newer than the driver floor can read.
    PtxTooNew(PtxTarget),
    None,
}

/// The device code of the image: each library with any, sorted by path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KernelTable {
    pub libraries: Vec<LibraryKernels>,
}

impl KernelTable {
    /// Libraries grouped by identical runnable code, sorted.
    pub fn groups(&self) -> Vec<CoverageGroup> {
        group(
            self.libraries
                .iter()
                .map(|lib| (lib.path.clone(), lib.code.runnable())),
        )
    }
}

fn group(
    libraries: impl Iterator<Item = (PathBuf, crate::elf::fatbin::SectionCode)>,
) -> Vec<CoverageGroup> {
    let mut groups: BTreeMap<(BTreeSet<GpuArch>, BTreeSet<PtxTarget>), Vec<PathBuf>> =
        BTreeMap::new();
    for (path, code) in libraries {
        if code.sass.is_empty() && code.ptx.is_empty() {
            continue;
        }
        groups.entry((code.sass, code.ptx)).or_default().push(path);
    }
    groups
        .into_iter()
        .map(|((sass, ptx), mut libraries)| {
            libraries.sort();
            CoverageGroup {
                sass,
                ptx,
                libraries,
            }
        })
        .collect()
}

/// The compute capabilities every group covers by the audit's rule: SASS it runs, or PTX
/// the driver JIT-compiles (`jit`: the newest ISA the driver floor reads), sorted. The
/// candidates are the capabilities the groups' targets name, and only they are claimed: a
/// GPU of a capability the list does not name (10.3 beside a listed 10.0) may or may not be
/// covered (`sm_100a` code does not run on 10.3), and `check` answers for it from the groups.
pub fn covered_by_all(groups: &[CoverageGroup], jit: Option<PtxIsa>) -> Vec<ComputeCapability> {
    let candidates: BTreeSet<ComputeCapability> = groups
        .iter()
        .flat_map(|g| {
            g.sass
                .iter()
                .copied()
                .chain(g.ptx.iter().map(|p| p.arch))
                .map(|a| a.cc)
        })
        .collect();
    candidates
        .into_iter()
        .filter(|cc| {
            groups
                .iter()
                .all(|g| matches!(g.reach(cc, jit), Reach::Sass(_) | Reach::Ptx(_)))
        })
        .collect()
}

/// Read the device code of every ELF file in `objects` (image paths). A malformed fatbin
/// is a finding, as a malformed ELF is.
pub(super) fn scan(
    fs: &dyn super::image::ImageFs,
    objects: &[PathBuf],
) -> Result<(KernelTable, Vec<Finding>), AuditError> {
    let results = super::facts::read_in_parallel(objects, |path| fs.device_code(path));
    let mut table = KernelTable::default();
    let mut findings = Vec::new();
    for (path, result) in results {
        let path = path.clone();
        match result {
            Ok(Some(code)) => table.libraries.push(LibraryKernels { path, code }),
            Ok(None) => {}
            Err(FatbinError::Io { path, source }) => return Err(AuditError::Io { path, source }),
            Err(error) => findings.push(Finding {
                kind: FindingKind::MalformedFatbin,
                paths: vec![path],
                evidence: error.to_string(),
                hint: "the file's GPU code is truncated or corrupt: re-fetch the artifact it came from".into(),
            }),
        }
    }
    table.libraries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((table, findings))
}

/// A finding for each group of libraries without code some target GPU can run.
pub fn missing(
    groups: &[CoverageGroup],
    targets: &[TargetGpu],
    jit: Option<PtxIsa>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for target in targets {
        for group in groups {
            let reach = group.reach(&target.cc, jit);
            if matches!(reach, Reach::Sass(_) | Reach::Ptx(_)) {
                continue;
            }
            findings.push(Finding {
                kind: FindingKind::MissingKernels,
                paths: group.libraries.clone(),
                evidence: evidence(group, target, reach, jit),
                hint: hint(target, reach),
            });
        }
    }
    findings
}

fn evidence(
    group: &CoverageGroup,
    target: &TargetGpu,
    reach: Reach,
    jit: Option<PtxIsa>,
) -> String {
    let names = group.library_names();
    let subject = match names.as_slice() {
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} and {} more with the same code", rest.len()),
        [] => "no library".to_string(),
    };
    let mut text = format!(
        "{subject} has no kernels for {}: the first launch fails with \"no kernel image is available for execution on the device\"\nSASS: {}\nPTX:  {}",
        target.label(),
        group.sass_text(),
        group.ptx_text()
    );
    if let (Reach::PtxTooNew(ptx), Some(limit)) = (reach, jit) {
        let _ = write!(
            text,
            "\n{ptx} would JIT for it, but the driver floor's JIT reads PTX ISA {limit} at most"
        );
    }
    text
}

fn hint(target: &TargetGpu, reach: Reach) -> String {
    match reach {
        Reach::PtxTooNew(ptx) => match ptx.isa.and_then(|isa| isa.cuda()) {
            Some(cuda) => format!(
                "raise `driver_floor` to a driver for CUDA {cuda} or newer so it can JIT the PTX (slow first start), use a release of the library with {} code, or remove {} from `gpus:`",
                target.cc.sm(),
                target.label()
            ),
            None => format!(
                "use a release of the library with {} code, or remove {} from `gpus:`",
                target.cc.sm(),
                target.label()
            ),
        },
        _ => format!(
            "use a release of the library built with {} code (for NVIDIA libraries, a newer wheel; for an extension, rebuild with TORCH_CUDA_ARCH_LIST including {}), or remove {} from `gpus:`",
            target.cc.sm(),
            target.cc,
            target.label()
        ),
    }
}

/// The per-library table for the terminal (`inspect`): each group's SASS and PTX, then its
/// libraries, one per line.
pub fn render_groups(groups: &[CoverageGroup]) -> String {
    let mut out = String::new();
    for group in groups {
        let _ = writeln!(out, "SASS {}  PTX {}", group.sass_text(), group.ptx_text());
        for library in &group.libraries {
            let _ = writeln!(out, "  {}", printable(library));
        }
    }
    out
}

/// A path as text for the terminal: quoted with escapes when it holds a control character
/// (a label of a pulled image is anyone's input; a newline or an escape code must not
/// print a fake line).
fn printable(path: &Path) -> String {
    let text = path.to_string_lossy();
    if text.chars().any(crate::printable::is_unsafe) {
        format!("\"{}\"", crate::printable::escape(&text))
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_in_a_label_path_are_escaped() {
        let groups = [group(&["sm_90"], &[], &["/lib/a.so\n  ok: fake\u{1b}[2J"])];
        let text = render_groups(&groups);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
    }

    fn group(sass: &[&str], ptx: &[(&str, &str)], libraries: &[&str]) -> CoverageGroup {
        CoverageGroup {
            sass: sass.iter().map(|s| s.parse().unwrap()).collect(),
            ptx: ptx
                .iter()
                .map(|(arch, isa)| PtxTarget {
                    arch: arch.parse().unwrap(),
                    isa: Some(isa.parse().unwrap()),
                })
                .collect(),
            libraries: libraries.iter().map(PathBuf::from).collect(),
        }
    }

    fn target(name: &str, cc: &str) -> TargetGpu {
        TargetGpu {
            name: name.to_string(),
            cc: cc.parse().unwrap(),
        }
    }

    #[test]
    fn sass_then_jittable_ptx_reach_a_gpu() {
        let cudnn = group(
            &["sm_50", "sm_80", "sm_86", "sm_90"],
            &[("sm_90", "8.4")],
            &["/lib/libcudnn_ops.so.9"],
        );
        let cc = |text: &str| text.parse::<ComputeCapability>().unwrap();
        assert_eq!(
            cudnn.reach(&cc("8.9"), None),
            Reach::Sass("sm_86".parse().unwrap())
        );
        let limit = |isa: &str| Some(isa.parse::<PtxIsa>().unwrap());
        assert!(matches!(
            cudnn.reach(&cc("12.0"), limit("8.4")),
            Reach::Ptx(_)
        ));
        assert!(matches!(
            cudnn.reach(&cc("12.0"), limit("8.2")),
            Reach::PtxTooNew(_)
        ));
        let no_ptx = group(&["sm_80", "sm_90a"], &[], &["/lib/libx.so"]);
        assert_eq!(no_ptx.reach(&cc("10.0"), None), Reach::None);
        assert_eq!(
            no_ptx.reach(&cc("9.0"), None),
            Reach::Sass("sm_90a".parse().unwrap())
        );
    }

    #[test]
    fn a_library_without_code_for_a_target_is_named_with_what_it_has() {
        let groups = vec![
            group(
                &["sm_50", "sm_90"],
                &[("sm_90", "8.1")],
                &[
                    "/site/nvidia/cudnn/lib/libcudnn_adv_infer.so.8",
                    "/site/nvidia/cudnn/lib/libcudnn_ops_infer.so.8",
                ],
            ),
            group(
                &["sm_90", "sm_120"],
                &[],
                &["/site/torch/lib/libtorch_cuda.so"],
            ),
        ];
        let targets = [target("RTX 5090", "12.0"), target("H100", "9.0")];
        let findings = missing(&groups, &targets, Some("8.0".parse().unwrap()));
        assert_eq!(findings.len(), 1, "{findings:?}");
        let finding = &findings[0];
        assert_eq!(finding.kind, FindingKind::MissingKernels);
        assert_eq!(finding.paths.len(), 2);
        assert!(
            finding
                .evidence
                .contains("libcudnn_adv_infer.so.8 and 1 more"),
            "{}",
            finding.evidence
        );
        assert!(
            finding.evidence.contains("RTX 5090 (sm_120)"),
            "{}",
            finding.evidence
        );
        assert!(
            finding.evidence.contains("SASS: sm_50 sm_90"),
            "{}",
            finding.evidence
        );
        assert!(
            finding.evidence.contains("PTX ISA 8.0 at most"),
            "{}",
            finding.evidence
        );
        assert!(finding.hint.contains("CUDA 12.1"), "{}", finding.hint);
        // A driver floor that JITs ISA 8.1 runs the PTX.
        assert!(missing(&groups, &targets, Some("8.1".parse().unwrap())).is_empty());
    }

    #[test]
    fn covered_by_all_is_what_every_group_runs() {
        let groups = vec![
            group(
                &["sm_50", "sm_60", "sm_80", "sm_86", "sm_90"],
                &[],
                &["/a.so"],
            ),
            group(
                &["sm_60", "sm_61", "sm_80", "sm_90a"],
                &[("sm_90", "8.1")],
                &["/b.so"],
            ),
        ];
        let sm =
            |list: Vec<ComputeCapability>| -> Vec<String> { list.iter().map(|c| c.sm()).collect() };
        let floor = Some("8.1".parse().unwrap());
        assert_eq!(
            sm(covered_by_all(&groups, floor)),
            ["sm_60", "sm_61", "sm_80", "sm_86", "sm_90"]
        );
        // torch 2.4.1's libcusparseLt: sm_80/86/89 SASS and compute_52 PTX (ISA 8.0).
        let sparse = group(
            &["sm_80", "sm_86", "sm_89"],
            &[("sm_52", "8.0")],
            &["/c.so"],
        );
        let with_sparse = [groups[0].clone(), sparse];
        assert_eq!(
            sm(covered_by_all(&with_sparse, floor)),
            ["sm_52", "sm_60", "sm_80", "sm_86", "sm_89", "sm_90"]
        );
        assert_eq!(
            sm(covered_by_all(&with_sparse, Some("7.8".parse().unwrap()))),
            ["sm_80", "sm_86", "sm_89"]
        );
        assert!(covered_by_all(&[], floor).is_empty());
    }

    #[test]
    fn libraries_with_the_same_code_form_one_group() {
        let code = |sass: &[&str]| {
            let mut code = DeviceCode::default();
            code.fatbin.sass = sass.iter().map(|s| s.parse().unwrap()).collect();
            code
        };
        let table = KernelTable {
            libraries: vec![
                LibraryKernels {
                    path: "/b.so".into(),
                    code: code(&["sm_80"]),
                },
                LibraryKernels {
                    path: "/a.so".into(),
                    code: code(&["sm_80"]),
                },
                LibraryKernels {
                    path: "/c.so".into(),
                    code: code(&["sm_90"]),
                },
            ],
        };
        let groups = table.groups();
        assert_eq!(groups.len(), 2);
        assert_eq!(
            groups[0].libraries,
            [PathBuf::from("/a.so"), PathBuf::from("/b.so")]
        );
        assert!(render_groups(&groups).contains("SASS sm_90  PTX -\n  /c.so\n"));
    }
}
