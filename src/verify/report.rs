//! The verification report: what the probe saw, check by check (schema in docs/verify.md).
//!
//! The probe writes the report; runners add `image` and `runner`. Parsing is strict about
//! the schema name and lenient about unknown fields, so an older cudastack can still read
//! a newer probe's report.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::REPORT_PREFIX;

pub const REPORT_SCHEMA: &str = "cudastack.verify.report/v1";

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("no `{REPORT_PREFIX}` line in the output ({what}); the probe did not finish{}", tail_hint(.tail))]
    Missing { what: String, tail: String },
    #[error("the report line is not a valid report: {source}")]
    Json {
        #[source]
        source: serde_json::Error,
    },
    #[error("the report has schema `{found}`, this cudastack reads `{REPORT_SCHEMA}`")]
    Schema { found: String },
    #[error("refused: {what} holds {count} report lines; a probe prints exactly one, so something else printed the others (a forgery attempt by code in the image)\n  hint: find what prints `{prefix}` in the image; or run the probe again and record only its own output", prefix = REPORT_PREFIX.trim_end())]
    Several { what: String, count: usize },
}

impl ReportError {
    /// No report line in `output` (named `what`): its last lines, to say why.
    pub fn missing(output: &str, what: &str) -> Self {
        // The image's output: each line escaped and cut, so it cannot fill the terminal.
        let tail: Vec<String> = output
            .lines()
            .rev()
            .take(15)
            .map(crate::printable::short)
            .collect();
        ReportError::Missing {
            what: what.to_string(),
            tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        }
    }
}

fn tail_hint(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("; last output:\n{tail}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Static,
    Driver,
    Device,
    Ops,
    Train,
}

impl Level {
    pub const ALL: [Level; 5] = [
        Level::Static,
        Level::Driver,
        Level::Device,
        Level::Ops,
        Level::Train,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Static => "static",
            Level::Driver => "driver",
            Level::Device => "device",
            Level::Ops => "ops",
            Level::Train => "train",
        }
    }
    /// Levels that need a GPU.
    pub fn needs_gpu(self) -> bool {
        self != Level::Static
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Level::ALL
            .into_iter()
            .find(|l| l.as_str() == text)
            .ok_or_else(|| format!("unknown level `{text}` (static, driver, device, ops, train)"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub id: String,
    pub level: Level,
    pub status: Status,
    pub seconds: f64,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverFacts {
    pub version: String,
    /// The newest CUDA the driver supports (`cuDriverGetVersion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuFacts {
    pub index: u32,
    pub name: String,
    pub compute_capability: String,
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// `sass:sm_90`, `ptx:compute_90` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub pass: u32,
    pub fail: u32,
    pub skip: u32,
}

/// The image a report is about (added by the runner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFacts {
    pub reference: String,
    pub manifest_digest: Option<String>,
    pub config_digest: Option<String>,
}

/// How the probe was run (added by the runner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerFacts {
    /// `docker`, `kubernetes`, `native`.
    pub kind: String,
    pub cudastack_version: String,
    /// What was asked for: `none`, `all`, a count or device ids.
    pub gpus_requested: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the host vouches for: the GPUs it gave the container and whether
    /// the report's driver and GPUs are the host's. Absent: not host-witnessed (a report
    /// recorded from a log made elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witness: Option<super::witness::Witness>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub probe_version: String,
    /// RFC 3339 UTC.
    pub started: String,
    pub seconds: f64,
    pub hostname: String,
    pub levels: Vec<Level>,
    #[serde(default)]
    pub expect: serde_json::Value,
    #[serde(default)]
    pub torch: Option<String>,
    #[serde(default)]
    pub driver: Option<DriverFacts>,
    #[serde(default)]
    pub gpus: Vec<GpuFacts>,
    pub checks: Vec<CheckResult>,
    pub counts: Counts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<RunnerFacts>,
}

/// What a report proves. Only `Verified` may ever put a verified label on an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Every level ran and passed on at least one GPU.
    Verified,
    /// Nothing failed, but some levels did not run (no GPU): the reason.
    Partial { reason: String },
    /// These checks failed.
    Failed { checks: Vec<String> },
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Verified => write!(f, "verified"),
            Verdict::Partial { reason } => write!(f, "not verified on a GPU: {reason}"),
            Verdict::Failed { checks } => write!(f, "FAILED: {}", checks.join(", ")),
        }
    }
}

