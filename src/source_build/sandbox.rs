//! The sandbox a source build runs in: a chroot of the builder root in its own user, mount,
//! PID, IPC and network namespaces (`unshare`), with a private /dev and /dev/shm, a time
//! limit, stop signals forwarded, and its outputs read back without following links out
//! of the root.

use super::*;

/// One run in the sandbox.
pub(super) struct Sandbox<'a> {
    /// The builder root the chroot is made of; `/build` is the build's.
    pub(super) root: &'a Path,
    pub(super) vars: &'a BTreeMap<String, String>,
    /// What runs in the chroot (as nobody, with `vars` alone as its environment).
    pub(super) command: &'a [String],
    pub(super) log: &'a Path,
    /// How long it may run before it is killed.
    pub(super) timeout: Duration,
}

/// How a run in the sandbox ended.
#[derive(Debug)]
pub(super) enum Ended {
    Exited(std::process::ExitStatus),
    /// Killed at its timeout.
    TimedOut,
    /// Killed because cudastack got this signal.
    Stopped(&'static str),
}

/// The signals that stop the source builds: SIGINT (Ctrl-C), SIGTERM (a CI runner
/// cancelling the job, `docker stop`, systemd), SIGHUP (the terminal closed).
pub(super) const STOP_SIGNALS: [(libc::c_int, &str); 3] = [
    (libc::SIGINT, "SIGINT"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGHUP, "SIGHUP"),
];

/// The last stop signal caught while a [`StopSignals`] was alive (0: none).
pub(super) static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// How many [`StopSignals`] are alive, and the actions they replaced.
pub(super) struct Catchers {
    alive: usize,
    replaced: Vec<(libc::c_int, libc::sigaction)>,
}

pub(super) static CATCHERS: Mutex<Catchers> = Mutex::new(Catchers {
    alive: 0,
    replaced: Vec::new(),
});

extern "C" fn note_stop_signal(signal: libc::c_int) {
    // Async-signal-safe: one atomic store; the waiting loop does the rest.
    CAUGHT.store(signal, Ordering::SeqCst);
}

/// While alive, SIGINT, SIGTERM and SIGHUP stop the source builds instead of ending
/// cudastack where it stands: the sandbox is killed with everything in it and
/// the builder root removed, then the build fails with [`SourceBuildError::Stopped`]. The
/// actions it replaced (the default, or tokio's handler when a verify ran before) come
/// back when the last one is dropped; a signal the process ignores stays ignored.
/// Raw `sigaction`, not `tokio::signal`: a tokio handler, once installed, stays for the
/// process's life, and a later SIGTERM (while layers are written) would then end nothing.
pub(crate) struct StopSignals {
    _private: (),
}

impl StopSignals {
    pub(crate) fn catch() -> Self {
        let mut catchers = CATCHERS.lock().unwrap_or_else(|e| e.into_inner());
        if catchers.alive == 0 {
            CAUGHT.store(0, Ordering::SeqCst);
            for (number, _) in STOP_SIGNALS {
                // SAFETY: plain sigaction(2) calls with initialised structures; the handler
                // only stores to an atomic.
                unsafe {
                    let mut previous: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(number, std::ptr::null(), &mut previous) != 0
                        || previous.sa_sigaction == libc::SIG_IGN
                    {
                        continue;
                    }
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = note_stop_signal as extern "C" fn(libc::c_int) as usize;
                    action.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut action.sa_mask);
                    if libc::sigaction(number, &action, &mut previous) == 0 {
                        catchers.replaced.push((number, previous));
                    }
                }
            }
        }
        catchers.alive += 1;
        StopSignals { _private: () }
    }

