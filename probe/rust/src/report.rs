//! Checks and the report: the same schema (`cudastack.verify.report/v1`), line format and
//! exit codes as probe/probe.py, so cudastack's `Report::from_output` reads either probe.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use serde_json::{json, Map, Value};

pub const REPORT_SCHEMA: &str = "cudastack.verify.report/v1";
pub const REPORT_PREFIX: &str = "cudastack-report-v1 ";
pub const EXPECT_PATH: &str = "/usr/share/cudastack/expect.json";
pub const LEVELS: [&str; 5] = ["static", "driver", "device", "ops", "train"];

/// Why a check did not pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The check could not run here; the message says why.
    Skip(String),
    /// The check ran and found the stack wrong; the message says what.
    Fail(String),
}

/// What a passing check returns: its detail and optional data.
pub type Outcome = Result<(String, Option<Value>), Stop>;

pub fn fail<T>(message: impl Into<String>) -> Result<T, Stop> {
    Err(Stop::Fail(message.into()))
}

pub fn skip<T>(message: impl Into<String>) -> Result<T, Stop> {
    Err(Stop::Skip(message.into()))
}

pub fn pass(detail: impl Into<String>) -> Outcome {
    Ok((detail.into(), None))
}

pub fn pass_with(detail: impl Into<String>, data: Value) -> Outcome {
    Ok((detail.into(), Some(data)))
}

#[derive(Debug, Default)]
pub struct Checks {
    pub entries: Vec<Value>,
    /// Print the one-line summary of each check on stderr.
    pub quiet: bool,
}

/// The text of a panic payload (cudarc panics with a String when a library or symbol is missing).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else {
        "a panic without a message".to_string()
    }
}

impl Checks {
    /// Runs one check, isolated: a panic inside it (a missing CUDA library or symbol in
    /// cudarc) fails that check only. Returns its status.
    pub fn run(&mut self, id: &str, level: &str, check: impl FnOnce() -> Outcome) -> &'static str {
        let started = Instant::now();
        let (status, detail, data) = match catch_unwind(AssertUnwindSafe(check)) {
            Ok(Ok((detail, data))) => ("pass", detail, data),
            Ok(Err(Stop::Skip(reason))) => ("skip", reason, None),
            Ok(Err(Stop::Fail(reason))) => ("fail", reason, None),
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                (
                    "fail",
                    format!("panic: {message}"),
                    Some(json!({"panic": message})),
                )
            }
        };
        let seconds = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        let mut entry = Map::new();
        entry.insert("id".into(), json!(id));
        entry.insert("level".into(), json!(level));
        entry.insert("status".into(), json!(status));
        entry.insert("seconds".into(), json!(seconds));
        entry.insert("detail".into(), json!(detail));
        if let Some(data) = data {
            entry.insert("data".into(), data);
        }
        if !self.quiet {
            eprintln!("{status:<5} {id:<28} {seconds:>7.2}s  {detail}");
        }
        self.entries.push(Value::Object(entry));
        status
    }

    /// Marks checks as not run because of `reason`, pointing at the check that found it.
    pub fn skip_all(&mut self, level: &str, ids: &[&str], reason: &str) {
        let cause = self
            .entries
            .iter()
            .find(|c| c["detail"].as_str() == Some(reason))
            .and_then(|c| c["id"].as_str())
            .map(str::to_string);
        let text = match cause {
            Some(id) => format!("not run: {reason} (see {id})"),
            None => format!("not run: {reason}"),
        };
        for id in ids {
            self.run(id, level, || skip(text.clone()));
        }
    }

    pub fn count(&self, status: &str) -> usize {
        self.entries
            .iter()
            .filter(|c| c["status"].as_str() == Some(status))
            .count()
    }
}

/// Everything the report carries besides the checks.
pub struct ReportFacts {
    pub probe_version: String,
    pub started: String,
    pub seconds: f64,
    pub hostname: String,
    pub levels: Vec<String>,
    pub expect: Value,
    pub driver: Option<Value>,
    pub gpus: Vec<Value>,
}

/// The report as a JSON value; serde_json's map is sorted, like probe.py's `sort_keys`.
pub fn report(facts: ReportFacts, checks: &Checks) -> Value {
    json!({
        "schema": REPORT_SCHEMA,
        "probe_version": facts.probe_version,
        "started": facts.started,
        "seconds": facts.seconds,
        "hostname": facts.hostname,
        "levels": facts.levels,
        "expect": facts.expect,
        "torch": Value::Null,
        "driver": facts.driver.unwrap_or(Value::Null),
        "gpus": facts.gpus,
        "checks": checks.entries,
        "counts": {
            "pass": checks.count("pass"),
            "fail": checks.count("fail"),
            "skip": checks.count("skip"),
        },
    })
}