impl Report {
    /// The report in a probe's output or a pod log: its one line with the prefix. Two such
    /// lines are refused (the last one used to win, so an image could print its
    /// own after the probe's). A run cudastack starts itself checks its nonce instead
    /// ([`super::witness::accept`]).
    pub fn from_output(output: &str, what: &str) -> Result<Report, ReportError> {
        super::witness::single_report(output, what)
    }

    pub fn from_json(bytes: &[u8]) -> Result<Report, ReportError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|source| ReportError::Json { source })?;
        let schema = value.get("schema").and_then(|s| s.as_str()).unwrap_or("");
        if schema != REPORT_SCHEMA {
            return Err(ReportError::Schema {
                found: schema.to_string(),
            });
        }
        serde_json::from_value(value).map_err(|source| ReportError::Json { source })
    }

    /// Add a check the host ran itself (not the probe in the image), counting it.
    pub fn add_host_check(&mut self, check: CheckResult) {
        match check.status {
            Status::Pass => self.counts.pass += 1,
            Status::Fail => self.counts.fail += 1,
            Status::Skip => self.counts.skip += 1,
        }
        self.checks.push(check);
    }

    /// Canonical bytes, as stored beside the image.
    pub fn to_json(&self) -> Vec<u8> {
        crate::oci::canonical::to_canonical_json(self).expect("report serialises")
    }

    pub fn verdict(&self) -> Verdict {
        let failed: Vec<String> = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| c.id.clone())
            .collect();
        if !failed.is_empty() {
            return Verdict::Failed { checks: failed };
        }
        let missing_levels: Vec<&str> = Level::ALL
            .iter()
            .filter(|level| !self.levels.contains(level))
            .map(|level| level.as_str())
            .collect();
        if !missing_levels.is_empty() {
            return Verdict::Partial {
                reason: format!("levels not requested: {}", missing_levels.join(", ")),
            };
        }
        if let Some(skipped) = self
            .checks
            .iter()
            .find(|c| c.status == Status::Skip && c.level.needs_gpu())
        {
            return Verdict::Partial {
                reason: format!("{} skipped: {}", skipped.id, skipped.detail),
            };
        }
        for level in Level::ALL {
            if !self.checks.iter().any(|c| c.level == level) {
                return Verdict::Partial {
                    reason: format!("no {} check ran", level.as_str()),
                };
            }
        }
        if self.gpus.is_empty() || self.driver.is_none() {
            return Verdict::Partial {
                reason: "the report names no GPU or driver".to_string(),
            };
        }
        Verdict::Verified
    }

    /// A table for people: one row per check, every line at most [`RENDER_WIDTH`] columns
    /// (long details wrap inside their cell, the lines below the table wrap with an indent).
    pub fn render(&self) -> String {
        self.render_rows(&self.checks.iter().collect::<Vec<_>>())
    }

    /// [`Self::render`] for a build's log: the checks that need a GPU and were skipped (a
    /// build host without one skips every GPU level) are one line, not a row each;
    /// `cudastack verify` shows them all.
    pub fn render_compact(&self) -> String {
        let (skipped, shown): (Vec<&CheckResult>, Vec<&CheckResult>) = self
            .checks
            .iter()
            .partition(|c| c.status == Status::Skip && c.level.needs_gpu());
        let Some(first) = skipped.first() else {
            return self.render();
        };
        let mut text = self.render_rows(&shown);
        let line = format!(
            "{} checks that need a GPU skipped; {}: {} (`cudastack verify IMAGE` lists them)",
            skipped.len(),
            first.id,
            first.detail
        );
        text.push_str(&wrap_line(&line, RENDER_WIDTH));
        text
    }

    fn render_rows(&self, checks: &[&CheckResult]) -> String {
        let mut table = comfy_table::Table::new();
        table.load_style(comfy_table::presets::UTF8_BORDERS_ONLY);
        // A fixed width, not the terminal's: the report also lands in CI logs and files,
        // where a detail such as LD_LIBRARY_PATH made one 220-column line.
        table.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
        table.set_width(RENDER_WIDTH as u16);
        table.set_header(["check", "status", "time", "detail"]);
        for check in checks {
            let status = match check.status {
                Status::Pass => "pass",
                Status::Fail => "FAIL",
                Status::Skip => "skip",
            };
            table.add_row([
                check.id.clone(),
                status.to_string(),
                format!("{:.2}s", check.seconds),
                check.detail.clone(),
            ]);
        }
        let mut text = table.to_string();
        text.push('\n');
        let mut lines = Vec::new();
        if let Some(driver) = &self.driver {
            lines.push(format!(
                "driver {} (CUDA {})",
                driver.version,
                driver.cuda.as_deref().unwrap_or("?")
            ));
        }
        for gpu in &self.gpus {
            lines.push(format!(
                "GPU {}: {} (compute capability {}, {} MiB, kernels {})",
                gpu.index,
                gpu.name,
                gpu.compute_capability,
                gpu.memory_bytes >> 20,
                gpu.kernels.as_deref().unwrap_or("?")
            ));
        }
        lines.push(format!(
            "{} passed, {} failed, {} skipped in {:.1}s: {}",
            self.counts.pass,
            self.counts.fail,
            self.counts.skip,
            self.seconds,
            self.verdict()
        ));
        for line in lines {
            text.push_str(&wrap_line(&line, RENDER_WIDTH));
        }
        text
    }
}

