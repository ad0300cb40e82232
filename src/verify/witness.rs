//! The host's testimony: a verification is what the host saw, not what the image
//! says about itself.
//!
//! The probe runs inside the image, and the image is built from inputs a pull request can
//! change: its packages can run code in the probe's process (a `.pth` file, a `torch` that
//! prints whatever it likes). So a report is accepted only under three rules:
//!
//! 1. **One report, from this run's probe.** The host makes a fresh [`Nonce`] per run and
//!    hands it to the probe (the [`NONCE_ENV`] variable, which the probe removes from its
//!    environment before it imports anything of the image's). The probe's report line
//!    carries it (`cudastack-report-v1 nonce=HEX {…}`); [`accept`] takes exactly one such
//!    line and refuses the output when it holds a second one, or any report line without
//!    the nonce: something in the image printed it, a forgery attempt.
//! 2. **No GPU results without a GPU.** A container the host gave no GPU cannot have run a
//!    driver, device, ops or train check: a report claiming one is refused ([`testify`]).
//! 3. **The GPUs are the host's.** When the host can read its own driver and GPUs (the
//!    daemon is local), the report's driver version and every GPU it names (model and
//!    compute capability) must be the host's; a mismatch is refused with Expected/Found.
//!
//! What this cannot do: code of the image that runs inside the probe's process after the
//! probe imported it (torch) can read the nonce from the process's memory or
//! /proc/self/environ and suppress or rewrite the probe's report. Rules 2 and 3 bound
//! what such a report can claim to what the host really gave the container; they cannot
//! prove the check results themselves (docs/verify.md, "What a verification can and
//! cannot prove"). The probe runs `/usr/bin/python3 -I -S` so nothing of the image runs before it
//! ([`super::probe_command`]).
//!
//! What this module must not do: run anything, or read the host (the runner reads it and
//! passes a [`HostView`]).

use serde::{Deserialize, Serialize};

use super::report::{Report, ReportError, Status};
use super::REPORT_PREFIX;
use crate::engine::run::GpuRequest;
use crate::version::{ComputeCapability, DriverVersion};

/// The environment variable that carries the run's nonce into the container.
pub const NONCE_ENV: &str = "CUDASTACK_REPORT_NONCE";
/// Before the nonce on a report line: `cudastack-report-v1 nonce=HEX {json}`.
pub const NONCE_TAG: &str = "nonce=";

#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("refused: {what} holds {count} report line(s) that do not carry this run's nonce, so the probe cudastack started did not print them: a forgery attempt by code in the image (a `.pth` file, a package the probe imports), or a probe older than this cudastack\n  first such line: {first}\n  hint: find what prints `{prefix}` in the image (`grep -r {prefix} /usr/local/lib/python3*/dist-packages`); an image built by an older cudastack, whose probe prints no nonce, needs a rebuild (only its config layer changes)", prefix = REPORT_PREFIX.trim_end())]
    Forged {
        what: String,
        count: usize,
        first: String,
    },
    #[error("refused: {what} holds {count} report lines carrying this run's nonce; the probe prints exactly one, so code in the image read the nonce and printed another: a forgery attempt\n  hint: find the package that prints `{prefix}` in the image", prefix = REPORT_PREFIX.trim_end())]
    Several { what: String, count: usize },
    #[error("refused: the container was given no GPU, yet the report claims GPU-level results ({claims}): only the host can say which GPUs a container had, so this report is forged\n  hint: verify on a host with a GPU (`--gpus all`); a report without one proves the static level only")]
    GpuWithoutGpu { claims: String },
    #[error("refused: the report's driver is not the host's{note}\n  Expected: {expected}\n  Found:    {found}")]
    Driver {
        expected: String,
        found: String,
        note: &'static str,
    },
    #[error("refused: the report names a GPU the host does not have (or more of them than the host gave the container)\n  Expected: {expected}\n  Found:    {found}")]
    Gpu { expected: String, found: String },
}

/// A run's nonce: 128 random bits, in hex. The image is built before the run, so it cannot
/// know it in advance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nonce(String);

