//! The image configuration a recipe may give: `env`, `workdir`, `user`,
//! `entrypoint`, `cmd`, `expose`, `labels` and the run's needs (`runtime`), parsed strictly
//! at load time into types. docs/recipe-image.md is the reference.
//!
//! What the stack owns stays the stack's: the variables that decide which CUDA library the
//! loader finds or what pip may replace (LD_LIBRARY_PATH, CUDA_HOME, NVIDIA_*,
//! PIP_CONSTRAINT, ...) and cudastack's own labels (`io.cudastack.*`) are refused here, so a
//! recipe cannot undo what the audit and the verification proved. `PATH` may only add
//! entries around the stack's, written as `$PATH`. How these values become the OCI config
//! and the user's layer is `stack`'s business.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::labels;
use crate::reference::escape;

/// Variables the stack sets and that its guarantees rest on (one CUDA library directory on
/// the loader's path, the driver floor, pip kept to the lock); `NVIDIA_` names the whole
/// prefix the NVIDIA container runtime reads.
pub const OWNED_ENV: &[&str] = &[
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "LD_AUDIT",
    "CUDA_HOME",
    "CUDA_VERSION",
    "NVIDIA_",
    "PIP_CONSTRAINT",
    "PIP_BREAK_SYSTEM_PACKAGES",
];

/// How `PATH` refers to the stack's own PATH.
pub const PATH_PLACEHOLDER: &str = "$PATH";

/// The prefix of the labels cudastack writes and `verify` adds: claims about the image.
pub const OWNED_LABEL_PREFIX: &str = "io.cudastack";

/// The largest uid and gid of a user (Debian's login.defs UID_MAX/GID_MAX; above are
/// Debian's reserved ranges, 60000-64999 and 65534 `nobody`).
pub const MAX_ID: u32 = 60000;

/// Variables glibc reads as a process starts, naming code or data it loads before the
/// program's first line: the loader's (`LD_*`), the character-set converters
/// (`GCONV_PATH`, which a locale's charset makes it `dlopen`), the locales (`LOCPATH`), the
/// tunables, message catalogues and `malloc`'s trace. In the image's `Env` they reach the
/// verification probe's interpreter, where a module they name runs before the probe could
/// take its nonce out of the environment. glibc ignores the same variables for setuid
/// programs, for the same reason (`unsecvars.h`). A prefix ends in `_`.
pub const LOADER_ENV: &[&str] = &[
    "LD_",
    "GCONV_PATH",
    "LOCPATH",
    "GLIBC_TUNABLES",
    "NLSPATH",
    "GETCONF_DIR",
    "MALLOC_TRACE",
];

/// Whether `name` is in `list`, where an entry ending in `_` names a prefix.
fn listed(list: &[&str], name: &str) -> bool {
    list.iter().any(|entry| {
        if entry.ends_with('_') {
            name.starts_with(entry)
        } else {
            name == *entry
        }
    })
}

/// Whether the stack owns `name` (see [`OWNED_ENV`]).
fn stack_owns(name: &str) -> bool {
    listed(OWNED_ENV, name)
}

/// The `env:` map: each name a shell variable name the stack does not own, each value a
/// scalar; `PATH` keeps `$PATH` as one of its entries.
pub(super) fn deserialize_env<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(deserializer)?;
    let mut env = BTreeMap::new();
    for (name, value) in raw {
        let value = scalar_text(&value).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "env `{}`: the value must be a string, a number or a boolean, not {value}; quote it: `{}: \"...\"`",
                escape(&name),
                escape(&name)
            ))
        })?;
        check_env(&name, &value).map_err(serde::de::Error::custom)?;
        env.insert(name, value);
    }
    Ok(env)
}

fn scalar_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Number(number) => Some(number.to_string()),
        serde_json::Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// One `env:` entry, or why not.
pub fn check_env(name: &str, value: &str) -> Result<(), String> {
    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("env `{}` is not a variable name: letters, digits and `_`, not starting with a digit (what a shell can export)", escape(name)));
    }
    if stack_owns(name) {
        return Err(format!("env `{name}` is set by the stack and may not be changed: the audit and the verification proved the image with the stack's value (one CUDA library directory on the loader's path, the NVIDIA runtime's switches, pip kept to the lock); the variables the stack owns are {}\n  hint: remove `{name}` from `env:`; for a library of your own, give the extension that loads it a RUNPATH (`-Wl,-rpath,'$ORIGIN/lib'`), which the loader follows without its cache; a Debian package's libraries come through `apt:`, whose /etc/ld.so.conf.d entries the image's loader cache includes (`copy:` may not write the loader's files: the cache is built in the config layer, below the code)", OWNED_ENV.iter().map(|n| if n.ends_with('_') { format!("{n}*") } else { n.to_string() }).collect::<Vec<_>>().join(", ")));
    }
    if listed(LOADER_ENV, name) {
        return Err(format!("env `{name}` names what glibc loads or reads as every program starts, before its first line: a module it names would run in the verification probe before the probe could check anything (glibc ignores it in setuid programs for the same reason); the variables refused are {}\n  hint: remove `{name}` from `env:`; locales and character sets come from the base (`LANG`/`LC_*` may name one it has), libraries through a RUNPATH or `apt:`", LOADER_ENV.iter().map(|n| if n.ends_with('_') { format!("{n}*") } else { n.to_string() }).collect::<Vec<_>>().join(", ")));
    }
    if value.contains('\0') {
        return Err(format!(
            "env `{name}`: the value has a NUL byte, which no environment variable can carry"
        ));
    }
    if name == "PATH" {
        check_path(value)?;
    }
    Ok(())
}