/// The environment variable that carries the run's nonce (issue 32), as probe.py reads it.
pub const NONCE_ENV: &str = "CUDASTACK_REPORT_NONCE";

/// The last stdout line: prefix, the run's nonce when the host gave one (it accepts only
/// a report carrying it: issue 32), one-line JSON.
pub fn report_line(report: &Value, nonce: Option<&str>) -> String {
    let nonce = nonce.map(|n| format!("nonce={n} ")).unwrap_or_default();
    format!(
        "{REPORT_PREFIX}{nonce}{}",
        serde_json::to_string(report).expect("a JSON value serialises")
    )
}

/// probe.py's rule: 0 when nothing failed (skips are not failures), 1 when a check failed.
/// (2, a probe error, is returned by main before any report.)
pub fn exit_code(checks: &Checks) -> i32 {
    if checks.count("fail") > 0 {
        1
    } else {
        0
    }
}

/// RFC 3339 UTC, seconds precision (`2026-11-29T22:50:36Z`).
pub fn rfc3339(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let rem = unix_seconds % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ReportFacts {
        ReportFacts {
            probe_version: "rust-test".into(),
            started: rfc3339(0),
            seconds: 0.5,
            hostname: "h".into(),
            levels: LEVELS.iter().map(|l| l.to_string()).collect(),
            expect: json!({"cuda": "12.1"}),
            driver: None,
            gpus: vec![],
        }
    }

    #[test]
    fn checks_record_status_detail_and_data() {
        let mut checks = Checks {
            quiet: true,
            ..Default::default()
        };
        assert_eq!(
            checks.run("a.pass", "static", || pass_with("ok", json!({"x": 1}))),
            "pass"
        );
        assert_eq!(checks.run("a.fail", "static", || fail("wrong")), "fail");
        assert_eq!(checks.run("a.skip", "driver", || skip("no GPU")), "skip");
        let e = &checks.entries;
        assert_eq!(e[0]["data"]["x"], 1);
        assert_eq!(e[1]["detail"], "wrong");
        assert!(e[1].get("data").is_none(), "no data key when there is none");
        assert_eq!(e[2]["level"], "driver");
        assert!(e[0]["seconds"].is_f64());
        assert_eq!(exit_code(&checks), 1);
    }

    #[test]
    fn a_panic_fails_one_check_and_the_next_still_runs() {
        std::panic::set_hook(Box::new(|_| {}));
        let mut checks = Checks {
            quiet: true,
            ..Default::default()
        };
        let status = checks.run("ops.matmul", "ops", || {
            panic!("Unable to dynamically load the \"cublas\" shared library")
        });
        let _ = std::panic::take_hook();
        assert_eq!(status, "fail");
        assert!(checks.entries[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("panic: Unable"));
        assert_eq!(checks.run("ops.conv", "ops", || pass("fine")), "pass");
    }

    #[test]
    fn skipped_checks_point_at_the_cause_and_do_not_fail() {
        let mut checks = Checks {
            quiet: true,
            ..Default::default()
        };
        checks.run("driver.version", "driver", || skip("no driver"));
        checks.skip_all("device", &["device.count", "device.kernels"], "no driver");
        assert_eq!(
            checks.entries[1]["detail"],
            "not run: no driver (see driver.version)"
        );
        assert_eq!(checks.count("skip"), 3);
        assert_eq!(exit_code(&checks), 0, "skips are not failures");
    }

    #[test]
    fn the_report_has_the_schema_fields_and_sorted_keys() {
        let mut checks = Checks {
            quiet: true,
            ..Default::default()
        };
        checks.run("static.x", "static", || pass("ok"));
        checks.run("driver.version", "driver", || skip("no driver"));
        let value = report(facts(), &checks);
        let line = report_line(&value, None);
        assert!(report_line(&value, Some("ab12")).starts_with("cudastack-report-v1 nonce=ab12 {"));
        let json = line.strip_prefix(REPORT_PREFIX).expect("prefixed");
        assert!(!json.contains('\n'), "one line");
        let parsed: Value = serde_json::from_str(json).unwrap();
        assert_eq!(parsed["schema"], REPORT_SCHEMA);
        assert_eq!(parsed["counts"], json!({"pass": 1, "fail": 0, "skip": 1}));
        assert_eq!(parsed["torch"], Value::Null);
        assert_eq!(parsed["driver"], Value::Null);
        for key in [
            "schema",
            "probe_version",
            "started",
            "seconds",
            "hostname",
            "levels",
            "expect",
            "torch",
            "driver",
            "gpus",
            "checks",
            "counts",
        ] {
            assert!(parsed.get(key).is_some(), "missing {key}");
        }
        // Sorted keys, like probe.py's json.dumps(sort_keys=True).
        assert!(json.starts_with("{\"checks\":"), "{json}");
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_497_036), "2026-12-28T22:30:36Z");
    }
}