impl Nonce {
    pub fn generate() -> Result<Self, String> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|error| format!("no randomness for the nonce: {error}"))?;
        Ok(Self(hex::encode(bytes)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A report line split into its nonce (if it has one) and its JSON.
fn split_report_line(line: &str) -> Option<(Option<&str>, &str)> {
    let rest = line.trim_end().strip_prefix(REPORT_PREFIX)?;
    Some(match rest.strip_prefix(NONCE_TAG) {
        Some(tagged) => {
            let (nonce, json) = tagged.split_once(' ').unwrap_or((tagged, ""));
            (Some(nonce), json)
        }
        None => (None, rest),
    })
}

/// The one report in `output` (named `what` in messages) that carries `nonce` (rule 1).
pub fn accept(output: &str, nonce: &Nonce, what: &str) -> Result<Report, WitnessError> {
    let mut ours = Vec::new();
    let mut foreign = Vec::new();
    for line in output.lines() {
        match split_report_line(line) {
            Some((Some(found), json)) if found == nonce.as_str() => ours.push(json),
            Some(_) => foreign.push(line),
            None => {}
        }
    }
    if let Some(first) = foreign.first() {
        return Err(WitnessError::Forged {
            what: what.to_string(),
            count: foreign.len(),
            first: shorten(first),
        });
    }
    match ours.as_slice() {
        [json] => Ok(probe_part(Report::from_json(json.as_bytes())?)),
        [] => Err(ReportError::missing(output, what).into()),
        several => Err(WitnessError::Several {
            what: what.to_string(),
            count: several.len(),
        }),
    }
}

/// The one report of a log made elsewhere (`verify --from-log`, a test's own run): no nonce
/// to check, so a log with two report lines is refused ("the last line wins"
/// let an image's line replace the probe's). A nonce on the line, if any, is dropped.
pub fn single_report(output: &str, what: &str) -> Result<Report, ReportError> {
    let lines: Vec<&str> = output
        .lines()
        .filter_map(split_report_line)
        .map(|(_, json)| json)
        .collect();
    match lines.as_slice() {
        [json] => Report::from_json(json.as_bytes()).map(probe_part),
        [] => Err(ReportError::missing(output, what)),
        several => Err(ReportError::Several {
            what: what.to_string(),
            count: several.len(),
        }),
    }
}

/// What a report line may say: the probe's part. `image` and `runner` are the runner's to
/// add, so a line that carries them (a forged `witness`) has them dropped.
fn probe_part(mut report: Report) -> Report {
    report.image = None;
    report.runner = None;
    report
}

fn shorten(line: &str) -> String {
    const MAX: usize = 160;
    match line.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

/// One GPU as the host reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGpu {
    pub name: String,
    /// `None` where neither the host's source (/proc names no compute capability) nor the
    /// matrix (by the GPU's name) says: no report can claim such a GPU.
    pub compute_capability: Option<ComputeCapability>,
}

impl HostGpu {
    /// A GPU as the host reads it. Where its source gives no compute capability, the
    /// matrix's for its name is taken: a report's own value is never what the host vouches
    /// for (an A10 run would otherwise be recorded, and signed, as the sm_90 it claimed).
    pub fn read(name: &str, compute_capability: Option<ComputeCapability>) -> Self {
        HostGpu {
            name: name.to_string(),
            compute_capability: compute_capability.or_else(|| {
                crate::matrix::Matrix::embedded()
                    .gpu(name)
                    .map(|known| known.cc)
            }),
        }
    }
}

/// What the host knows of its own driver and GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostView {
    /// Read on this host, where the daemon runs (a local socket).
    Local {
        driver: Option<DriverVersion>,
        gpus: Vec<HostGpu>,
    },
    /// The host cannot read the machine the containers run on (a remote daemon): why.
    Unknown { reason: String },
}

/// What the host vouches for, stored in the report's `runner.witness`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Witness {
    /// The GPUs the host gave the container: `none`, `all`, a count or ids.
    pub gpus_given: String,
    /// Whether the report's driver and GPUs were compared with the host's own reading.
    pub host_compared: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_driver: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_gpus: Vec<String>,
    /// Why the host's reading was not compared, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Witness {
    /// One line for people.
    pub fn summary(&self) -> String {
        match (&self.note, self.gpus_given.as_str()) {
            (_, "none") => "host-witnessed: the container was given no GPU".to_string(),
            (Some(note), given) => {
                format!("host-witnessed: GPUs given: {given}; not compared with the host's: {note}")
            }
            (None, given) => format!(
                "host-witnessed: GPUs given: {given}; the report's driver and GPUs are the host's ({})",
                self.host_driver.as_deref().unwrap_or("no driver")
            ),
        }
    }
}