    /// The stop signal caught since the first live one was made, if any.
    pub(crate) fn caught(&self) -> Option<&'static str> {
        let number = CAUGHT.load(Ordering::SeqCst);
        STOP_SIGNALS
            .iter()
            .find(|(n, _)| *n == number)
            .map(|(_, name)| *name)
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        let mut catchers = CATCHERS.lock().unwrap_or_else(|e| e.into_inner());
        catchers.alive -= 1;
        if catchers.alive == 0 {
            for (number, previous) in catchers.replaced.drain(..) {
                // SAFETY: restores the action sigaction(2) returned.
                unsafe { libc::sigaction(number, &previous, std::ptr::null_mut()) };
            }
        }
    }
}

/// How often the wait looks at the build, its deadline and the stop signals.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// What the sandbox does as root before it enters the chroot (`$0` is the root, `$@` the
/// command), in its own mount namespace: /proc of its own PID namespace; a /dev of its own
/// : a tmpfs with null, zero, random, urandom and tty bound from the host and
/// an empty tmpfs /dev/shm (Python's multiprocessing needs one), not the host's /dev with
/// its disks and its /dev/shm shared with every other process. This shell stays the PID
/// namespace's init (no `exec`): it keeps the parent-death signal `--kill-child` gave it,
/// which `setpriv`'s change of user clears, so killing unshare kills the namespace.
pub(super) const SANDBOX_SCRIPT: &str = r#"set -e
mount -t proc -o nosuid,nodev,noexec proc "$0/proc"
mount -t tmpfs -o mode=755,nosuid,noexec,size=1m cudastack-dev "$0/dev"
for node in null zero random urandom tty; do
  [ -e "/dev/$node" ] || continue
  : > "$0/dev/$node"
  mount --bind "/dev/$node" "$0/dev/$node"
done
mkdir "$0/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev cudastack-shm "$0/dev/shm"
ln -s /proc/self/fd "$0/dev/fd"
ln -s /proc/self/fd/0 "$0/dev/stdin"
ln -s /proc/self/fd/1 "$0/dev/stdout"
ln -s /proc/self/fd/2 "$0/dev/stderr"
chroot "$0" "$@" || exit $?
exit 0"#;

impl Sandbox<'_> {
    /// Run to the end: see [`Sandbox::spawn`] and [`Sandbox::wait`].
    pub(super) fn run(&self, signals: &StopSignals) -> Result<Ended, SourceBuildError> {
        if let Some(signal) = signals.caught() {
            return Ok(Ended::Stopped(signal));
        }
        let child = self.spawn()?;
        self.wait(child, signals)
    }

    /// `command` in a chroot of `root`, output to `log`, in namespaces of its own: mount
    /// (/proc and /dev, [`SANDBOX_SCRIPT`]), network (none), IPC (no System V or POSIX
    /// shared memory with the host's processes:) and PID: nvcc names its
    /// temporary files after its PID (`tmpxft_<pid>_...cudafe1.cpp`) and that name ends
    /// up in the extension's symbols, so the same build in a fresh namespace gets the same
    /// PIDs and the same bytes. unshare runs in a session of its own, with SIGKILL as its
    /// parent-death signal.
    fn spawn(&self) -> Result<std::process::Child, SourceBuildError> {
        mount_points(self.root)?;
        let log = self.log;
        let out = std::fs::File::create(log).map_err(io_error(log))?;
        let err = out.try_clone().map_err(io_error(log))?;
        let mut command = Command::new("unshare");
        command
            .args([
                "--mount",
                "--propagation",
                "private",
                "--net",
                "--ipc",
                "--pid",
            ])
            .args(["--fork", "--kill-child", "sh", "-c", SANDBOX_SCRIPT])
            .arg(self.root)
            // As nobody, with no capabilities and no way to gain any (setuid binaries of the
            // base do nothing): see BUILDER_UID.
            .arg("/usr/bin/setpriv")
            .arg(format!("--reuid={BUILDER_UID}"))
            .arg(format!("--regid={BUILDER_UID}"))
            .args([
                "--clear-groups",
                "--no-new-privs",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ])
            .args(["/usr/bin/env", "-i"])
            .args(self.vars.iter().map(|(k, v)| format!("{k}={v}")))
            .args(self.command)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls (setsid, prctl, getppid), no allocation.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                // A session (and process group) of its own: the terminal's Ctrl-C reaches
                // cudastack alone, which stops the sandbox itself, and /dev/tty opens no
                // terminal in the build.
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // cudastack killed outright (SIGKILL, where nothing of it runs) kills
                // unshare, and unshare's --kill-child the namespace.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        command.spawn().map_err(io_error(Path::new("unshare")))
    }

    /// Wait for the sandbox to end, or kill it at its timeout or on a stop signal.
    fn wait(
        &self,
        mut child: std::process::Child,
        signals: &StopSignals,
    ) -> Result<Ended, SourceBuildError> {
        let unshare = Path::new("unshare");
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            if let Some(status) = child.try_wait().map_err(io_error(unshare))? {
                return Ok(Ended::Exited(status));
            }
            let ended = if let Some(signal) = signals.caught() {
                Ended::Stopped(signal)
            } else if std::time::Instant::now() >= deadline {
                Ended::TimedOut
            } else {
                std::thread::sleep(POLL);
                continue;
            };
            stop(&mut child)?;
            return Ok(ended);
        }
    }
}

