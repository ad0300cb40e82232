//! A build that loads its image into Docker (for the verification's probe, or `--load`)
//! sends the lower layers while the upper ones are still building. Docker 20.10 takes a
//! load at about the speed of the disk, after spooling it, so a load after the build added
//! its whole time to the build's; now the build's last layers and Docker's work on the
//! first ones overlap.
//!
//! The build says which layers it will make, in order, and which are cached
//! ([`BuildProgress::layers_planned`]), then each one it has ([`BuildProgress::layer_ready`],
//! in no fixed order). Once a run of layers from the bottom is ready and holds at least
//! [`STEP_BYTES`] not yet in Docker (or is the whole image), a task loads those layers
//! as a step image ([`Engine::load_layers`]). The load after the build then finds them
//! present and sends the rest. A build whose layers are all cached loads nothing early:
//! nothing would overlap. The step images are removed when the pipeline ends, whatever
//! its outcome: the image loaded after them holds their layers.
//!
//! Loading early is an optimisation, never a reason to fail: a daemon that cannot be
//! reached or refuses a step stops the early loads, and the load after the build sends
//! what the daemon lacks. What they did is reported ([`EarlyLoadReport`]: `build --json`'s
//! `early_load`), with why they stopped when they did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use oci_spec::image::{Arch, Os};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::digest::Digest;
use crate::engine::{Engine, StepsSent};
use crate::fetch::progress::Reporter;
use crate::layer::Layer;
use crate::stack::BuildProgress;

/// The least a step loads while the build goes on: fewer, larger requests cost the daemon
/// less, and its spool of one stays small.
pub const STEP_BYTES: u64 = 512 << 20;

enum Event {
    Planned {
        names: Vec<String>,
        cached: Vec<bool>,
    },
    Ready {
        name: String,
        layer: Layer,
    },
    /// The build is over: no more layers come.
    BuildOver,
}

/// What the early loads sent into Docker while the build went on: `build --json`'s
/// `early_load`. The load after the build ([`crate::engine::LoadReport`]) found these
/// layers present and sent the rest.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct EarlyLoadReport {
    /// Step images loaded (one request each).
    pub steps: usize,
    /// Layers they sent in full, from the image's bottom.
    pub layers: usize,
    /// Bytes of docker-archive streamed to the daemon.
    pub bytes: u64,
    /// Seconds the steps took, beside the build.
    pub seconds: f64,
    /// Why the early loads stopped before the build ended, when they did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl EarlyLoadReport {
    fn add(&mut self, sent: StepsSent, seconds: f64) {
        self.steps += sent.requests;
        self.layers += sent.layers;
        self.bytes += sent.bytes;
        self.seconds += seconds;
    }

    /// The status line: what went early, or why nothing did.
    pub fn summary(&self) -> String {
        let sent = format!(
            "{} layers ({:.1} MiB) loaded into Docker while building, in {} steps, {:.1}s",
            self.layers,
            self.bytes as f64 / (1 << 20) as f64,
            self.steps,
            self.seconds
        );
        match &self.stopped {
            Some(why) => format!("{sent}; then stopped: {why}"),
            None => sent,
        }
    }
}

/// The early loads of one build: started before it, fed through [`Self::progress`].
pub struct EarlyLoads {
    sender: mpsc::UnboundedSender<Event>,
    task: Option<JoinHandle<()>>,
    /// The step images loaded so far, for [`Self::remove_steps`] (kept outside the task,
    /// which may be aborted).
    steps: Arc<Mutex<Vec<Digest>>>,
    /// What was sent so far (kept outside the task too).
    report: Arc<Mutex<EarlyLoadReport>>,
}