/// `PATH` adds entries before or after the stack's (`$PATH`), each absolute.
fn check_path(value: &str) -> Result<(), String> {
    let entries: Vec<&str> = value.split(':').collect();
    let keeps = entries.iter().filter(|e| **e == PATH_PLACEHOLDER).count();
    if keeps != 1 {
        return Err(format!("env `PATH: {}` must keep the stack's PATH exactly once, written `{PATH_PLACEHOLDER}`: the stack's PATH puts the CUDA toolkit and the locked Python's scripts first, and the image was verified with them\n  hint: add your directories before or after it, e.g. `PATH: /opt/tools/bin:{PATH_PLACEHOLDER}` or `PATH: {PATH_PLACEHOLDER}:/home/trainer/.local/bin`", escape(value)));
    }
    if let Some(bad) = entries
        .iter()
        .find(|e| **e != PATH_PLACEHOLDER && !e.starts_with('/'))
    {
        return Err(format!("env `PATH`: the entry `{}` is not an absolute directory; a relative entry is looked up from whatever directory a process runs in\n  hint: write it from `/`", escape(bad)));
    }
    Ok(())
}

/// `PATH` of the image: the recipe's entries around the stack's.
pub fn expand_path(recipe_path: &str, stack_path: &str) -> String {
    recipe_path
        .split(':')
        .map(|entry| {
            if entry == PATH_PLACEHOLDER {
                stack_path
            } else {
                entry
            }
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// An absolute directory inside the image, normalised: `/`-separated, no `.`, no empty
/// component, no trailing slash; `..` is refused (it hides where the directory really is).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ImagePath(String);

impl ImagePath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The path without its leading `/` (a layer path), empty for `/`.
    pub fn relative(&self) -> &str {
        self.0.trim_start_matches('/')
    }
}

impl FromStr for ImagePath {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if !text.starts_with('/') {
            return Err(format!(
                "`{}` is not an absolute path; write it from `/`, e.g. `/workspace`",
                escape(text)
            ));
        }
        // A newline would start a new line of /etc/passwd (a second account) and no control
        // character belongs in a directory name the config or a layer carries.
        if let Some(c) = text.chars().find(|c| c.is_control()) {
            return Err(format!(
                "`{}` has a control character (`{}`); a path in the image is written into the config and, for a home, into /etc/passwd, one account per line\n  hint: name the directory with printable characters, e.g. `/workspace`",
                escape(text),
                c.escape_default()
            ));
        }
        let mut parts = Vec::new();
        for part in text.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    return Err(format!(
                        "`{}` has a `..` component; write the directory it means without it",
                        escape(text)
                    ))
                }
                part => parts.push(part),
            }
        }
        Ok(ImagePath(format!("/{}", parts.join("/"))))
    }
}

impl fmt::Display for ImagePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for ImagePath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ImagePath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        super::deserialize_from_str(deserializer)
    }
}

/// `user:`: a named non-root user, created in its own layer. `gid` defaults to `uid`,
/// `home` to `/home/NAME`; the parsed value carries both, so writing the defaults out
/// is the same recipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawUser")]
pub struct UserSpec {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: ImagePath,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    name: String,
    // Signed, so a negative id is said as one, not as serde's "invalid u32".
    uid: i64,
    #[serde(default)]
    gid: Option<i64>,
    #[serde(default)]
    home: Option<ImagePath>,
}

impl UserSpec {
    /// `uid:gid`, the form the OCI config's `User` gets (see docs/recipe-image.md).
    pub fn oci_user(&self) -> String {
        format!("{}:{}", self.uid, self.gid)
    }
}