/// Rules 2 and 3: refuse a report that claims more than the host gave the container; the
/// testimony to store with it otherwise.
pub fn testify(
    report: &Report,
    given: &GpuRequest,
    host: &HostView,
) -> Result<Witness, WitnessError> {
    let gpus_given = super::runner::describe(given);
    if *given == GpuRequest::None {
        refuse_gpu_claims(report)?;
        return Ok(Witness {
            gpus_given,
            host_compared: false,
            host_driver: None,
            host_gpus: Vec::new(),
            note: None,
        });
    }
    let (driver, gpus) = match host {
        HostView::Unknown { reason } => {
            return Ok(Witness {
                gpus_given,
                host_compared: false,
                host_driver: None,
                host_gpus: Vec::new(),
                note: Some(reason.clone()),
            })
        }
        HostView::Local { driver, gpus } => (driver, gpus),
    };
    compare_driver(report, driver.as_ref())?;
    compare_gpus(report, given, gpus)?;
    Ok(Witness {
        gpus_given,
        host_compared: true,
        host_driver: driver.as_ref().map(ToString::to_string),
        host_gpus: gpus.iter().map(describe_host_gpu).collect(),
        note: None,
    })
}

/// Rule 2: with no GPU given, every GPU-level check must be a skip, and no GPU or driver named.
fn refuse_gpu_claims(report: &Report) -> Result<(), WitnessError> {
    let mut claims: Vec<String> = report
        .checks
        .iter()
        .filter(|c| c.level.needs_gpu() && c.status != Status::Skip)
        .map(|c| {
            format!(
                "{} {}",
                c.id,
                if c.status == Status::Pass {
                    "passed"
                } else {
                    "failed"
                }
            )
        })
        .collect();
    if let Some(driver) = &report.driver {
        claims.push(format!("driver {}", driver.version));
    }
    claims.extend(report.gpus.iter().map(|g| format!("GPU {}", g.name)));
    if claims.is_empty() {
        return Ok(());
    }
    Err(WitnessError::GpuWithoutGpu {
        claims: claims.join(", "),
    })
}

fn compare_driver(report: &Report, host: Option<&DriverVersion>) -> Result<(), WitnessError> {
    let Some(found) = &report.driver else {
        return Ok(());
    };
    let matches =
        host.is_some_and(|host| found.version.parse::<DriverVersion>().ok().as_ref() == Some(host));
    if matches {
        return Ok(());
    }
    Err(WitnessError::Driver {
        expected: host.map_or(
            "no NVIDIA driver (the host reads none)".to_string(),
            ToString::to_string,
        ),
        found: found.version.clone(),
        note: if host.is_none() {
            ": the host has none"
        } else {
            ""
        },
    })
}