impl EarlyLoads {
    /// Start the task that loads ready layers as an image of `architecture`/`os`. Must be
    /// called within the tokio runtime.
    pub fn start(architecture: Arch, os: Os) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let steps = Arc::new(Mutex::new(Vec::new()));
        let report = Arc::new(Mutex::new(EarlyLoadReport::default()));
        let task = tokio::spawn(load_ready_layers(
            receiver,
            (architecture, os),
            steps.clone(),
            report.clone(),
        ));
        EarlyLoads {
            sender,
            task: Some(task),
            steps,
            report,
        }
    }

    /// What the early loads sent so far.
    pub fn report(&self) -> EarlyLoadReport {
        self.report.lock().expect("no panic holds it").clone()
    }

    /// `inner`, plus the plan and every ready layer handed to the load task.
    pub fn progress<'a>(&self, inner: &'a dyn BuildProgress) -> impl BuildProgress + 'a {
        WithEarlyLoads {
            inner,
            sender: self.sender.clone(),
        }
    }

    /// The build is over: wait for the step in flight, so that the load after the build
    /// finds its layers instead of sending them again beside it.
    pub async fn finish(&mut self) {
        let _ = self.sender.send(Event::BuildOver);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Stop loading and remove the step images from the daemon (again: nothing).
    pub async fn remove_steps(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        let steps = std::mem::take(&mut *self.steps.lock().expect("no panic holds it"));
        if steps.is_empty() {
            return;
        }
        let Ok(engine) = Engine::connect().await else {
            return;
        };
        for step in steps {
            if let Err(error) = engine.remove_image(&step.to_string()).await {
                tracing::warn!("the build's early load left {step} in the daemon: {error}");
            }
        }
    }
}

/// The build's progress, also telling the load task.
struct WithEarlyLoads<'a> {
    inner: &'a dyn BuildProgress,
    sender: mpsc::UnboundedSender<Event>,
}

impl BuildProgress for WithEarlyLoads<'_> {
    fn stage(&self, stage: &str, detail: &str) {
        self.inner.stage(stage, detail);
    }

    fn downloads(&self) -> Arc<dyn Reporter> {
        self.inner.downloads()
    }

    fn layers_planned(&self, names: &[&str], cached: &[bool]) {
        self.inner.layers_planned(names, cached);
        // A closed channel means the early loads stopped: the load after the build does it all.
        let _ = self.sender.send(Event::Planned {
            names: names.iter().map(|name| name.to_string()).collect(),
            cached: cached.to_vec(),
        });
    }

    fn layer_ready(&self, name: &str, layer: &Layer) {
        self.inner.layer_ready(name, layer);
        let _ = self.sender.send(Event::Ready {
            name: name.to_string(),
            layer: layer.clone(),
        });
    }
}

/// The layers of the plan that are ready, from the bottom up to the first that is not.
fn ready_from_bottom(names: &[String], ready: &HashMap<String, Layer>) -> Vec<Layer> {
    names
        .iter()
        .map_while(|name| ready.get(name).cloned())
        .collect()
}

/// Whether `bottom` (ready from the bottom, `loaded` of them in the daemon) makes a step
/// now: enough new bytes, or every layer of the plan (`planned` of them).
fn makes_a_step(bottom: &[Layer], loaded: usize, planned: usize) -> bool {
    let new_bytes: u64 = bottom.iter().skip(loaded).map(|layer| layer.size).sum();
    bottom.len() > loaded && (new_bytes >= STEP_BYTES || bottom.len() == planned)
}

/// What the load task knows of the build: its plan, the layers ready, how many of the plan
/// are in Docker.
#[derive(Default)]
struct Progress {
    plan: Option<Vec<String>>,
    ready: HashMap<String, Layer>,
    loaded: usize,
}

impl Progress {
    /// Take in one event; false when the early loads should stop (nothing is built, a
    /// second platform, the build is over).
    fn take(&mut self, event: Event) -> bool {
        match event {
            Event::Planned { names, cached } if self.plan.is_none() => {
                self.plan = Some(names);
                !cached.iter().all(|cached| *cached)
            }
            Event::Planned { .. } | Event::BuildOver => false,
            Event::Ready { name, layer } => {
                self.ready.insert(name, layer);
                true
            }
        }
    }
}