impl TryFrom<RawUser> for UserSpec {
    type Error = String;
    fn try_from(raw: RawUser) -> Result<Self, String> {
        check_user_name(&raw.name)?;
        let gid = raw.gid.unwrap_or(raw.uid);
        for (what, id) in [("uid", raw.uid), ("gid", gid)] {
            if id < 0 {
                return Err(format!("user `{}`: {what} {id} is negative; user and group ids are numbers from 1 to {MAX_ID}\n  hint: use 1000, the first uid of a Debian or Ubuntu user", raw.name));
            }
            if id == 0 {
                return Err(format!("user `{}`: {what} 0 is root's; the image's user must not be root (a container running as root owns the mounted data)\n  hint: use 1000, the first uid of a Debian or Ubuntu user", raw.name));
            }
            if id > i64::from(MAX_ID) {
                return Err(format!("user `{}`: {what} {id} is above {MAX_ID}: Debian reserves the ids above (65534 is `nobody`)\n  hint: use an id from 1 to {MAX_ID}, e.g. the one the user has on your cluster's storage", raw.name));
            }
        }
        let home = match raw.home {
            Some(home) => home,
            None => format!("/home/{}", raw.name).parse()?,
        };
        if home.as_str().contains(':') {
            return Err(format!("user `{}`: home `{}` has a `:`, which separates the fields of /etc/passwd (name:password:uid:gid:comment:home:shell): the rest would be read as the shell and more fields\n  hint: choose a directory without `:`, e.g. `/home/{}`", raw.name, home, raw.name));
        }
        if home.as_str() == "/" {
            return Err(format!(
                "user `{}`: home `/` is the image root; give the user a directory of its own",
                raw.name
            ));
        }
        // Both are within 1..=MAX_ID, checked above.
        let id = |id: i64| u32::try_from(id).unwrap_or(MAX_ID);
        Ok(UserSpec {
            name: raw.name,
            uid: id(raw.uid),
            gid: id(gid),
            home,
        })
    }
}

/// useradd's rules for a name (Debian's default NAME_REGEX, 32 characters), and not root.
fn check_user_name(name: &str) -> Result<(), String> {
    let body = name.strip_suffix('$').unwrap_or(name);
    let valid = !body.is_empty()
        && name.len() <= 32
        && body.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && body
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !valid {
        return Err(format!("user name `{}` is not one useradd accepts: lowercase letters, digits, `_` and `-`, starting with a letter or `_`, at most 32 characters", escape(name)));
    }
    if name == "root" {
        return Err("user `root` is the superuser; the image's user must not be root\n  hint: name a user of your own, e.g. `user: { name: trainer, uid: 1000 }`".into());
    }
    Ok(())
}

/// An exec-form list (`[python3, train.py]`); a string (the shell form) is refused with
/// the list spelled out.
pub(super) fn deserialize_exec_form<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<String>, D::Error> {
    deserializer.deserialize_any(ExecFormVisitor)
}

/// `cmd:` present (possibly empty) is the recipe's; absent is the default `[python3]`.
pub(super) fn deserialize_cmd<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    deserialize_exec_form(deserializer).map(Some)
}

struct ExecFormVisitor;

impl<'de> serde::de::Visitor<'de> for ExecFormVisitor {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an exec-form list of strings, such as `[python3, train.py]`")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
        let words: Vec<String> = text.split_whitespace().map(escape).collect();
        Err(E::custom(format!("`{}` is the shell form, which no shell in the image reads: `entrypoint` and `cmd` are exec-form lists\n  hint: write `[{}]` (or `[sh, -c, \"...\"]` if you need a shell)", escape(text), words.join(", "))))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut words = Vec::new();
        while let Some(word) = seq.next_element::<serde_json::Value>()? {
            let text = scalar_text(&word).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "{word} is not a word of a command; each entry is a string"
                ))
            })?;
            if text.contains('\0') {
                return Err(serde::de::Error::custom(format!(
                    "`{}` has a NUL byte, which no argument can carry",
                    escape(&text)
                )));
            }
            words.push(text);
        }
        Ok(words)
    }
}

/// A transport protocol of `expose:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

/// One `expose:` entry, `8080`, `29500/tcp` or `5353/udp`; displayed as the OCI config's
/// `ExposedPorts` key (`8080/tcp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExposedPort {
    pub port: u16,
    pub protocol: Protocol,
}

impl FromStr for ExposedPort {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (port, protocol) = match text.split_once('/') {
            Some((port, "tcp")) => (port, Protocol::Tcp),
            Some((port, "udp")) => (port, Protocol::Udp),
            Some((_, other)) => {
                return Err(format!(
                    "expose `{}`: the protocol `{}` is neither `tcp` nor `udp`",
                    escape(text),
                    escape(other)
                ))
            }
            None => (text, Protocol::Tcp),
        };
        match port.parse::<u16>() {
            Ok(port) if port > 0 && port.to_string() == port_text(text) => {
                Ok(ExposedPort { port, protocol })
            }
            _ => Err(format!("expose `{}`: `{}` is not a port number from 1 to 65535 (a range is not accepted: list each port)", escape(text), escape(port))),
        }
    }
}

/// The digits before `/` (a leading `+` or zero is not a port's spelling).
fn port_text(text: &str) -> &str {
    text.split('/').next().unwrap_or(text)
}

impl fmt::Display for ExposedPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let protocol = match self.protocol {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        };
        write!(f, "{}/{protocol}", self.port)
    }
}