/// `/proc` and `/dev` of the builder root are directories (made if missing): the mounts
/// of [`SANDBOX_SCRIPT`] run outside the chroot, and must not follow a link of the base.
pub(super) fn mount_points(root: &Path) -> Result<(), SourceBuildError> {
    for name in ["proc", "dev"] {
        let path = root.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.is_dir() => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                fs_err::create_dir(&path).map_err(io_error(&path))?;
            }
            Ok(metadata) => {
                return Err(SourceBuildError::MountPointNotDirectory {
                    name,
                    path,
                    found: describe(metadata.file_type()),
                })
            }
            Err(error) => return Err(io_error(&path)(error)),
        }
    }
    Ok(())
}

/// Kill everything the sandbox runs, and reap it. The PID namespace's init first: the
/// kernel kills every process of the namespace before its init can be reaped, so once
/// unshare (waiting for it) has exited, none is left. The session's process group when
/// that init is not there (unshare had not forked yet), or unshare does not exit.
pub(super) fn stop(child: &mut std::process::Child) -> Result<(), SourceBuildError> {
    let unshare = child.id() as libc::pid_t;
    // SAFETY: kill(2) of processes this sandbox started: unshare is not reaped yet, so
    // neither its PID nor its process group can belong to anyone else.
    match child_of(unshare) {
        Some(init) => unsafe { libc::kill(init, libc::SIGKILL) },
        None => unsafe { libc::kill(-unshare, libc::SIGKILL) },
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child
        .try_wait()
        .map_err(io_error(Path::new("unshare")))?
        .is_none()
    {
        if std::time::Instant::now() >= deadline {
            // SAFETY: as above.
            unsafe { libc::kill(-unshare, libc::SIGKILL) };
            child.wait().map_err(io_error(Path::new("unshare")))?;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The child of `parent` (unshare has one: the namespace's init), from /proc.
pub(super) fn child_of(parent: libc::pid_t) -> Option<libc::pid_t> {
    let entries = std::fs::read_dir("/proc").ok()?;
    entries.filter_map(Result::ok).find_map(|entry| {
        let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let ppid: libc::pid_t = stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent).then_some(pid)
    })
}

/// What a file is, as an error names it.
pub(super) fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a regular file"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "a file of unknown type"
    }
}

/// The `.whl` files the build left in `/build/out`: their names and open files. `/build`
/// and `/build/out` are the build's (nobody's): it may have replaced either, or a wheel,
/// with a link to a host path, which cudastack (outside the chroot) would follow and cache
/// as the built wheel. So each is opened under `root` without following a link,
/// one component at a time, and must be a directory, or a regular file with one name.
pub(super) fn read_out(
    root: &Path,
    package: &str,
    version: &str,
) -> Result<Vec<(String, std::fs::File)>, SourceBuildError> {
    let top = std::fs::File::open(root).map_err(io_error(root))?;
    let open = |dir: &std::fs::File, shown: &str, name: &OsStr, want_dir: bool| {
        open_output(dir, root, shown, name, want_dir).map_err(|error| match error {
            OutputError::Io(path, source) => SourceBuildError::Io { path, source },
            OutputError::Found(path, found) => SourceBuildError::UnsafeOutput {
                package: package.to_string(),
                version: version.to_string(),
                path,
                found,
            },
        })
    };
    let build = open(&top, "", OsStr::new("build"), true)?;
    let out = open(&build, "/build", OsStr::new("out"), true)?;
    let host = root.join("build/out");
    let mut made = Vec::new();
    for entry in fs_err::read_dir(fd_path(&out)).map_err(io_error(&host))? {
        let name = entry.map_err(io_error(&host))?.file_name();
        if !name.as_bytes().ends_with(b".whl") {
            continue;
        }
        let file = open(&out, "/build/out", &name, false)?;
        made.push((name.to_string_lossy().into_owned(), file));
    }
    Ok(made)
}

/// Why an output was not opened: an I/O error (of this host path), or what was there.
pub(super) enum OutputError {
    Io(PathBuf, std::io::Error),
    Found(String, String),
}

/// `/proc/self/fd/N` of `file`: opening it reopens that very file, whatever its name
/// points at now.
pub(super) fn fd_path(file: &std::fs::File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// `name` in the directory `dir` (`shown` in the chroot, under `root` on the host), opened
/// if it is a directory (`want_dir`) or a regular file with one name: an `O_PATH |
/// O_NOFOLLOW` handle says what it is without opening it (a FIFO would block, a device
/// act), then the handle is reopened.
pub(super) fn open_output(
    dir: &std::fs::File,
    root: &Path,
    shown: &str,
    name: &OsStr,
    want_dir: bool,
) -> Result<std::fs::File, OutputError> {
    let shown = format!("{shown}/{}", name.to_string_lossy());
    let host = root.join(shown.trim_start_matches('/'));
    let io = |error| OutputError::Io(host.clone(), error);
    let name_c = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| io(std::io::ErrorKind::InvalidFilename.into()))?;
    // SAFETY: openat(2) with a valid directory descriptor and a NUL-terminated name; the
    // descriptor it returns is owned by the File.
    let handle = unsafe {
        let fd = libc::openat(
            dir.as_raw_fd(),
            name_c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        std::fs::File::from_raw_fd(fd)
    };
    let metadata = handle.metadata().map_err(io)?;
    let kind = metadata.file_type();
    let found = if kind.is_symlink() {
        let target = std::fs::read_link(&host)
            .map(|target| format!(" to `{}`", target.display()))
            .unwrap_or_default();
        Some(format!("a symbolic link{target}"))
    } else if want_dir != kind.is_dir() || !(kind.is_dir() || kind.is_file()) {
        Some(describe(kind).to_string())
    } else if kind.is_file() && metadata.nlink() != 1 {
        // A second name of a file the build did not make (a hard link).
        Some(format!("a file with {} names", metadata.nlink()))
    } else {
        None
    };
    if let Some(found) = found {
        return Err(OutputError::Found(shown, found));
    }
    std::fs::File::open(fd_path(&handle)).map_err(io)
}

/// Copy the opened wheel to `target`.
pub(super) fn copy_out(mut file: &std::fs::File, target: &Path) -> Result<(), SourceBuildError> {
    let mut copy = std::fs::File::create(target).map_err(io_error(target))?;
    std::io::copy(&mut file, &mut copy).map_err(io_error(target))?;
    Ok(())
}

/// The sandbox, run for real with a tiny builder root of the host's own tools
/// and a shell script as the build. They need root and unshare(1) (as building does); on
/// a machine without them they say so and pass. No GPU and no compiler is involved.
#[cfg(test)]
mod sandbox_tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Instant;

    /// One sandbox at a time: a signal sent to the test process stops every sandbox.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn available() -> bool {
        if crate::base_root::rootless::effective_uid() != 0 {
            eprintln!("skipped: the sandbox needs root (chroot, mounts), as building does");
            return false;
        }
        let works = Command::new("unshare")
            .args(["--mount", "--net", "--pid", "--ipc", "--fork", "true"])
            .status()
            .is_ok_and(|status| status.success());
        if !works {
            eprintln!(
                "skipped: unshare(1) cannot make mount, network, PID and IPC namespaces here"
            );
        }
        works
    }

    /// `tool` from the host's PATH.
    fn host_tool(tool: &str) -> PathBuf {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .map(|dir| Path::new(dir).join(tool))
            .find(|path| path.exists())
            .unwrap_or_else(|| panic!("the host has no `{tool}`"))
    }

    /// `path` of the host, copied to the same path under `root`.
    fn copy_in(root: &Path, path: &Path) {
        let target = root.join(path.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(path, &target).unwrap();
    }

    /// A builder root with the host's sh, a few coreutils, setpriv and env (each with the
    /// shared libraries ldd names), `/build` given to the builder as `build_one` does.
    fn tiny_root(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        let tools = [
            "sh", "ls", "sleep", "ln", "rm", "mkdir", "touch", "readlink", "cat", "mkfifo",
            "setpriv", "env",
        ];
        for tool in tools {
            let host = host_tool(tool);
            let target = root.join("usr/bin").join(tool);
            std::fs::copy(&host, &target).unwrap();
            let ldd = Command::new("ldd").arg(&host).output().unwrap();
            for line in String::from_utf8_lossy(&ldd.stdout).lines() {
                let library = line
                    .split_whitespace()
                    .find(|word| word.starts_with('/'))
                    .map(Path::new);
                if let Some(library) = library {
                    copy_in(&root, library);
                }
            }
        }
        let build = root.join("build");
        for dir in ["home", "tmp", "out"] {
            std::fs::create_dir_all(build.join(dir)).unwrap();
        }
        give_to_builder(&build).unwrap();
        root
    }

    fn vars() -> BTreeMap<String, String> {
        BTreeMap::from([("PATH".to_string(), "/usr/bin".to_string())])
    }

    fn script(text: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), text.into()]
    }

    /// A number no other test's `sleep` has: its processes are found by it.
    fn marker(test: u32) -> String {
        format!("20.{}{test}", std::process::id())
    }

    /// The host PIDs whose command line has `marker`.
    fn processes_with(marker: &str) -> Vec<u32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(pid);
            }
        }
        found
    }

    /// Fail if a process with `marker` is alive after a short grace; kill them (by PID,
    /// ours) so a failing test leaves nothing either.
    fn assert_none_left(marker: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut left = processes_with(marker);
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left = processes_with(marker);
        }
        for pid in &left {
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
        assert!(
            left.is_empty(),
            "processes of the build left behind: {left:?}"
        );
    }

    fn sandbox<'a>(
        root: &'a Path,
        vars: &'a BTreeMap<String, String>,
        command: &'a [String],
        log: &'a Path,
        timeout: Duration,
    ) -> Sandbox<'a> {
        Sandbox {
            root,
            vars,
            command,
            log,
            timeout,
        }
    }

    fn wait_for(path: &Path) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !path.exists() {
            assert!(
                Instant::now() < deadline,
                "{} never appeared",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_build_sees_a_private_dev_and_shm_and_ipc_namespace() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = tiny_root(dir.path());
        // A file of the host's /dev/shm: the build must neither see it nor share the tmpfs.
        let host_shm = tempfile::Builder::new()
            .prefix("cudastack-issue32-")
            .tempfile_in("/dev/shm")
            .unwrap();
        let command = script(
            "ls -A /dev > /build/dev.txt; ls -A /dev/shm > /build/shm.txt; \
             touch /dev/shm/mine && ls -A /dev/shm > /build/shm-after.txt; \
             readlink /proc/self/ns/ipc > /build/ipc.txt; \
             echo discarded > /dev/null && echo works > /build/null.txt",
        );
        let (vars, log) = (vars(), dir.path().join("log"));
        let ended = sandbox(&root, &vars, &command, &log, Duration::from_secs(60))
            .run(&StopSignals::catch())
            .unwrap();
        assert!(
            matches!(ended, Ended::Exited(status) if status.success()),
            "{ended:?}"
        );
        let read = |name: &str| std::fs::read_to_string(root.join("build").join(name)).unwrap();
        let mut dev: Vec<String> = read("dev.txt").lines().map(String::from).collect();
        dev.sort();
        assert_eq!(
            dev,
            [
                "fd", "null", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom",
                "zero"
            ],
            "the build's /dev"
        );
        assert_eq!(read("shm.txt"), "", "the build's /dev/shm is the host's");
        assert_eq!(
            read("shm-after.txt"),
            "mine\n",
            "Python's multiprocessing needs a writable /dev/shm"
        );
        assert!(!Path::new("/dev/shm/mine").exists());
        assert!(host_shm.path().exists());
        let host_ipc = std::fs::read_link("/proc/self/ns/ipc").unwrap();
        assert_ne!(
            read("ipc.txt").trim(),
            host_ipc.to_string_lossy(),
            "the IPC namespace is the host's"
        );
        assert_eq!(read("null.txt"), "works\n");
    }

    #[test]
    fn an_output_replaced_by_a_link_to_a_host_path_is_refused() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = tiny_root(dir.path());
        // A host directory holding a wheel of the sdist's own name: through the link, the
        // old code cached this host file as the built wheel.
        let host = dir.path().join("host");
        std::fs::create_dir(&host).unwrap();
        std::fs::write(host.join("cuda_ext-0.1.0-py3-none-any.whl"), "host secret").unwrap();
        let command = script(&format!(
            "rm -rf /build/out && ln -s {} /build/out",
            host.display()
        ));
        let (vars, log) = (vars(), dir.path().join("log"));
        sandbox(&root, &vars, &command, &log, Duration::from_secs(60))
            .run(&StopSignals::catch())
            .unwrap();
        let error = read_out(&root, "cuda-ext", "0.1.0")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`/build/out` as a symbolic link")
                && error.contains(&host.display().to_string()),
            "{error}"
        );
        // A wheel that is a link, a FIFO (opening it must not block) or a second name of
        // another file is refused too, naming what it is.
        for (make, found) in [
            ("ln -s /etc/passwd /build/out/cuda_ext-0.1.0-py3-none-any.whl", "a symbolic link"),
            ("mkfifo /build/out/cuda_ext-0.1.0-py3-none-any.whl", "a FIFO"),
            (
                "echo x > /build/home/w && ln /build/home/w /build/out/cuda_ext-0.1.0-py3-none-any.whl",
                "a file with 2 names",
            ),
        ] {
            let command = script(&format!("rm -rf /build/out && mkdir /build/out && {make}"));
            let ended = sandbox(&root, &vars, &command, &log, Duration::from_secs(60))
                .run(&StopSignals::catch())
                .unwrap();
            assert!(matches!(ended, Ended::Exited(status) if status.success()), "{make}: {ended:?}");
            let error = read_out(&root, "cuda-ext", "0.1.0").unwrap_err().to_string();
            assert!(
                error.contains(&format!("`/build/out/cuda_ext-0.1.0-py3-none-any.whl` as {found}")),
                "{make}: {error}"
            );
        }
        // A regular file is read.
        let command = script("rm -rf /build/out && mkdir /build/out && echo wheel > /build/out/cuda_ext-0.1.0-py3-none-any.whl");
        sandbox(&root, &vars, &command, &log, Duration::from_secs(60))
            .run(&StopSignals::catch())
            .unwrap();
        let made = read_out(&root, "cuda-ext", "0.1.0").unwrap();
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].0, "cuda_ext-0.1.0-py3-none-any.whl");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut &made[0].1, &mut text).unwrap();
        assert_eq!(text, "wheel\n");
    }

    #[test]
    fn a_build_past_its_timeout_is_killed_with_every_process() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = tiny_root(dir.path());
        let marker = marker(1);
        // A child in the background that ignores SIGTERM must go too.
        let command = script(&format!(
            "(trap '' TERM; exec sleep {marker}) & sleep {marker}; wait"
        ));
        let (vars, log) = (vars(), dir.path().join("log"));
        let started = Instant::now();
        let ended = sandbox(&root, &vars, &command, &log, Duration::from_secs(2))
            .run(&StopSignals::catch())
            .unwrap();
        let took = started.elapsed();
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        assert!(took < Duration::from_secs(15), "it ran {took:?}");
        assert_none_left(&marker);
        let error = SourceBuildError::TimedOut {
            package: "flash-attn".into(),
            version: "2.6.3".into(),
            limit: human_duration(Duration::from_secs(4 * 3600 + 90)),
            tail: "  | nvcc ...".into(),
            log: PathBuf::from("/cache/x.failed.log"),
        }
        .to_string();
        assert!(
            error.starts_with(
                "the build of `flash-attn` 2.6.3 ran past its time limit (4 h 1 min 30 s)"
            ),
            "{error}"
        );
        assert!(error.contains("--source-build-timeout"), "{error}");
    }

    #[test]
    fn a_signal_to_cudastack_stops_the_build_and_nothing_is_left() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = tiny_root(dir.path());
        let marker = marker(2);
        let command = script(&format!("touch /build/started; sleep {marker}"));
        let (vars, log) = (vars(), dir.path().join("log"));
        let signals = StopSignals::catch();
        let started_file = root.join("build/started");
        // SIGTERM to this process, as a CI runner cancelling the job sends it.
        let sender = std::thread::spawn(move || {
            wait_for(&started_file);
            unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        });
        let started = Instant::now();
        let ended = sandbox(&root, &vars, &command, &log, Duration::from_secs(600))
            .run(&signals)
            .unwrap();
        sender.join().unwrap();
        assert!(matches!(ended, Ended::Stopped("SIGTERM")), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_none_left(&marker);
        drop(signals);
        // Nothing is mounted or busy under the root any more: it is removed whole.
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_builder_root_goes_on_drop_and_one_left_by_a_killed_cudastack_on_the_next_build() {
        let work = tempfile::tempdir().unwrap();
        let live = BuilderRoot::new(work.path()).unwrap();
        std::fs::create_dir_all(live.dir.join("root/build")).unwrap();
        // What a cudastack killed outright leaves: a root and a lock file no one holds.
        let dead = work.path().join("builder-dead00");
        std::fs::create_dir_all(dead.join("root/build")).unwrap();
        std::fs::write(work.path().join("builder-dead00.lock"), "").unwrap();
        remove_stale_builders(work.path());
        assert!(!dead.exists() && !work.path().join("builder-dead00.lock").exists());
        assert!(
            live.dir.join("root/build").is_dir(),
            "a live build's root was removed"
        );
        let (dir, lock) = (live.dir.clone(), live.lock.clone());
        drop(live);
        assert!(!dir.exists() && !lock.exists());
    }

    #[test]
    fn a_dead_cudastack_takes_the_build_with_it() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = tiny_root(dir.path());
        let marker = marker(3);
        let command = script(&format!("touch /build/started; sleep {marker}"));
        let (vars, log) = (vars(), dir.path().join("log"));
        // The parent-death signal fires when the thread that started the sandbox ends:
        // the same as cudastack killed outright (SIGKILL, where nothing of it runs).
        let mut child = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let child = sandbox(&root, &vars, &command, &log, Duration::from_secs(600))
                        .spawn()
                        .unwrap();
                    wait_for(&root.join("build/started"));
                    child
                })
                .join()
                .unwrap()
        });
        assert_none_left(&marker);
        child.wait().unwrap();
    }
}