async fn load_ready_layers(
    mut receiver: mpsc::UnboundedReceiver<Event>,
    (architecture, os): (Arch, Os),
    steps: Arc<Mutex<Vec<Digest>>>,
    report: Arc<Mutex<EarlyLoadReport>>,
) {
    let stopped = |why: String| report.lock().expect("no panic holds it").stopped = Some(why);
    let nonce = crate::engine::load::load_nonce();
    let mut engine = None;
    let mut progress = Progress::default();
    while let Some(event) = receiver.recv().await {
        if !progress.take(event) {
            return;
        }
        // What came while the last step loaded: one step for all of it.
        while let Ok(event) = receiver.try_recv() {
            if !progress.take(event) {
                return;
            }
        }
        let Some(names) = &progress.plan else {
            continue;
        };
        let bottom = ready_from_bottom(names, &progress.ready);
        if !makes_a_step(&bottom, progress.loaded, names.len()) {
            continue;
        }
        if engine.is_none() {
            match Engine::connect().await {
                Ok(connected) => engine = Some(connected),
                Err(error) => return stopped(error.to_string()),
            }
        }
        let engine = engine.as_ref().expect("connected above");
        let platform = (&architecture, &os);
        let origin = "the build's lower layers";
        let started = Instant::now();
        match engine
            .load_layers(&bottom, platform, &nonce, origin, &steps)
            .await
        {
            Ok(sent) => report
                .lock()
                .expect("no panic holds it")
                .add(sent, started.elapsed().as_secs_f64()),
            Err(error) => {
                tracing::warn!(
                    "loading the lower layers early failed; they go with the image: {error}"
                );
                return stopped(error.to_string());
            }
        }
        progress.loaded = bottom.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, mib: u64) -> (String, Layer) {
        let layer = Layer {
            digest: Digest::of_bytes(name.as_bytes()),
            diff_id: Digest::of_bytes(name.as_bytes()),
            size: mib << 20,
            uncompressed_size: None,
            media_type: oci_spec::image::MediaType::ImageLayerGzip,
            blob: std::path::PathBuf::new(),
        };
        (name.to_string(), layer)
    }

    #[test]
    fn the_report_adds_up_the_steps_and_says_why_they_stopped() {
        let mut report = EarlyLoadReport::default();
        let sent = |requests, layers, mib: u64| StepsSent {
            requests,
            layers,
            bytes: mib << 20,
        };
        report.add(sent(2, 5, 3), 1.5);
        report.add(sent(1, 1, 1), 0.5);
        assert_eq!((report.steps, report.layers, report.bytes), (3, 6, 4 << 20));
        assert_eq!(
            report.summary(),
            "6 layers (4.0 MiB) loaded into Docker while building, in 3 steps, 2.0s"
        );
        report.stopped = Some("the daemon refused".into());
        assert!(report
            .summary()
            .ends_with("; then stopped: the daemon refused"));
    }

    #[test]
    fn a_step_waits_for_the_layers_below_and_for_enough_bytes() {
        let names: Vec<String> = ["base", "cuda", "torch", "config"].map(String::from).into();
        let mut ready = HashMap::new();
        // The torch layer first: nothing below it is ready, so nothing loads.
        ready.extend([layer("torch", 700)]);
        assert!(ready_from_bottom(&names, &ready).is_empty());
        // The base alone is too small to be worth a request of its own.
        ready.extend([layer("base", 40)]);
        let bottom = ready_from_bottom(&names, &ready);
        assert_eq!(bottom.len(), 1);
        assert!(!makes_a_step(&bottom, 0, names.len()));
        // With cuda, the run from the bottom reaches torch: three layers, one step.
        ready.extend([layer("cuda", 600)]);
        let bottom = ready_from_bottom(&names, &ready);
        assert_eq!(bottom.len(), 3);
        assert!(makes_a_step(&bottom, 0, names.len()));
        // After that step, the small config layer is a step because it is the last.
        ready.extend([layer("config", 1)]);
        let bottom = ready_from_bottom(&names, &ready);
        assert!(makes_a_step(&bottom, 3, names.len()));
        assert!(!makes_a_step(&bottom, 4, names.len()));
    }
}