impl Serialize for ExposedPort {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ExposedPort {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        super::deserialize_from_str(deserializer)
    }
}

/// `expose:` as a set: sorted, each port once (`8080` and `8080/tcp` are the same).
pub(super) fn deserialize_ports<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ExposedPort>, D::Error> {
    let mut ports = Vec::<ExposedPort>::deserialize(deserializer)?;
    ports.sort();
    if let Some(pair) = ports.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(serde::de::Error::custom(format!(
            "expose `{}` is listed twice; keep one entry",
            pair[0]
        )));
    }
    Ok(ports)
}

/// `labels:`: any key but cudastack's own (`io.cudastack.*`), scalar values.
pub(super) fn deserialize_labels<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(deserializer)?;
    let mut labels = BTreeMap::new();
    for (key, value) in raw {
        check_label(&key).map_err(serde::de::Error::custom)?;
        let value = scalar_text(&value).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "label `{}`: the value must be a string, not {value}",
                escape(&key)
            ))
        })?;
        labels.insert(key, value);
    }
    Ok(labels)
}

fn check_label(key: &str) -> Result<(), String> {
    if key.trim().is_empty() || key.chars().any(char::is_control) {
        return Err(format!(
            "label `{}` is not a label key: it is empty or has control characters",
            escape(key)
        ));
    }
    if key == OWNED_LABEL_PREFIX || key.starts_with(&format!("{OWNED_LABEL_PREFIX}.")) {
        return Err(format!("label `{}` is in `{OWNED_LABEL_PREFIX}.*`, cudastack's claims about the image (the recipe and lock it was built from, what `verify` proved); a recipe may not make them\n  hint: use your own reverse-DNS prefix, e.g. `com.example.team`", escape(key)));
    }
    Ok(())
}

/// `runtime:`: what the run needs from the container runtime rather than from the image
/// (NCCL puts its buffers in /dev/shm, far above Docker's 64 MiB; pinned memory needs
/// `memlock`). The image cannot carry these: they become `io.cudastack.runtime.*` labels
/// that the emitted Kubernetes and Slurm jobs read, and `docker run` flags in the docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    /// Size of /dev/shm in bytes; written `16g`, `512m` or a number of bytes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_shm_size"
    )]
    pub shm_size: Option<u64>,
    /// Resource limits by Docker's names (`memlock`, `stack`, `nofile`, ...), soft = hard;
    /// `-1` is unlimited. Values of byte limits are bytes, as `docker run --ulimit` takes.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "deserialize_ulimits"
    )]
    pub ulimits: BTreeMap<String, i64>,
    /// Put the start-time guard in front of the entrypoint (docs/guard.md): the image
    /// checks the node's driver and GPUs before the team's code starts. Unlike the other
    /// keys it shapes the image (its entrypoint, a file, a variable), not the runtime.
    #[serde(default, skip_serializing_if = "super::is_false")]
    pub guard: bool,
}

/// The limits `docker run --ulimit` knows (Docker's `ulimit.Parse`), with the `ulimit`
/// flag of bash and the unit bash counts a byte limit in (1: a count, not bytes).
pub const ULIMITS: &[(&str, char, u64)] = &[
    ("core", 'c', 1024),
    ("cpu", 't', 1),
    ("data", 'd', 1024),
    ("fsize", 'f', 1024),
    ("locks", 'x', 1),
    ("memlock", 'l', 1024),
    ("msgqueue", 'q', 1),
    ("nice", 'e', 1),
    ("nofile", 'n', 1),
    ("nproc", 'u', 1),
    ("rss", 'm', 1024),
    ("rtprio", 'r', 1),
    ("rttime", 'R', 1),
    ("sigpending", 'i', 1),
    ("stack", 's', 1024),
];

impl RuntimeSpec {
    /// Whether the runtime has nothing to apply (the guard is the image's own).
    pub fn is_empty(&self) -> bool {
        self.shm_size.is_none() && self.ulimits.is_empty()
    }

    /// The `io.cudastack.runtime.*` labels.
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut labels = Vec::new();
        if let Some(size) = self.shm_size {
            labels.push((labels::RUNTIME_SHM_SIZE.to_string(), size.to_string()));
        }
        for (name, value) in &self.ulimits {
            labels.push((
                format!("{}{name}", labels::RUNTIME_ULIMIT_PREFIX),
                value.to_string(),
            ));
        }
        labels
    }

    /// Read back from an image's labels (other labels are ignored), checked as a recipe's.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut spec = RuntimeSpec::default();
        if let Some(size) = labels.get(labels::RUNTIME_SHM_SIZE) {
            spec.shm_size = Some(
                parse_size(size).map_err(|e| format!("label {}: {e}", labels::RUNTIME_SHM_SIZE))?,
            );
        }
        for (key, value) in labels {
            if let Some(name) = key.strip_prefix(labels::RUNTIME_ULIMIT_PREFIX) {
                let value = value
                    .parse::<i64>()
                    .map_err(|_| format!("label {key}: `{}` is not a number", escape(value)))?;
                spec.ulimits
                    .insert(name.to_string(), check_ulimit(name, value)?);
            }
        }
        Ok(spec)
    }
}

