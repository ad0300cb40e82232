//! Running a command in a container: create, start, wait (with a timeout), collect the
//! output and exit code, copy a result file out, and always remove the container.
//!
//! The verify stage runs its probe through [`Engine::run`]. A non-zero exit is a normal
//! [`RunOutcome`], not an error (bollard reports it as an error value: CRATES.md pitfall
//! 3). GPUs are requested with `HostConfig.DeviceRequests` (driver `nvidia`,
//! capabilities `[["gpu"]]`) and/or the `nvidia` runtime; a daemon without the NVIDIA
//! Container Toolkit refuses them (500 at start, 400 at create), which becomes
//! [`EngineError::GpuUnavailable`] with what to install.
//!
//! Every container is labelled `io.cudastack.run=<pid>` and removed on every path: after
//! a normal exit, on timeout (killed first), on any error, on SIGINT, SIGTERM or SIGHUP
//! (a CI runner cancels a job with SIGTERM), and (best effort, by a spawned
//! task) when the caller drops the future. The run then returns
//! [`EngineError::Interrupted`] and the caller exits. Listening for a signal replaces the
//! process's default action for the rest of its life (a tokio property), so a watcher
//! restores it: a signal that arrives while no run is in flight exits the process with
//! 128 + the signal's number, as the default action would have ended it.
//!
//! Nothing can clean up after SIGKILL (or a power cut), so each container also carries
//! who started it and until when ([`RunOwner`], `io.cudastack.run.owner` and
//! `io.cudastack.run.deadline`), and [`Engine::reap_orphans`] (called by every verify)
//! removes the containers whose run is provably dead: the same boot and PID namespace
//! with that pid gone or reused (its start time differs), or any run past its deadline
//! (the run would have killed the container by then). A live run, a run in another
//! PID namespace or on another host before its deadline, or a container an older
//! cudastack started without these labels is never touched.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig};
use bollard::query_parameters::{
    DownloadFromContainerOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

use super::{message_of, status_of, Engine, EngineError};

/// The label every container started by cudastack carries; its value is the pid.
pub const RUN_LABEL: &str = "io.cudastack.run";
/// Who started the container: [`RunOwner`] as text (boot, PID namespace, pid, start time).
pub const OWNER_LABEL: &str = "io.cudastack.run.owner";
/// Unix time (seconds) after which the run that started the container would have killed
/// it: a container still there later is an orphan, wherever its run was.
pub const DEADLINE_LABEL: &str = "io.cudastack.run.deadline";
/// Added to a run's timeout for its deadline: the wait, log and copy-out after the kill,
/// and clock skew between the host of the run and the daemon's.
const DEADLINE_GRACE: Duration = Duration::from_secs(600);

/// The process that started a container, precisely enough to tell whether it still runs:
/// a pid alone is not (pids are reused, and another PID namespace or host has its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOwner {
    /// `/proc/sys/kernel/random/boot_id`: this boot of this kernel.
    pub boot_id: String,
    /// The PID namespace (`/proc/self/ns/pid`, e.g. `pid:[4026531836]`): pids mean
    /// something only inside it (a CI job in a container has its own).
    pub pid_namespace: String,
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat`: start time in clock ticks since boot, which differs
    /// when the pid has been reused.
    pub start_ticks: u64,
}

/// Whether a container's run still exists, as far as this process can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    Dead,
    /// Another boot, PID namespace or host, or /proc would not say: left alone.
    Unknown,
}

impl RunOwner {
    /// This process, or `None` where /proc does not tell (not Linux).
    pub fn current() -> Option<Self> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pid_namespace = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let pid = std::process::id();
        Some(Self {
            boot_id: boot_id.trim().to_string(),
            pid_namespace: pid_namespace.to_string_lossy().into_owned(),
            pid,
            start_ticks: start_ticks(pid).ok()??,
        })
    }

    /// The label value: `BOOT_ID/PID_NAMESPACE/PID/START_TICKS`.
    pub fn to_label(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.boot_id, self.pid_namespace, self.pid, self.start_ticks
        )
    }

    /// Parse a label value; `None` for anything else (never trusted to mean "dead").
    pub fn parse(label: &str) -> Option<Self> {
        let mut parts = label.rsplitn(3, '/');
        let start_ticks = parts.next()?.parse().ok()?;
        let pid = parts.next()?.parse().ok()?;
        let (boot_id, pid_namespace) = parts.next()?.split_once('/')?;
        if boot_id.is_empty() || pid_namespace.is_empty() || pid_namespace.contains('/') {
            return None;
        }
        Some(Self {
            boot_id: boot_id.to_string(),
            pid_namespace: pid_namespace.to_string(),
            pid,
            start_ticks,
        })
    }

    /// Whether this owner still runs, seen from `observer` (this process).
    pub fn liveness(&self, observer: &RunOwner) -> Liveness {
        if self.boot_id != observer.boot_id || self.pid_namespace != observer.pid_namespace {
            return Liveness::Unknown;
        }
        match start_ticks(self.pid) {
            Ok(None) => Liveness::Dead,
            Ok(Some(ticks)) if ticks != self.start_ticks => Liveness::Dead,
            Ok(Some(_)) => Liveness::Alive,
            Err(_) => Liveness::Unknown,
        }
    }
}

/// The start time of `pid` (`Ok(None)`: no such process, or a zombie: it has exited and
/// only waits for its parent to collect the status).
fn start_ticks(pid: u32) -> std::io::Result<Option<u64>> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so count the
    // fields after the last `)`; starttime is field 22, the 20th after comm.
    let after = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| std::io::Error::other(format!("unexpected /proc/{pid}/stat")))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return Ok(None);
    }
    fields
        .get(19)
        .and_then(|field| field.parse().ok())
        .map(Some)
        .ok_or_else(|| std::io::Error::other(format!("no start time in /proc/{pid}/stat")))
}

/// A container [`Engine::reap_orphans`] removed, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reaped {
    pub id: String,
    pub image: String,
    pub reason: String,
}

/// Why the container with these labels is an orphan, or `None` to leave it.
fn orphan_reason(
    labels: &HashMap<String, String>,
    observer: Option<&RunOwner>,
    now: u64,
) -> Option<String> {
    if let (Some(owner), Some(observer)) = (
        labels.get(OWNER_LABEL).and_then(|l| RunOwner::parse(l)),
        observer,
    ) {
        match owner.liveness(observer) {
            Liveness::Alive => return None,
            Liveness::Dead => {
                return Some(format!(
                    "the cudastack run that started it (pid {}) is gone",
                    owner.pid
                ))
            }
            Liveness::Unknown => {}
        }
    }
    let deadline: u64 = labels.get(DEADLINE_LABEL)?.parse().ok()?;
    (now > deadline).then(|| {
        format!(
            "it outlived its run's deadline by {} s",
            now.saturating_sub(deadline)
        )
    })
}

/// Which GPUs the container gets.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub enum GpuRequest {
    /// No GPU request.
    #[default]
    None,
    /// Every GPU (`--gpus all`, count -1).
    All,
    /// This many GPUs.
    Count(u32),
    /// These GPUs, by index or UUID.
    DeviceIds(Vec<String>),
}

impl GpuRequest {
    fn device_request(&self) -> Option<DeviceRequest> {
        let (count, device_ids) = match self {
            GpuRequest::None => return None,
            GpuRequest::All => (Some(-1), None),
            GpuRequest::Count(n) => (Some(i64::from(*n)), None),
            GpuRequest::DeviceIds(ids) => (None, Some(ids.clone())),
        };
        Some(DeviceRequest {
            driver: Some("nvidia".to_string()),
            count,
            device_ids,
            capabilities: Some(vec![vec!["gpu".to_string()]]),
            options: None,
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Image reference or ID (`sha256:...`) the daemon has.
    pub image: String,
    /// The command (arguments to the entrypoint, if the image or `entrypoint` sets one).
    pub cmd: Vec<String>,
    /// Replace the image's entrypoint (`Some(vec![])` clears it).
    pub entrypoint: Option<Vec<String>>,
    pub env: Vec<(String, String)>,
    pub gpus: GpuRequest,
    /// Use the `nvidia` runtime. Also chosen automatically when `gpus` is not `None`
    /// and the daemon has that runtime registered.
    pub use_nvidia_runtime: bool,
    /// The container is killed and removed when it runs longer.
    pub timeout: Duration,
    /// A file (container path) to copy out after the command exits.
    pub copy_out: Option<String>,
    /// Bind mounts: host path, container path, read-only.
    pub binds: Vec<(PathBuf, String, bool)>,
    /// Extra labels (the run label is always added).
    pub labels: Vec<(String, String)>,
}

impl RunSpec {
    /// Run `cmd` in `image`: no GPU, a 10 minute timeout, nothing copied out.
    pub fn new(image: impl Into<String>, cmd: Vec<String>) -> Self {
        Self {
            image: image.into(),
            cmd,
            entrypoint: None,
            env: Vec::new(),
            gpus: GpuRequest::None,
            use_nvidia_runtime: false,
            timeout: Duration::from_secs(600),
            copy_out: None,
            binds: Vec::new(),
            labels: Vec::new(),
        }
    }
}

/// What happened in the container.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunOutcome {
    /// The command's exit status (137 after a timeout kill).
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
    /// The content of `copy_out`, when asked for and the command was not timed out.
    pub copied: Option<Vec<u8>>,
    /// True when the timeout killed the container.
    pub timed_out: bool,
    /// Wall time from create to removal.
    pub seconds: f64,
}

impl RunOutcome {
    pub fn success(&self) -> bool {
        self.exit_code == 0 && !self.timed_out
    }
}

/// Removes the container if the run future is dropped before it did so itself.
struct ContainerGuard {
    docker: Docker,
    id: Option<String>,
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if let (Some(id), Ok(handle)) = (self.id.take(), tokio::runtime::Handle::try_current()) {
            let docker = self.docker.clone();
            handle.spawn(async move {
                let _ = remove_container(&docker, &id).await;
            });
        }
    }
}

impl Engine {
    /// Run `spec` to completion (or its timeout) and remove the container.
    pub async fn run(&self, spec: &RunSpec) -> Result<RunOutcome, EngineError> {
        let started = Instant::now();
        let nvidia_runtime = spec.use_nvidia_runtime
            || (spec.gpus != GpuRequest::None && self.info().await?.nvidia_runtime);
        let mut labels: HashMap<String, String> = spec.labels.iter().cloned().collect();
        labels.insert(RUN_LABEL.to_string(), std::process::id().to_string());
        if let Some(owner) = RunOwner::current() {
            labels.insert(OWNER_LABEL.to_string(), owner.to_label());
        }
        let deadline = unix_now() + (spec.timeout + DEADLINE_GRACE).as_secs();
        labels.insert(DEADLINE_LABEL.to_string(), deadline.to_string());
        let host_config = HostConfig {
            binds: (!spec.binds.is_empty()).then(|| {
                spec.binds
                    .iter()
                    .map(|(host, container, read_only)| {
                        let mode = if *read_only { ":ro" } else { "" };
                        format!("{}:{container}{mode}", host.display())
                    })
                    .collect()
            }),
            device_requests: spec.gpus.device_request().map(|r| vec![r]),
            runtime: nvidia_runtime.then(|| "nvidia".to_string()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.cmd.clone()),
            entrypoint: spec.entrypoint.clone(),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            tty: Some(false),
            attach_stdout: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        };
        // Listen before the container exists, so no signal falls between create and select.
        let mut signals = Signals::listen();
        let _active = ActiveRun::enter();
        let created = self
            .docker
            .create_container(None, body)
            .await
            .map_err(|source| self.classify(spec, "create", source))?;
        let id = created.id;
        let mut guard = ContainerGuard {
            docker: self.docker.clone(),
            id: Some(id.clone()),
        };
        let result = tokio::select! {
            result = self.drive(&id, spec) => result,
            signal = signals.recv() => Err(EngineError::Interrupted { signal }),
        };
        let removed = remove_container(&self.docker, &id).await;
        guard.id = None;
        let mut outcome = result?;
        removed.map_err(|source| EngineError::Container {
            image: spec.image.clone(),
            what: format!("removing container {id}"),
            source,
        })?;
        outcome.seconds = started.elapsed().as_secs_f64();
        Ok(outcome)
    }

    /// Start, wait (or kill at the timeout), collect logs, copy the result out.
    async fn drive(&self, id: &str, spec: &RunSpec) -> Result<RunOutcome, EngineError> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(|source| self.classify(spec, "start", source))?;
        // The wait request lasts as long as the command: give it its own client timeout.
        let waiter = self.with_timeout(spec.timeout + Duration::from_secs(60));
        let container_error = |what: &str| {
            let what = what.to_string();
            let image = spec.image.clone();
            move |source| EngineError::Container {
                image,
                what,
                source,
            }
        };
        let (exit_code, timed_out) =
            match tokio::time::timeout(spec.timeout, wait_exit(&waiter, id)).await {
                Ok(code) => (code.map_err(container_error("waiting"))?, false),
                Err(_) => {
                    let options = KillContainerOptions {
                        signal: "SIGKILL".to_string(),
                    };
                    match self.docker.kill_container(id, Some(options)).await {
                        // 409: it exited between the timeout and the kill.
                        Ok(()) => {}
                        Err(error) if status_of(&error) == Some(409) => {}
                        Err(source) => return Err(container_error("killing")(source)),
                    }
                    let code = wait_exit(&self.docker, id)
                        .await
                        .map_err(container_error("waiting after kill"))?;
                    (code, true)
                }
            };

        let mut stdout = LogTail::default();
        let mut stderr = LogTail::default();
        let options = LogsOptions {
            stdout: true,
            stderr: true,
            follow: false,
            tail: "all".to_string(),
            ..Default::default()
        };
        let mut logs = self.docker.logs(id, Some(options));
        while let Some(item) = logs.next().await {
            match item.map_err(container_error("reading logs"))? {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    stdout.push(&message)
                }
                LogOutput::StdErr { message } => stderr.push(&message),
                LogOutput::StdIn { .. } => {}
            }
        }

        let copied = match (&spec.copy_out, timed_out) {
            (Some(path), false) => Some(self.copy_out(id, path).await?),
            _ => None,
        };
        Ok(RunOutcome {
            exit_code,
            stdout: stdout.into_text(),
            stderr: stderr.into_text(),
            copied,
            timed_out,
            seconds: 0.0,
        })
    }

    /// The content of the file `path` in container `id` (from the tar the API returns).
    /// Buffered: meant for result files (a JSON report), not for images.
    async fn copy_out(&self, id: &str, path: &str) -> Result<Vec<u8>, EngineError> {
        let failed = |problem: String| EngineError::CopyOut {
            path: path.to_string(),
            problem,
        };
        let options = DownloadFromContainerOptions {
            path: path.to_string(),
        };
        let mut archive = Vec::new();
        let mut stream = self.docker.download_from_container(id, Some(options));
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => archive.extend_from_slice(&bytes),
                Err(error) if status_of(&error) == Some(404) => {
                    return Err(failed("no such file in the container".to_string()))
                }
                Err(error) => return Err(failed(message_of(&error))),
            }
        }
        let mut tar = tar::Archive::new(archive.as_slice());
        let entries = tar.entries().map_err(|e| failed(e.to_string()))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| failed(e.to_string()))?;
            let kind = entry.header().entry_type();
            if kind.is_file() {
                let mut content = Vec::new();
                entry
                    .read_to_end(&mut content)
                    .map_err(|e| failed(e.to_string()))?;
                return Ok(content);
            }
            if kind.is_dir() {
                return Err(failed("it is a directory, not a file".to_string()));
            }
            if kind.is_symlink() {
                return Err(failed("it is a symbolic link, not a file".to_string()));
            }
        }
        Err(failed("the daemon returned no file".to_string()))
    }

    /// A daemon error at create/start: GPU refusals and missing images get clear errors.
    fn classify(&self, spec: &RunSpec, step: &str, source: BollardError) -> EngineError {
        let message = message_of(&source);
        let lower = message.to_lowercase();
        let gpu_asked = spec.gpus != GpuRequest::None || spec.use_nvidia_runtime;
        if gpu_asked
            && (lower.contains("device driver")
                || lower.contains("nvidia")
                || lower.contains("runtime name")
                || lower.contains("gpu"))
        {
            return EngineError::GpuUnavailable {
                detail: message.trim().to_string(),
            };
        }
        if step == "create" && status_of(&source) == Some(404) && lower.contains("image") {
            return EngineError::NoSuchImage {
                image: spec.image.clone(),
            };
        }
        EngineError::Container {
            image: spec.image.clone(),
            what: format!("{step} failed"),
            source,
        }
    }
}

impl Engine {
    /// Remove the containers that cudastack runs left behind and that are provably
    /// orphans (see the module docs): their run is dead, or past its deadline. Containers
    /// of live runs, of runs this process cannot see, or without the labels stay.
    pub async fn reap_orphans(&self) -> Result<Vec<Reaped>, EngineError> {
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![RUN_LABEL.to_string()],
            )])),
            ..Default::default()
        };
        let containers = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|source| EngineError::Api {
                what: "listing cudastack's containers".to_string(),
                source,
            })?;
        let observer = RunOwner::current();
        let now = unix_now();
        let mut reaped = Vec::new();
        for container in containers {
            let (Some(id), Some(labels)) = (container.id, container.labels) else {
                continue;
            };
            let Some(reason) = orphan_reason(&labels, observer.as_ref(), now) else {
                continue;
            };
            remove_container(&self.docker, &id)
                .await
                .map_err(|source| EngineError::Api {
                    what: format!("removing the orphaned container {id} ({reason})"),
                    source,
                })?;
            reaped.push(Reaped {
                id,
                image: container.image.unwrap_or_default(),
                reason,
            });
        }
        Ok(reaped)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs and loads in flight in this process; a signal with none in flight takes the
/// default path.
static ACTIVE_RUNS: AtomicUsize = AtomicUsize::new(0);
/// Whether a [`default_action_watcher`] is alive (it dies with its runtime).
static WATCHER_ALIVE: AtomicBool = AtomicBool::new(false);

pub(super) struct ActiveRun;

impl ActiveRun {
    pub(super) fn enter() -> Self {
        ACTIVE_RUNS.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        ACTIVE_RUNS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The signals that end a run: SIGINT (Ctrl-C), SIGTERM (CI cancel, `docker stop`,
/// systemd, `timeout`), SIGHUP (the terminal closed).
pub(super) struct Signals {
    streams: Vec<(&'static str, tokio::signal::unix::Signal)>,
}

impl Signals {
    const LIST: [(&'static str, i32); 3] = [("SIGINT", 2), ("SIGTERM", 15), ("SIGHUP", 1)];

    /// Start listening (a signal that cannot be listened for is simply not handled).
    pub(super) fn listen() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let streams = Self::LIST
            .iter()
            .filter_map(|(name, number)| {
                signal(SignalKind::from_raw(*number))
                    .ok()
                    .map(|s| (*name, s))
            })
            .collect();
        if !WATCHER_ALIVE.swap(true, Ordering::SeqCst) {
            tokio::spawn(default_action_watcher());
        }
        Self { streams }
    }

    /// The name of the first signal received; never resolves when listening failed.
    pub(super) async fn recv(&mut self) -> &'static str {
        if self.streams.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.streams.iter_mut().map(|(name, stream)| {
            Box::pin(async move {
                stream.recv().await;
                *name
            })
        });
        futures_util::future::select_all(waits).await.0
    }
}

/// Once a handler is installed the default action of these signals is gone for the
/// process's life: this restores its effect when no run is in flight (exit status 128 +
/// the signal's number, as a shell reports a process the signal ended), so a SIGTERM
/// during a later load or push still ends the process.
async fn default_action_watcher() {
    struct Alive;
    impl Drop for Alive {
        fn drop(&mut self) {
            WATCHER_ALIVE.store(false, Ordering::SeqCst);
        }
    }
    let _alive = Alive;
    let mut signals = Signals {
        streams: Vec::new(),
    };
    for (name, number) in Signals::LIST {
        if let Ok(stream) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(number))
        {
            signals.streams.push((name, stream));
        }
    }
    loop {
        let name = signals.recv().await;
        // A run in flight handles it itself (removes its container, and its caller exits).
        if ACTIVE_RUNS.load(Ordering::SeqCst) == 0 {
            let number = Signals::LIST
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(15, |(_, number)| *number);
            eprintln!("cudastack: {name} received, exiting");
            std::process::exit(128 + number);
        }
    }
}

/// Wait for the container to stop; its exit code (bollard returns non-zero as an error).
async fn wait_exit(docker: &Docker, id: &str) -> Result<i64, BollardError> {
    let mut stream = Box::pin(docker.wait_container(id, None));
    match stream.next().await {
        Some(Ok(response)) => Ok(response.status_code),
        Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
        Some(Err(error)) => Err(error),
        None => Err(BollardError::DockerStreamError {
            error: format!("the wait for container {id} ended without a status"),
        }),
    }
}

/// Force-remove a container and its anonymous volumes; an absent one is fine.
async fn remove_container(docker: &Docker, id: &str) -> Result<(), BollardError> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    };
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(error) if status_of(&error) == Some(404) => Ok(()),
        // 409: removal already in progress (e.g. a concurrent cleanup).
        Err(error) if status_of(&error) == Some(409) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The last [`LOG_TAIL_BYTES`] of one of a container's streams. What runs in the container
/// is the image's code: it can print without end, and only the end matters (the report is
/// the last line), so the rest is dropped as it comes instead of held.
#[derive(Default)]
struct LogTail {
    bytes: Vec<u8>,
    dropped: u64,
}

/// How much of each stream a run keeps: the probe's own output is a few KiB.
const LOG_TAIL_BYTES: usize = 8 << 20;

impl LogTail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        // Dropped in steps of the limit, so a stream of small chunks is not copied per chunk.
        if self.bytes.len() > 2 * LOG_TAIL_BYTES {
            let drop = self.bytes.len() - LOG_TAIL_BYTES;
            self.bytes.drain(..drop);
            self.dropped += drop as u64;
        }
    }

    fn into_text(mut self) -> String {
        if self.bytes.len() > LOG_TAIL_BYTES {
            let drop = self.bytes.len() - LOG_TAIL_BYTES;
            self.bytes.drain(..drop);
            self.dropped += drop as u64;
        }
        let text = String::from_utf8_lossy(&self.bytes);
        if self.dropped == 0 {
            return text.into_owned();
        }
        // Start at a line: the first one kept is likely cut.
        let rest = text.split_once('\n').map_or("", |(_, rest)| rest);
        format!("[{} earlier bytes not kept]\n{rest}", self.dropped)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stream_without_end_keeps_only_its_last_lines() {
        let mut tail = super::LogTail::default();
        let line = [b'x'; 1023]
            .iter()
            .copied()
            .chain([b'\n'])
            .collect::<Vec<u8>>();
        for _ in 0..(3 * super::LOG_TAIL_BYTES / line.len()) {
            tail.push(&line);
            assert!(tail.bytes.len() <= 2 * super::LOG_TAIL_BYTES + line.len());
        }
        tail.push(b"cudastack-report-v1 {}\n");
        let text = tail.into_text();
        assert!(text.len() <= super::LOG_TAIL_BYTES + 64);
        assert!(text.starts_with('['), "{}", &text[..80]);
        assert!(text.ends_with("cudastack-report-v1 {}\n"));
    }

    use super::*;

    fn labels(owner: Option<&RunOwner>, deadline: Option<u64>) -> HashMap<String, String> {
        let mut labels = HashMap::from([(RUN_LABEL.to_string(), "1".to_string())]);
        if let Some(owner) = owner {
            labels.insert(OWNER_LABEL.to_string(), owner.to_label());
        }
        if let Some(deadline) = deadline {
            labels.insert(DEADLINE_LABEL.to_string(), deadline.to_string());
        }
        labels
    }

    #[test]
    fn the_owner_label_round_trips_and_junk_is_not_an_owner() {
        let me = RunOwner::current().expect("Linux has /proc");
        assert_eq!(me.pid, std::process::id());
        assert_eq!(RunOwner::parse(&me.to_label()), Some(me.clone()));
        for junk in [
            "",
            "1",
            "a/b/c",
            "boot/ns/x/1",
            "boot/ns/1/x",
            "/ns/1/2",
            "b/a/b/1/2",
        ] {
            assert_eq!(RunOwner::parse(junk), None, "{junk}");
        }
    }

    /// Reaping must only remove containers whose run is dead; a concurrent
    /// live run on the same host keeps its container.
    #[test]
    fn only_provably_dead_runs_are_orphans() {
        let me = RunOwner::current().unwrap();
        let now = unix_now();
        let later = now + 3600;
        // This process: alive, so never an orphan, not even past its deadline.
        assert_eq!(me.liveness(&me), Liveness::Alive);
        assert_eq!(
            orphan_reason(&labels(Some(&me), Some(later)), Some(&me), now),
            None
        );
        assert_eq!(
            orphan_reason(&labels(Some(&me), Some(now - 5)), Some(&me), now),
            None
        );
        // A process that has exited: first a zombie (killed, its status not collected
        // yet), then gone.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let gone = RunOwner {
            pid: child.id(),
            start_ticks: start_ticks(child.id()).unwrap().unwrap(),
            ..me.clone()
        };
        assert_eq!(gone.liveness(&me), Liveness::Alive);
        child.kill().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while gone.liveness(&me) != Liveness::Dead && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(gone.liveness(&me), Liveness::Dead, "a zombie is dead");
        child.wait().unwrap();
        assert_eq!(gone.liveness(&me), Liveness::Dead);
        let reason = orphan_reason(&labels(Some(&gone), Some(later)), Some(&me), now).unwrap();
        assert!(reason.contains(&format!("pid {}", gone.pid)), "{reason}");
        // A live pid that started at another time: reused, so the run is dead.
        let reused = RunOwner {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert_eq!(reused.liveness(&me), Liveness::Dead);
        // Another PID namespace or boot: not ours to judge, until the deadline.
        for stranger in [
            RunOwner {
                pid_namespace: "pid:[1]".into(),
                pid: gone.pid,
                ..me.clone()
            },
            RunOwner {
                boot_id: "another-boot".into(),
                pid: gone.pid,
                ..me.clone()
            },
        ] {
            assert_eq!(stranger.liveness(&me), Liveness::Unknown);
            assert_eq!(
                orphan_reason(&labels(Some(&stranger), Some(later)), Some(&me), now),
                None
            );
            let reason =
                orphan_reason(&labels(Some(&stranger), Some(now - 5)), Some(&me), now).unwrap();
            assert!(reason.contains("deadline by 5 s"), "{reason}");
        }
        // No labels but the pid (an older cudastack): left alone.
        assert_eq!(orphan_reason(&labels(None, None), Some(&me), now), None);
        // An unreadable deadline is no deadline.
        let mut odd = labels(None, None);
        odd.insert(DEADLINE_LABEL.into(), "soon".into());
        assert_eq!(orphan_reason(&odd, Some(&me), now), None);
    }

    #[test]
    fn start_ticks_survive_a_process_name_with_spaces_and_parentheses() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a b) (c");
        std::fs::copy("/bin/sleep", &odd).unwrap();
        let mut child = std::process::Command::new(&odd).arg("5").spawn().unwrap();
        let ticks = start_ticks(child.id()).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let mine = start_ticks(std::process::id()).unwrap().unwrap();
        assert!(ticks.unwrap() >= mine);
    }

    #[test]
    fn gpu_requests_become_device_requests() {
        assert!(GpuRequest::None.device_request().is_none());
        let all = GpuRequest::All.device_request().unwrap();
        assert_eq!(all.count, Some(-1));
        assert_eq!(all.driver.as_deref(), Some("nvidia"));
        assert_eq!(all.capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert_eq!(
            GpuRequest::Count(2).device_request().unwrap().count,
            Some(2)
        );
        let ids = GpuRequest::DeviceIds(vec!["0".into(), "GPU-abc".into()])
            .device_request()
            .unwrap();
        assert_eq!(ids.count, None);
        assert_eq!(ids.device_ids, Some(vec!["0".into(), "GPU-abc".into()]));
    }
}