/// Rule 3 for GPUs: each GPU of the report takes one of the host's of the same model and
/// compute capability, and no more than the container was given.
fn compare_gpus(report: &Report, given: &GpuRequest, host: &[HostGpu]) -> Result<(), WitnessError> {
    let limit = match given {
        GpuRequest::Count(n) => *n as usize,
        GpuRequest::DeviceIds(ids) => ids.len(),
        _ => host.len(),
    };
    let expected = || {
        let names: Vec<String> = host.iter().map(describe_host_gpu).collect();
        let names = if names.is_empty() {
            "no GPU (the host reads none)".to_string()
        } else {
            names.join(", ")
        };
        format!("at most {limit} of: {names}")
    };
    let found = || {
        report
            .gpus
            .iter()
            .map(|g| format!("{} (compute capability {})", g.name, g.compute_capability))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if report.gpus.len() > limit {
        return Err(WitnessError::Gpu {
            expected: expected(),
            found: found(),
        });
    }
    let mut pool: Vec<&HostGpu> = host.iter().collect();
    for gpu in &report.gpus {
        let cc = gpu.compute_capability.parse::<ComputeCapability>().ok();
        let Some(at) = pool.iter().position(|h| same_gpu(h, &gpu.name, cc)) else {
            return Err(WitnessError::Gpu {
                expected: expected(),
                found: found(),
            });
        };
        pool.remove(at);
    }
    Ok(())
}

fn same_gpu(host: &HostGpu, name: &str, cc: Option<ComputeCapability>) -> bool {
    let normal = |text: &str| {
        text.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    };
    normal(&host.name) == normal(name)
        && host.compute_capability.is_some()
        && cc == host.compute_capability
}

fn describe_host_gpu(gpu: &HostGpu) -> String {
    match gpu.compute_capability {
        Some(cc) => format!(
            "{} (compute capability {}.{})",
            gpu.name, cc.major, cc.minor
        ),
        None => gpu.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::report::{CheckResult, Counts, DriverFacts, GpuFacts, Level, REPORT_SCHEMA};

    /// A report as the probe prints it: every level, `gpus` the GPUs it names (each on
    /// driver 550.54.15), every GPU check passing, or skipped when it names none.
    fn report(gpus: &[(&str, &str)]) -> Report {
        let checks = Level::ALL
            .iter()
            .map(|&level| CheckResult {
                id: format!("{}.x", level.as_str()),
                level,
                status: if level.needs_gpu() && gpus.is_empty() {
                    Status::Skip
                } else {
                    Status::Pass
                },
                seconds: 0.1,
                detail: "d".into(),
                data: None,
            })
            .collect();
        Report {
            schema: REPORT_SCHEMA.into(),
            probe_version: "1".into(),
            started: "2026-11-29T00:00:00Z".into(),
            seconds: 1.0,
            hostname: "h".into(),
            levels: Level::ALL.to_vec(),
            expect: serde_json::Value::Null,
            torch: None,
            driver: (!gpus.is_empty()).then(|| DriverFacts {
                version: "550.54.15".into(),
                cuda: Some("12.4".into()),
            }),
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(index, (name, cc))| GpuFacts {
                    index: index as u32,
                    name: name.to_string(),
                    compute_capability: cc.to_string(),
                    memory_bytes: 80 << 30,
                    uuid: None,
                    kernels: None,
                })
                .collect(),
            checks,
            counts: Counts::default(),
            image: None,
            runner: None,
        }
    }

    fn line(report: &Report, nonce: Option<&Nonce>) -> String {
        let json = String::from_utf8(report.to_json()).unwrap();
        match nonce {
            Some(nonce) => format!("{REPORT_PREFIX}{NONCE_TAG}{} {json}", nonce.as_str()),
            None => format!("{REPORT_PREFIX}{json}"),
        }
    }

    fn host(driver: &str, gpus: &[(&str, Option<(u32, u32)>)]) -> HostView {
        HostView::Local {
            driver: Some(driver.parse().unwrap()),
            gpus: gpus
                .iter()
                .map(|(name, cc)| {
                    HostGpu::read(
                        name,
                        cc.map(|(major, minor)| ComputeCapability::new(major, minor)),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn nonces_are_fresh_hex() {
        let (a, b) = (Nonce::generate().unwrap(), Nonce::generate().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn exactly_one_report_with_this_runs_nonce_is_accepted() {
        let nonce = Nonce::generate().unwrap();
        let honest = report(&[]);
        let output = format!("some output\n{}\n", line(&honest, Some(&nonce)));
        assert_eq!(accept(&output, &nonce, "stdout").unwrap(), honest);
        // A runner's fields on the line are not the probe's to give: dropped.
        let mut claims = honest.clone();
        claims.runner = Some(crate::verify::report::RunnerFacts {
            kind: "docker".into(),
            cudastack_version: "0".into(),
            gpus_requested: "all".into(),
            engine: None,
            note: None,
            witness: None,
        });
        let accepted = accept(&line(&claims, Some(&nonce)), &nonce, "stdout").unwrap();
        assert_eq!(accepted.runner, None);
    }

    /// As reported: a `.pth` file's report line, before or after the probe's.
    #[test]
    fn a_report_line_without_the_nonce_is_a_forgery() {
        let nonce = Nonce::generate().unwrap();
        let forged = line(&report(&[("NVIDIA H100 80GB HBM3", "9.0")]), None);
        let honest = line(&report(&[]), Some(&nonce));
        for output in [
            format!("{forged}\n{honest}\n"),
            format!("{honest}\n{forged}\n"),
            forged.clone(),
        ] {
            let error = accept(&output, &nonce, "the container's stdout")
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("forgery attempt") && error.contains("1 report line(s)"),
                "{error}"
            );
            assert!(
                error.contains("first such line: cudastack-report-v1 {"),
                "names the line: {error}"
            );
        }
        // Another run's nonce is no better than none.
        let stale = line(&report(&[]), Some(&Nonce::generate().unwrap()));
        assert!(matches!(
            accept(&format!("{honest}\n{stale}"), &nonce, "x"),
            Err(WitnessError::Forged { count: 1, .. })
        ));
    }

    #[test]
    fn a_second_report_with_the_nonce_is_refused() {
        let nonce = Nonce::generate().unwrap();
        let honest = line(&report(&[]), Some(&nonce));
        let stolen = line(&report(&[("NVIDIA H100 80GB HBM3", "9.0")]), Some(&nonce));
        let error = accept(&format!("{honest}\n{stolen}\n"), &nonce, "stdout").unwrap_err();
        assert!(
            matches!(error, WitnessError::Several { count: 2, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("forgery attempt"));
        // None at all: the probe did not finish, with its last output.
        let error = accept("Traceback\nImportError: torch\n", &nonce, "stdout").unwrap_err();
        assert!(error.to_string().contains("ImportError"), "{error}");
    }

    #[test]
    fn a_container_given_no_gpu_can_claim_no_gpu_result() {
        let unknown = HostView::Unknown { reason: "r".into() };
        let witness = testify(&report(&[]), &GpuRequest::None, &unknown).unwrap();
        assert_eq!(witness.gpus_given, "none");
        let forged = report(&[("NVIDIA H100 80GB HBM3", "9.0")]);
        let error = testify(&forged, &GpuRequest::None, &unknown)
            .unwrap_err()
            .to_string();
        assert!(error.contains("given no GPU"), "{error}");
        assert!(
            error.contains("train.x passed") && error.contains("driver 550.54.15"),
            "{error}"
        );
        // Even one failed GPU check, with no GPU named, is a claim the probe cannot make.
        let mut failed = report(&[]);
        failed.checks[1].status = Status::Fail;
        assert!(testify(&failed, &GpuRequest::None, &unknown).is_err());
    }

    #[test]
    fn the_report_names_the_hosts_driver_and_gpus_or_is_refused() {
        let h100 = ("NVIDIA H100 80GB HBM3", Some((9, 0)));
        let on_h100 = report(&[("NVIDIA H100 80GB HBM3", "9.0")]);
        let witness = testify(&on_h100, &GpuRequest::All, &host("550.54.15", &[h100])).unwrap();
        assert!(witness.host_compared);
        assert_eq!(witness.host_driver.as_deref(), Some("550.54.15"));
        // Numerically equal driver versions match; /proc names no compute capability, the
        // matrix gives the H100's.
        testify(
            &on_h100,
            &GpuRequest::All,
            &host("550.054.15", &[("nvidia  h100 80GB HBM3", None)]),
        )
        .unwrap();
        // Read from /proc, an A10 is still an 8.6: a report calling it a 9.0 is refused.
        let a10_as_sm90 = report(&[("NVIDIA A10", "9.0")]);
        let error = testify(
            &a10_as_sm90,
            &GpuRequest::All,
            &host("550.54.15", &[("NVIDIA A10", None)]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("NVIDIA A10 (compute capability 8.6)"),
            "{error}"
        );
        // A GPU neither the host nor the matrix knows the compute capability of: no report
        // can claim it.
        let unknown = report(&[("NVIDIA Z9000", "9.0")]);
        assert!(testify(
            &unknown,
            &GpuRequest::All,
            &host("550.54.15", &[("NVIDIA Z9000", None)])
        )
        .is_err());

        let error = testify(&on_h100, &GpuRequest::All, &host("535.104.05", &[h100]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("Expected: 535.104.05") && error.contains("Found:    550.54.15"),
            "{error}"
        );
        let no_driver = HostView::Local {
            driver: None,
            gpus: vec![],
        };
        let error = testify(&on_h100, &GpuRequest::All, &no_driver)
            .unwrap_err()
            .to_string();
        assert!(error.contains("the host has none"), "{error}");

        // An A10 host, a report of an H100: refused, Expected and Found.
        let a10 = ("NVIDIA A10", Some((8, 6)));
        let error = testify(&on_h100, &GpuRequest::All, &host("550.54.15", &[a10]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("Expected: at most 1 of: NVIDIA A10 (compute capability 8.6)"),
            "{error}"
        );
        assert!(
            error.contains("Found:    NVIDIA H100 80GB HBM3 (compute capability 9.0)"),
            "{error}"
        );
        // Same model, another compute capability.
        let error = testify(
            &on_h100,
            &GpuRequest::All,
            &host("550.54.15", &[("NVIDIA H100 80GB HBM3", Some((8, 0)))]),
        );
        assert!(error.is_err());
        // More GPUs than the host has, or than it gave the container.
        let two = report(&[
            ("NVIDIA H100 80GB HBM3", "9.0"),
            ("NVIDIA H100 80GB HBM3", "9.0"),
        ]);
        assert!(testify(&two, &GpuRequest::All, &host("550.54.15", &[h100])).is_err());
        assert!(testify(
            &two,
            &GpuRequest::Count(1),
            &host("550.54.15", &[h100, h100])
        )
        .is_err());
        testify(&two, &GpuRequest::All, &host("550.54.15", &[h100, h100])).unwrap();
    }

    #[test]
    fn a_host_that_cannot_read_its_gpus_says_so() {
        let on_h100 = report(&[("NVIDIA H100 80GB HBM3", "9.0")]);
        let view = HostView::Unknown {
            reason: "the Docker daemon at tcp://gpu:2376 is not on this host".into(),
        };
        let witness = testify(&on_h100, &GpuRequest::All, &view).unwrap();
        assert!(!witness.host_compared);
        assert!(
            witness.summary().contains("not compared"),
            "{}",
            witness.summary()
        );
    }
}