/// `16g`, `512m`, `64k`, `1073741824` (bytes; `b` after the unit allowed; units are
/// binary, as `docker run --shm-size` reads them).
fn parse_size(text: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let lower = lower.strip_suffix('b').unwrap_or(&lower);
    let (digits, multiplier) = match lower.char_indices().last() {
        Some((at, unit)) if unit.is_ascii_alphabetic() => {
            let multiplier: u64 = match unit {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                // `lots`: not a number with a unit at all (said below).
                _ if at == 0 || !lower[..at].bytes().all(|b| b.is_ascii_digit()) => 0,
                _ => {
                    return Err(format!(
                        "shm_size `{}`: the unit `{unit}` is not one of k, m, g, t",
                        escape(text)
                    ))
                }
            };
            (&lower[..at], multiplier)
        }
        _ => (lower, 1),
    };
    let size = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("shm_size `{}` is not a size: write a whole number with an optional unit, e.g. `16g` or `512m`", escape(text)))?;
    if size < 1 << 20 {
        return Err(format!("shm_size `{}` is below 1 MiB; NCCL needs far more (Docker's default is 64m)\n  hint: e.g. `shm_size: 16g`", escape(text)));
    }
    Ok(size)
}

fn deserialize_shm_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    let text = scalar_text(&value).unwrap_or_default();
    parse_size(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn check_ulimit(name: &str, value: i64) -> Result<i64, String> {
    if !ULIMITS.iter().any(|(known, _, _)| *known == name) {
        return Err(format!(
            "ulimit `{}` is not one Docker knows: {}",
            escape(name),
            ULIMITS.iter().map(|u| u.0).collect::<Vec<_>>().join(", ")
        ));
    }
    if value < -1 {
        return Err(format!(
            "ulimit `{name}: {value}`: a limit is a number from 0, or -1 for unlimited"
        ));
    }
    Ok(value)
}

fn deserialize_ulimits<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, i64>, D::Error> {
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    let mut limits = BTreeMap::new();
    for (name, value) in raw {
        let value = match &value {
            serde_json::Value::Number(n) => n.as_i64(),
            serde_json::Value::String(s) if s == "unlimited" => Some(-1),
            _ => None,
        }
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "ulimit `{}`: {value} is not a number (bytes or a count) or -1 for unlimited",
                escape(&name)
            ))
        })?;
        limits.insert(
            name.clone(),
            check_ulimit(&name, value).map_err(serde::de::Error::custom)?,
        );
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_and_ownership() {
        assert!(check_env("OMP_NUM_THREADS", "4").is_ok());
        assert!(check_env("LANG", "en_US.UTF-8").is_ok());
        assert!(check_env("LC_ALL", "C.UTF-8").is_ok());
        assert!(check_env("LDFLAGS", "-L/opt/x").is_ok());
        assert!(check_env("_X1", "").is_ok());
        for (name, expected) in [
            ("1X", "is not a variable name"),
            ("A-B", "is not a variable name"),
            ("", "is not a variable name"),
            ("LD_LIBRARY_PATH", "is set by the stack"),
            ("LD_PRELOAD", "is set by the stack"),
            ("CUDA_HOME", "is set by the stack"),
            ("CUDA_VERSION", "is set by the stack"),
            ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_*"),
            ("NVIDIA_REQUIRE_CUDA", "is set by the stack"),
            ("PIP_CONSTRAINT", "pip kept to the lock"),
            ("PIP_BREAK_SYSTEM_PACKAGES", "hint: remove"),
            ("LD_LIBRARY_PATH", "a RUNPATH"),
            // What glibc loads before a program's first line.
            ("GCONV_PATH", "before its first line"),
            ("LOCPATH", "before its first line"),
            ("GLIBC_TUNABLES", "before its first line"),
            ("LD_BIND_NOW", "before its first line"),
            ("NLSPATH", "setuid"),
        ] {
            let error = check_env(name, "x").unwrap_err();
            assert!(error.contains(expected), "{name}: {error}");
            // The loader cache is built below the copy layer: a conf file there is inert.
            assert!(!error.contains("in your code's layer"), "{name}: {error}");
        }
        assert!(check_env("X", "a\0b").unwrap_err().contains("NUL"));
    }

    #[test]
    fn path_keeps_the_stack_path_once() {
        assert!(check_env("PATH", "/opt/tools/bin:$PATH").is_ok());
        assert!(check_env("PATH", "$PATH:/home/t/.local/bin").is_ok());
        assert!(check_env("PATH", "$PATH").is_ok());
        for (value, expected) in [
            ("/opt/bin", "exactly once"),
            ("$PATH:$PATH", "exactly once"),
            ("${PATH}:/x", "exactly once"),
            ("bin:$PATH", "`bin` is not an absolute directory"),
            ("$PATH:", "`` is not an absolute"),
        ] {
            let error = check_env("PATH", value).unwrap_err();
            assert!(error.contains(expected), "{value}: {error}");
        }
        assert_eq!(
            expand_path("/a:$PATH:/b", "/usr/bin:/bin"),
            "/a:/usr/bin:/bin:/b"
        );
    }

    #[test]
    fn image_paths_are_normalised() {
        let path: ImagePath = "/workspace//project/./".parse().unwrap();
        assert_eq!(path.as_str(), "/workspace/project");
        assert_eq!(path.relative(), "workspace/project");
        assert_eq!("/".parse::<ImagePath>().unwrap().as_str(), "/");
        assert!("workspace"
            .parse::<ImagePath>()
            .unwrap_err()
            .contains("not an absolute path"));
        assert!("/a/../etc"
            .parse::<ImagePath>()
            .unwrap_err()
            .contains("`..`"));
        for bad in ["/a\nb", "/a\rb", "/a\tb", "/a\0b", "/a\u{7f}b", "/a\u{85}b"] {
            let error = bad.parse::<ImagePath>().unwrap_err();
            assert!(
                error.contains("has a control character"),
                "{bad:?}: {error}"
            );
            // The path is escaped: its only line break is the hint's.
            assert_eq!(error.lines().count(), 2, "{error}");
        }
    }

    /// The reviewer's payload: a home that would add a uid-0 account to /etc/passwd.
    #[test]
    fn a_home_cannot_write_another_passwd_line() {
        for (user, expected) in [
            (
                r#"{ name: trainer, uid: 1000, home: "/h:/bin/sh\nroot2:x:0:0::/root" }"#,
                "has a control character (`\\n`)",
            ),
            (
                r#"{ name: trainer, uid: 1000, home: "/h:/bin/sh" }"#,
                "has a `:`, which separates the fields of /etc/passwd",
            ),
            (
                r#"{ name: trainer, uid: 1000, home: "/h\r" }"#,
                "control character",
            ),
            (r#"{ name: "a:b", uid: 1000 }"#, "useradd"),
            (r#"{ name: "a\nroot2", uid: 1000 }"#, "useradd"),
        ] {
            let error = parse(&format!("user: {user}\n")).unwrap_err();
            assert!(
                error.contains(expected),
                "{user}: expected `{expected}` in {error}"
            );
            assert!(error.starts_with("r.yaml:6:"), "{user}: {error}");
            assert!(!error.contains("\nroot2"), "{user}: {error}");
        }
        assert!(parse("workdir: \"/w\\nx\"\n")
            .unwrap_err()
            .contains("control character"));
        // A `:` is refused only where /etc/passwd would read it.
        assert_eq!(
            parse("workdir: /w:x\n").unwrap().workdir.unwrap().as_str(),
            "/w:x"
        );
    }

    #[test]
    fn user_names_follow_useradd() {
        for good in ["trainer", "_svc", "a-b_c1", "machine$"] {
            assert!(check_user_name(good).is_ok(), "{good}");
        }
        for bad in [
            "Trainer",
            "1user",
            "",
            "$",
            "a b",
            "-x",
            "a:b",
            "a\nb",
            "a$b",
            &"a".repeat(33),
        ] {
            assert!(
                check_user_name(bad).unwrap_err().contains("useradd"),
                "{bad}"
            );
        }
        assert!(check_user_name("root").unwrap_err().contains("superuser"));
    }

    #[test]
    fn ports_parse_and_print_as_exposed_ports_keys() {
        let port = |t: &str| t.parse::<ExposedPort>();
        assert_eq!(port("8080").unwrap().to_string(), "8080/tcp");
        assert_eq!(port("29500/tcp").unwrap().to_string(), "29500/tcp");
        assert_eq!(port("5353/udp").unwrap().to_string(), "5353/udp");
        for (bad, expected) in [
            ("0", "from 1 to 65535"),
            ("65536", "from 1 to 65535"),
            ("8080-8090", "a range is not accepted"),
            ("08080", "from 1 to 65535"),
            ("+80", "from 1 to 65535"),
            ("80/sctp", "neither `tcp` nor `udp`"),
            ("", "from 1 to 65535"),
        ] {
            let error = port(bad).unwrap_err();
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }

    #[test]
    fn cudastack_labels_are_refused() {
        assert!(check_label("org.opencontainers.image.source").is_ok());
        assert!(check_label("com.example.team").is_ok());
        assert!(check_label("io.cudastackish").is_ok());
        for bad in [
            "io.cudastack",
            "io.cudastack.verified",
            "io.cudastack.runtime.shm",
        ] {
            assert!(
                check_label(bad).unwrap_err().contains("cudastack's claims"),
                "{bad}"
            );
        }
        assert!(check_label("").is_err());
        assert!(check_label("a\nb").is_err());
    }

    const BASE: &str = "name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: { version: \"12.1\" }\n";

    fn parse(extra: &str) -> Result<super::super::Recipe, String> {
        super::super::Recipe::parse(&format!("{BASE}{extra}"), std::path::Path::new("r.yaml"))
            .map_err(|e| e.to_string())
    }

    /// A field check's hint is on a line of its own, not a literal `\n` in one line; a
    /// newline the recipe itself brings stays escaped, so it cannot print a line.
    #[test]
    fn hints_keep_their_line_and_the_recipe_cannot_add_one() {
        let error = parse("entrypoint: \"python3 train.py\"\n").unwrap_err();
        assert!(
            error.contains("exec-form lists\n  hint: write `[python3, train.py]`"),
            "{error}"
        );
        assert!(!error.contains("\\n"), "a literal \\n: {error}");
        let error = parse("entrypoint: \"run\\u001b[2J\\n  hint: ok\"\n").unwrap_err();
        assert_eq!(error.matches('\n').count(), 1, "{error}");
        assert!(!error.contains('\u{1b}'), "{error}");
        let error = parse("env: { LD_LIBRARY_PATH: /opt/lib }\n").unwrap_err();
        assert!(!error.contains("\\n"), "a literal \\n: {error}");
    }

    #[test]
    fn a_negative_uid_is_said_as_negative() {
        // Serde's "invalid value: integer `-1`, expected u32" before.
        for user in [
            "user: { name: trainer, uid: -1 }\n",
            "user: { name: trainer, uid: 1000, gid: -5 }\n",
        ] {
            let error = parse(user).unwrap_err();
            assert!(error.contains("is negative"), "{user}: {error}");
            assert!(!error.contains("u32"), "{user}: {error}");
        }
        assert!(parse("user: { name: trainer, uid: 1000 }\n").is_ok());
    }

    #[test]
    fn a_training_image_config_parses_into_types() {
        let recipe = parse(concat!(
            "env: { OMP_NUM_THREADS: 4, HF_HOME: /data/hf, PATH: \"/opt/bin:$PATH\" }\n",
            "workdir: /workspace//run/\n",
            "user: { name: trainer, uid: 1000 }\n",
            "entrypoint: [python3, train.py]\n",
            "cmd: [--steps, 10]\n",
            "expose: [\"29500/tcp\", 8080, 5353/udp]\n",
            "labels: { org.opencontainers.image.source: \"https://example.com/repo\" }\n",
        ))
        .unwrap();
        assert_eq!(recipe.env["OMP_NUM_THREADS"], "4");
        assert_eq!(recipe.workdir.as_ref().unwrap().as_str(), "/workspace/run");
        let user = recipe.user.as_ref().unwrap();
        assert_eq!((user.uid, user.gid), (1000, 1000));
        assert_eq!(user.home.as_str(), "/home/trainer");
        assert_eq!(user.oci_user(), "1000:1000");
        assert_eq!(recipe.entrypoint, ["python3", "train.py"]);
        assert_eq!(recipe.cmd.as_deref().unwrap(), ["--steps", "10"]);
        let ports: Vec<String> = recipe.expose.iter().map(ToString::to_string).collect();
        assert_eq!(ports, ["5353/udp", "8080/tcp", "29500/tcp"]);
        // The defaults written out are the same recipe; another value is another recipe.
        let spelled = parse(concat!(
            "env: { OMP_NUM_THREADS: \"4\", HF_HOME: /data/hf, PATH: \"/opt/bin:$PATH\" }\n",
            "workdir: /workspace/run\n",
            "user: { name: trainer, uid: 1000, gid: 1000, home: /home/trainer }\n",
            "entrypoint: [python3, train.py]\n",
            "cmd: [\"--steps\", \"10\"]\n",
            "expose: [5353/udp, 8080/tcp, 29500]\n",
            "labels: { org.opencontainers.image.source: \"https://example.com/repo\" }\n",
        ))
        .unwrap();
        assert_eq!(spelled.digest(), recipe.digest());
        let other = parse("user: { name: trainer, uid: 1001 }\n").unwrap();
        assert_ne!(
            other.digest(),
            parse("user: { name: trainer, uid: 1000 }\n")
                .unwrap()
                .digest()
        );
        // No keys: the recipe and its digest are what they were before these keys existed.
        let plain = parse("").unwrap();
        assert!(!plain.canonical_json().contains("env"));
        assert_eq!(parse("cmd: []\n").unwrap().cmd, Some(vec![]));
        assert_eq!(plain.cmd, None);
    }

    #[test]
    fn errors_name_the_line_what_and_what_to_do() {
        for (extra, expected) in [
            (
                "env: { LD_LIBRARY_PATH: /opt/lib }\n",
                "is set by the stack",
            ),
            ("env: { PATH: /opt/bin }\n", "`PATH: /opt/tools/bin:$PATH`"),
            (
                "env: { X: [1, 2] }\n",
                "must be a string, a number or a boolean",
            ),
            ("env: [A=1]\n", "r.yaml:6:"),
            ("workdir: workspace\n", "not an absolute path"),
            ("workdir: /a/../b\n", "`..`"),
            ("user: { name: trainer }\n", "uid"),
            (
                "user: { name: trainer, uid: 1000, shell: /bin/bash }\n",
                "unknown field `shell`",
            ),
            ("user: { name: root, uid: 1000 }\n", "superuser"),
            ("user: { name: trainer, uid: 0 }\n", "uid 0 is root's"),
            (
                "user: { name: trainer, uid: 1000, gid: 0 }\n",
                "gid 0 is root's",
            ),
            ("user: { name: trainer, uid: 65534 }\n", "above 60000"),
            ("user: { name: trainer, uid: -1 }\n", "r.yaml:6:"),
            ("user: { name: Trainer, uid: 1000 }\n", "useradd"),
            ("user: { name: t, uid: 1000, home: / }\n", "image root"),
            (
                "entrypoint: python3 train.py\n",
                "hint: write `[python3, train.py]`",
            ),
            ("cmd: [python3, [x]]\n", "each entry is a string"),
            (
                "expose: [8080, \"8080/tcp\"]\n",
                "`8080/tcp` is listed twice",
            ),
            ("expose: [99999]\n", "from 1 to 65535"),
            (
                "labels: { io.cudastack.verified: \"yes\" }\n",
                "cudastack's claims",
            ),
        ] {
            let error = parse(extra).unwrap_err();
            assert!(
                error.contains(expected),
                "{extra}: expected `{expected}` in {error}"
            );
            assert!(error.starts_with("r.yaml:6:"), "{extra}: {error}");
        }
    }

    #[test]
    fn the_guard_is_opt_in_and_needs_something_to_start() {
        let plain = parse("runtime: { shm_size: 16g }\n").unwrap();
        assert!(!plain.runtime.as_ref().unwrap().guard);
        // Off is not written: recipes from before the key keep their digest.
        let off = parse("runtime: { shm_size: 16g, guard: false }\n").unwrap();
        assert_eq!(off.digest(), plain.digest());
        let on = parse("runtime: { guard: true }\n").unwrap();
        assert!(on.runtime.as_ref().unwrap().guard);
        assert!(on.runtime.as_ref().unwrap().is_empty(), "no runtime need");
        assert_ne!(on.digest(), plain.digest());
        // The default `[python3]` command, or the recipe's, is what it guards.
        assert!(parse("runtime: { guard: true }\ncmd: [bash]\n").is_ok());
        let nothing = parse("runtime: { guard: true }\ncmd: []\n").unwrap_err();
        assert!(nothing.contains("nothing to start"), "{nothing}");
        assert!(nothing.contains("hint: set `entrypoint:`"), "{nothing}");
        let wrong = parse("runtime: { guard: yes please }\n").unwrap_err();
        assert!(wrong.starts_with("r.yaml:6:"), "{wrong}");
    }

    #[test]
    fn runtime_needs_parse_and_round_trip_through_labels() {
        let recipe =
            parse("runtime: { shm_size: 16g, ulimits: { memlock: -1, stack: 67108864 } }\n")
                .unwrap();
        let runtime = recipe.runtime.clone().unwrap();
        assert_eq!(runtime.shm_size, Some(16 << 30));
        assert_eq!(runtime.ulimits["memlock"], -1);
        let labels: BTreeMap<String, String> = runtime.labels().into_iter().collect();
        assert_eq!(labels[labels::RUNTIME_SHM_SIZE], "17179869184");
        assert_eq!(labels["io.cudastack.runtime.ulimit.stack"], "67108864");
        assert_eq!(RuntimeSpec::from_labels(&labels).unwrap(), runtime);
        let bytes = parse("runtime: { shm_size: 17179869184, ulimits: { memlock: unlimited, stack: 67108864 } }\n").unwrap();
        assert_eq!(bytes.digest(), recipe.digest());
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        for (extra, expected) in [
            ("runtime: { shm_size: 16x }\n", "the unit `x`"),
            ("runtime: { shm_size: 100 }\n", "below 1 MiB"),
            ("runtime: { shm_size: lots }\n", "not a size"),
            (
                "runtime: { ulimits: { memlok: -1 } }\n",
                "not one Docker knows",
            ),
            ("runtime: { ulimits: { stack: -2 } }\n", "-1 for unlimited"),
            ("runtime: { ulimits: { stack: big } }\n", "is not a number"),
            ("runtime: { shm: 1g }\n", "unknown field `shm`"),
        ] {
            let error = parse(extra).unwrap_err();
            assert!(
                error.contains(expected),
                "{extra}: expected `{expected}` in {error}"
            );
            assert!(error.starts_with("r.yaml:6:"), "{extra}: {error}");
        }
    }
}