/// The widest line [`Report::render`] draws, in columns.
pub const RENDER_WIDTH: usize = 100;

/// `line` broken at spaces into lines of at most `width` columns, each ending in a newline
/// (a word longer than a line is cut); the lines after the first are indented by two spaces.
pub fn wrap_line(line: &str, width: usize) -> String {
    const INDENT: &str = "  ";
    let mut text = String::new();
    let mut columns = 0;
    // No word on the current line yet (it holds nothing, or only the indent).
    let mut empty = true;
    for word in line.split(' ').filter(|word| !word.is_empty()) {
        let mut rest = word;
        loop {
            let length = rest.chars().count();
            let gap = usize::from(!empty);
            if columns + gap + length <= width {
                if !empty {
                    text.push(' ');
                }
                text.push_str(rest);
                columns += gap + length;
                empty = false;
                break;
            }
            if empty {
                // Wider than a whole line: cut it where the line ends.
                let room = width.saturating_sub(columns).max(1);
                let cut = rest
                    .char_indices()
                    .nth(room)
                    .map_or(rest.len(), |(at, _)| at);
                text.push_str(&rest[..cut]);
                rest = &rest[cut..];
            }
            text.push('\n');
            text.push_str(INDENT);
            columns = INDENT.len();
            empty = true;
        }
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(id: &str, level: Level, status: Status) -> CheckResult {
        CheckResult {
            id: id.into(),
            level,
            status,
            seconds: 0.1,
            detail: "d".into(),
            data: None,
        }
    }

    fn report(checks: Vec<CheckResult>, gpu: bool) -> Report {
        Report {
            schema: REPORT_SCHEMA.into(),
            probe_version: "1".into(),
            started: "2026-11-29T00:00:00Z".into(),
            seconds: 1.0,
            hostname: "h".into(),
            levels: Level::ALL.to_vec(),
            expect: serde_json::Value::Null,
            torch: Some("2.4.1+cu121".into()),
            driver: gpu.then(|| DriverFacts {
                version: "550.54.15".into(),
                cuda: Some("12.4".into()),
            }),
            gpus: if gpu {
                vec![GpuFacts {
                    index: 0,
                    name: "NVIDIA H200".into(),
                    compute_capability: "9.0".into(),
                    memory_bytes: 150 << 30,
                    uuid: None,
                    kernels: Some("sass:sm_90".into()),
                }]
            } else {
                vec![]
            },
            checks,
            counts: Counts::default(),
            image: None,
            runner: None,
        }
    }

    fn all_levels(status_for_gpu: Status) -> Vec<CheckResult> {
        Level::ALL
            .iter()
            .map(|&l| {
                let status = if l.needs_gpu() {
                    status_for_gpu
                } else {
                    Status::Pass
                };
                check(&format!("{}.x", l.as_str()), l, status)
            })
            .collect()
    }

    /// A build host without a GPU: the skipped GPU levels are one line, the static checks
    /// keep their rows, and the totals are the report's.
    #[test]
    fn a_compact_report_says_the_gpu_skips_in_one_line() {
        let mut checks = all_levels(Status::Skip);
        for check in checks.iter_mut().filter(|c| c.level.needs_gpu()) {
            check.detail = "no GPU given".to_string();
        }
        let mut skipping = report(Vec::new(), false);
        for check in checks {
            skipping.add_host_check(check);
        }
        let full = skipping.render();
        let compact = skipping.render_compact();
        assert!(compact.lines().count() < full.lines().count(), "{compact}");
        assert!(compact.contains("static.x"), "{compact}");
        assert!(
            !compact.contains("│ driver.x"),
            "no row for a GPU skip: {compact}"
        );
        let skipped = Level::ALL.iter().filter(|l| l.needs_gpu()).count();
        assert!(
            compact.contains(&format!(
                "{skipped} checks that need a GPU skipped; driver.x: no GPU given"
            )),
            "{compact}"
        );
        assert!(compact.contains(&format!("{skipped} skipped")), "{compact}");
        // Nothing skipped for want of a GPU: the full table.
        let ran = report(all_levels(Status::Pass), true);
        assert_eq!(ran.render_compact(), ran.render());
    }

    #[test]
    fn only_a_full_gpu_run_verifies() {
        assert_eq!(
            report(all_levels(Status::Pass), true).verdict(),
            Verdict::Verified
        );
        assert!(matches!(
            report(all_levels(Status::Skip), false).verdict(),
            Verdict::Partial { .. }
        ));
        // Passing checks but no GPU facts: still not verified.
        assert!(matches!(
            report(all_levels(Status::Pass), false).verdict(),
            Verdict::Partial { .. }
        ));
        let mut failing = all_levels(Status::Pass);
        failing[3].status = Status::Fail;
        assert_eq!(
            report(failing, true).verdict(),
            Verdict::Failed {
                checks: vec!["ops.x".into()]
            }
        );
        let mut static_only = report(all_levels(Status::Pass), true);
        static_only.levels = vec![Level::Static];
        assert!(matches!(static_only.verdict(), Verdict::Partial { .. }));
        let mut missing_train = report(all_levels(Status::Pass), true);
        missing_train.checks.pop();
        assert!(matches!(missing_train.verdict(), Verdict::Partial { .. }));
    }

    /// The last report line used to win, so a line an image printed after the
    /// probe's (an atexit handler a `.pth` file registered) replaced the probe's report.
    #[test]
    fn a_log_must_hold_exactly_one_report() {
        let json = String::from_utf8(report(all_levels(Status::Pass), true).to_json()).unwrap();
        let parsed =
            Report::from_output(&format!("noise\n{REPORT_PREFIX}{json}\n"), "a pod log").unwrap();
        assert_eq!(parsed.gpus[0].name, "NVIDIA H200");
        let log =
            format!("noise\n{REPORT_PREFIX}{{\"schema\":\"old\"}}\nmore\n{REPORT_PREFIX}{json}\n");
        let err = Report::from_output(&log, "a pod log")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 report lines") && err.contains("forgery"),
            "{err}"
        );
        let err = Report::from_output("Traceback\nImportError: x\n", "the container's stdout")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("did not finish") && err.contains("ImportError"),
            "{err}"
        );
        let err = Report::from_json(br#"{"schema":"cudastack.verify.report/v9"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("v9"), "{err}");
    }
}

#[cfg(test)]
mod documented_schema {
    use super::*;

    /// docs/verify.md carries a real report; it must parse, and every field it names in
    /// the schema table must exist in the type.
    #[test]
    fn the_documented_example_parses_and_names_every_field() {
        let doc = include_str!("../../docs/verify.md");
        let example = doc
            .split("```json\n")
            .nth(1)
            .and_then(|rest| rest.split("\n```").next())
            .expect("docs/verify.md has a json example");
        let report = Report::from_json(example.as_bytes()).expect("the example is a valid report");
        assert!(matches!(report.verdict(), Verdict::Partial { .. }));
        let value = serde_json::to_value(&report).unwrap();
        for field in value.as_object().unwrap().keys() {
            assert!(
                doc.contains(&format!("| `{field}` |")),
                "field `{field}` is not documented in docs/verify.md"
            );
        }
    }
}
