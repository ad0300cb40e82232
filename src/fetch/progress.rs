//! Progress reporting for downloads, behind a small trait so the library stays quiet in
//! tests and the CLI can draw bars on stderr (never stdout, which carries data).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Receives transfer progress. Implementations must be cheap: `advance` is called per chunk.
pub trait Reporter: Send + Sync {
    /// A transfer begins; returns an id for the other calls.
    fn start(&self, name: &str, total: Option<u64>) -> usize;
    /// `bytes` more arrived (or were found in a partial file being resumed).
    fn advance(&self, id: usize, bytes: u64);
    /// The server ignored a resume request; the count goes back to zero.
    fn restart(&self, _id: usize) {}
    /// The transfer ended (successfully or not).
    fn finish(&self, id: usize);
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoReporter;

impl Reporter for NoReporter {
    fn start(&self, _name: &str, _total: Option<u64>) -> usize {
        0
    }
    fn advance(&self, _id: usize, _bytes: u64) {}
    fn finish(&self, _id: usize) {}
}

/// indicatif bars on stderr: one per transfer, with bytes, total, rate and ETA.
/// indicatif hides itself when stderr is not a terminal.
pub struct IndicatifReporter {
    multi: indicatif::MultiProgress,
    bars: Mutex<HashMap<usize, indicatif::ProgressBar>>,
    next: AtomicUsize,
}

impl Default for IndicatifReporter {
    fn default() -> Self {
        IndicatifReporter {
            multi: indicatif::MultiProgress::with_draw_target(
                indicatif::ProgressDrawTarget::stderr(),
            ),
            bars: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(0),
        }
    }
}

impl Reporter for IndicatifReporter {
    fn start(&self, name: &str, total: Option<u64>) -> usize {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let bar = match total {
            Some(total) => indicatif::ProgressBar::new(total).with_style(
                indicatif::ProgressStyle::with_template(
                    "{msg:30!} {bar:30} {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} {eta:>4}",
                )
                .expect("valid template"),
            ),
            None => indicatif::ProgressBar::new_spinner().with_style(
                indicatif::ProgressStyle::with_template(
                    "{msg:30!} {spinner} {bytes:>10} {binary_bytes_per_sec:>12}",
                )
                .expect("valid template"),
            ),
        };
        let bar = self.multi.add(bar.with_message(name.to_string()));
        self.bars.lock().unwrap().insert(id, bar);
        id
    }

    fn advance(&self, id: usize, bytes: u64) {
        if let Some(bar) = self.bars.lock().unwrap().get(&id) {
            bar.inc(bytes);
        }
    }

    fn restart(&self, id: usize) {
        if let Some(bar) = self.bars.lock().unwrap().get(&id) {
            bar.set_position(0);
        }
    }

    fn finish(&self, id: usize) {
        if let Some(bar) = self.bars.lock().unwrap().remove(&id) {
            bar.finish_and_clear();
        }
    }
}
