//! The `user` layer: the recipe's non-root user (`user:`), created the way `useradd -m`
//! would, but deterministically and without running anything in the image.
//!
//! The account files (/etc/passwd, /etc/group, /etc/shadow, /etc/gshadow) are read from
//! the layers that write /etc (the base and the `apt:` layer; the top-most copy of each
//! file wins, as in the merged image, since packages may add system users), the user's
//! line is appended, and each file is written whole into this layer with the owner and
//! mode it had below. The home directory and the working directory are created owned by
//! the user when the layers below do not have them. The layer sits after `python` and
//! before `config`, so a change of user rebuilds two small layers and nothing else.

use std::path::{Path, PathBuf};

use super::below::{self, Below, LowerEntry, LowerKind};
use super::view::LayerBelow;
use super::{BuildEnv, LayerStager, Part, ASSEMBLER};
use crate::layer::{CacheKey, DirOptions, LayerPath, ModePolicy, Recorded, RecordedOwners};
use crate::recipe::{ImagePath, UserSpec};
use crate::stack::error::{io_error, BuildError};
use crate::stack::files::{write_file, write_record};
use crate::stack::prepare::PlatformInputs;

/// The account files, with the line the user gets in each. gshadow only when the base has
/// one (Debian and Ubuntu do).
const ACCOUNT_FILES: &[(&str, bool)] = &[
    ("etc/passwd", true),
    ("etc/group", true),
    ("etc/shadow", true),
    ("etc/gshadow", false),
];

/// The mode of the directories the layer creates for the user (home, workdir).
const USER_DIR_MODE: u32 = 0o755;

/// The user layer of one platform.
pub(crate) struct UserLayer {
    key: CacheKey,
    user: UserSpec,
    workdir: Option<ImagePath>,
    /// Days since 1970 of SOURCE_DATE_EPOCH: shadow's "last password change".
    days: u64,
    /// The trees that write /etc (base, apt), bottom first.
    below: Vec<LayerBelow>,
    owners_record: PathBuf,
}

impl UserLayer {
    /// None when the recipe has no `user:`. `below` are the layers whose /etc it reads.
    pub fn plan(
        inputs: &PlatformInputs,
        below: &[&dyn LayerStager],
        env: &BuildEnv,
    ) -> Option<Self> {
        let user = inputs.recipe.user.clone()?;
        let workdir = inputs.recipe.workdir.clone();
        let days = env.options.mtime / 86_400;
        let key = CacheKey::new(
            &format!("{ASSEMBLER}/user"),
            &below.iter().map(|l| l.key().digest()).collect::<Vec<_>>(),
            &(&user, &workdir, days),
        );
        let owners_record = env.staging.dir(&key).with_extension("owners.json");
        Some(Self {
            below: below
                .iter()
                .map(|layer| LayerBelow::of(*layer, env.staging))
                .collect(),
            key,
            user,
            workdir,
            days,
            owners_record,
        })
    }

    /// The user's line in each account file.
    fn line(&self, file: &str) -> String {
        let UserSpec {
            name,
            uid,
            gid,
            home,
        } = &self.user;
        match file {
            // useradd's defaults: no password (locked), /bin/sh, no ageing limits.
            "etc/passwd" => format!("{name}:x:{uid}:{gid}::{home}:/bin/sh"),
            "etc/group" => format!("{name}:x:{gid}:"),
            "etc/shadow" => format!("{name}:!:{}:0:99999:7:::", self.days),
            _ => format!("{name}:!::"),
        }
    }

    /// The entry of `text` (an account file) that takes the user's name or id, if any.
    fn taken<'t>(&self, file: &str, text: &'t str) -> Option<&'t str> {
        let (id_field, id) = match file {
            "etc/passwd" => (Some(2), self.user.uid),
            "etc/group" => (Some(2), self.user.gid),
            _ => (None, 0),
        };
        text.lines().find(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            fields[0] == self.user.name
                || id_field
                    .and_then(|i| fields.get(i))
                    .is_some_and(|f| f.parse::<u32>() == Ok(id))
        })
    }

    /// Each account file with the user's line appended; records their owners and modes.
    fn write_accounts(
        &self,
        dir: &Path,
        below: &[Below],
        owners: &mut RecordedOwners,
    ) -> Result<(), BuildError> {
        for &(file, required) in ACCOUNT_FILES {
            let Some((text, recorded)) = top_most(below, file)? else {
                if required {
                    return Err(BuildError::Unsupported(format!("the base has no /{file}, so the recipe's user `{}` cannot be added to it\n  hint: build on a Debian or Ubuntu base (`base: {{ debian: bookworm }}`)", self.user.name)));
                }
                continue;
            };
            if let Some(entry) = self.taken(file, &text) {
                return Err(BuildError::Unsupported(format!("the recipe's user `{}` (uid {}, gid {}) clashes with an entry of the base's /{file}:\n  {entry}\n  hint: choose another name, uid or gid in `user:` (the base's accounts are the distribution's and packages')", self.user.name, self.user.uid, self.user.gid)));
            }
            let mut text = text;
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&self.line(file));
            text.push('\n');
            write_file(&dir.join(file), text.as_bytes())?;
            owners.insert(&layer_path(file)?, recorded);
        }
        Ok(())
    }

    /// Home and workdir, owned by the user, where the layers below have no such directory;
    /// their missing parents are root's.
    fn make_dirs(
        &self,
        dir: &Path,
        below: &[Below],
        owners: &mut RecordedOwners,
    ) -> Result<(), BuildError> {
        let mine = Recorded {
            uid: self.user.uid,
            gid: self.user.gid,
            mode: USER_DIR_MODE,
        };
        for path in [Some(&self.user.home), self.workdir.as_ref()]
            .into_iter()
            .flatten()
        {
            let relative = path.relative();
            if relative.is_empty() || exists_below(below, relative)? {
                continue;
            }
            fs_err::create_dir_all(dir.join(relative)).map_err(io_error(&dir.join(relative)))?;
            owners.insert(&layer_path(relative)?, mine);
        }
        Ok(())
    }
}

impl LayerStager for UserLayer {
    fn name(&self) -> &str {
        "user"
    }
    fn part(&self) -> Part {
        Part::Team
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let below = self
            .below
            .iter()
            .map(Below::open)
            .collect::<Result<Vec<_>, BuildError>>()?;
        let mut owners = RecordedOwners::default();
        self.write_accounts(dir, &below, &mut owners)?;
        self.make_dirs(dir, &below, &mut owners)?;
        record_parents(dir, &below, &mut owners)?;
        write_record(&self.owners_record, &owners.to_json())
    }
    /// Owners and modes as recorded while staging (the user's directories are theirs).
    fn walk(&self) -> DirOptions {
        DirOptions {
            modes: ModePolicy::Exact,
            keep_owners: true,
            recorded: Some(self.owners_record.clone()),
            ..DirOptions::default()
        }
    }
}

fn layer_path(path: &str) -> Result<LayerPath, BuildError> {
    LayerPath::parse(path).map_err(BuildError::from)
}

/// The owner and mode of `path` in the top-most tree below that has it.
fn find_below(below: &[Below], path: &str) -> Result<Option<(PathBuf, Recorded)>, BuildError> {
    match below::top_most(below, path) {
        Some(LowerEntry {
            kind: LowerKind::Symlink(_),
            ..
        }) => Err(BuildError::Unsupported(format!("/{path} is a symbolic link in the layers below the user's; cudastack writes the user's files and directories only where the path is real\n  hint: give `user.home` or `workdir` a path without links (e.g. under /home or /workspace)"))),
        Some(entry) => Ok(Some((entry.disk, entry.recorded))),
        None => Ok(None),
    }
}

/// Whether `path` exists below, checking each component from the top so that no link
/// of the image is followed on the host.
fn exists_below(below: &[Below], path: &str) -> Result<bool, BuildError> {
    let mut prefix = String::new();
    for component in path.split('/') {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(component);
        if find_below(below, &prefix)?.is_none() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The text of the top-most copy of an account file, with its owner and mode.
fn top_most(below: &[Below], file: &str) -> Result<Option<(String, Recorded)>, BuildError> {
    let Some((disk, recorded)) = find_below(below, file)? else {
        return Ok(None);
    };
    let text = fs_err::read_to_string(&disk).map_err(io_error(&disk))?;
    Ok(Some((text, recorded)))
}

/// Every directory of the staged tree that the layers below have keeps their owner and
/// mode (`etc`, `home`); one they do not have is root's, 0755.
fn record_parents(
    dir: &Path,
    below: &[Below],
    owners: &mut RecordedOwners,
) -> Result<(), BuildError> {
    for entry in walkdir(dir)? {
        let path = layer_path(&entry)?;
        if owners.get(&path).is_some() {
            continue;
        }
        let recorded = match find_below(below, &entry)? {
            Some((_, recorded)) => recorded,
            None => Recorded {
                uid: 0,
                gid: 0,
                mode: 0o755,
            },
        };
        owners.insert(&path, recorded);
    }
    Ok(())
}

/// The directories under `dir`, as relative paths.
fn walkdir(dir: &Path) -> Result<Vec<String>, BuildError> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let here = dir.join(&relative);
        for child in fs_err::read_dir(&here).map_err(io_error(&here))? {
            let child = child.map_err(io_error(&here))?;
            if child.file_type().map_err(io_error(&here))?.is_dir() {
                let path = relative.join(child.file_name());
                found.push(path.to_string_lossy().into_owned());
                pending.push(path);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::LayerContents;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n";

    /// A base tree with the account files (shadow root:shadow 0640 by its owners record),
    /// and an apt tree whose package added a system user.
    fn trees(root: &Path) -> Vec<PathBuf> {
        let base = root.join("base");
        write_file(&base.join("etc/passwd"), PASSWD.as_bytes()).unwrap();
        write_file(
            &base.join("etc/group"),
            b"root:x:0:\nshadow:x:42:\nusers:x:100:\n",
        )
        .unwrap();
        write_file(&base.join("etc/shadow"), b"root:*:19000:0:99999:7:::\n").unwrap();
        write_file(&base.join("etc/gshadow"), b"root:*::\n").unwrap();
        fs_err::create_dir_all(base.join("tmp")).unwrap();
        fs_err::create_dir_all(base.join("home")).unwrap();
        std::os::unix::fs::symlink("/tmp", base.join("scratch")).unwrap();
        let mut owners = RecordedOwners::default();
        let record = |uid, gid, mode| Recorded { uid, gid, mode };
        owners.insert(&layer_path("etc").unwrap(), record(0, 0, 0o755));
        owners.insert(&layer_path("etc/shadow").unwrap(), record(0, 42, 0o640));
        owners.insert(&layer_path("tmp").unwrap(), record(0, 0, 0o1777));
        owners.insert(&layer_path("home").unwrap(), record(0, 0, 0o755));
        fs_err::write(base.with_extension("owners.json"), owners.to_json()).unwrap();
        let apt = root.join("apt");
        let with_messagebus =
            format!("{PASSWD}messagebus:x:100:107::/nonexistent:/usr/sbin/nologin");
        write_file(&apt.join("etc/passwd"), with_messagebus.as_bytes()).unwrap();
        vec![base, apt]
    }

    fn layer(root: &Path, user: &str, workdir: Option<&str>) -> UserLayer {
        let recipe = crate::recipe::Recipe::parse(
            &format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: {{ version: \"12.1\" }}\nuser: {user}\n"),
            Path::new("t.yaml"),
        )
        .unwrap();
        UserLayer {
            key: CacheKey::new("test", &[], &user),
            user: recipe.user.unwrap(),
            workdir: workdir.map(|w| w.parse().unwrap()),
            days: 19_900,
            below: trees(root)
                .iter()
                .map(|tree| LayerBelow::tree(tree))
                .collect(),
            owners_record: root.join("user.owners.json"),
        }
    }

    fn stage(layer: &UserLayer, root: &Path) -> Result<LayerContents, BuildError> {
        let dir = root.join("user");
        fs_err::create_dir_all(&dir).unwrap();
        layer.stage(&dir)?;
        Ok(LayerContents::from_dir(&dir, &layer.walk())?)
    }

    fn entry(contents: &LayerContents, path: &str) -> (u32, u32, u32) {
        let entry = contents
            .entries()
            .iter()
            .find(|e| e.path.as_str() == path)
            .unwrap_or_else(|| panic!("{path} is in the layer"));
        (entry.uid, entry.gid, entry.mode)
    }

    #[test]
    fn the_user_is_appended_to_the_top_most_account_files() {
        let root = tempfile::tempdir().unwrap();
        let layer = layer(
            root.path(),
            "{ name: trainer, uid: 1000 }",
            Some("/workspace/run"),
        );
        let contents = stage(&layer, root.path()).unwrap();
        let dir = root.path().join("user");
        let passwd = fs_err::read_to_string(dir.join("etc/passwd")).unwrap();
        assert!(
            passwd.contains("messagebus:x:100:"),
            "the apt layer's copy wins: {passwd}"
        );
        assert!(passwd.ends_with("messagebus:x:100:107::/nonexistent:/usr/sbin/nologin\ntrainer:x:1000:1000::/home/trainer:/bin/sh\n"), "{passwd}");
        let group = fs_err::read_to_string(dir.join("etc/group")).unwrap();
        assert!(
            group.ends_with("users:x:100:\ntrainer:x:1000:\n"),
            "{group}"
        );
        let shadow = fs_err::read_to_string(dir.join("etc/shadow")).unwrap();
        assert!(
            shadow.ends_with("trainer:!:19900:0:99999:7:::\n"),
            "{shadow}"
        );
        let gshadow = fs_err::read_to_string(dir.join("etc/gshadow")).unwrap();
        assert!(gshadow.ends_with("trainer:!::\n"), "{gshadow}");
        // Owners and modes: the base's for its files, the user's for the new directories.
        assert_eq!(entry(&contents, "etc/shadow"), (0, 42, 0o640));
        assert_eq!(entry(&contents, "etc"), (0, 0, 0o755));
        assert_eq!(entry(&contents, "home"), (0, 0, 0o755));
        assert_eq!(entry(&contents, "home/trainer"), (1000, 1000, 0o755));
        assert_eq!(entry(&contents, "workspace"), (0, 0, 0o755));
        assert_eq!(entry(&contents, "workspace/run"), (1000, 1000, 0o755));
        // Staged twice: the same layer.
        let again = tempfile::tempdir().unwrap();
        let second = stage(
            &self::layer(
                again.path(),
                "{ name: trainer, uid: 1000 }",
                Some("/workspace/run"),
            ),
            again.path(),
        )
        .unwrap();
        let describe = |c: &LayerContents| {
            c.entries()
                .iter()
                .map(|e| (e.path.as_str().to_string(), e.uid, e.gid, e.mode))
                .collect::<Vec<_>>()
        };
        assert_eq!(describe(&contents), describe(&second));
    }

    #[test]
    fn a_directory_the_base_has_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let layer = layer(
            root.path(),
            "{ name: trainer, uid: 1000, home: /home/trainer }",
            Some("/tmp"),
        );
        let contents = stage(&layer, root.path()).unwrap();
        assert!(!contents.entries().iter().any(|e| e.path.as_str() == "tmp"));
        let root = tempfile::tempdir().unwrap();
        let layer = self::layer(
            root.path(),
            "{ name: trainer, uid: 1000 }",
            Some("/scratch/x"),
        );
        let error = stage(&layer, root.path()).unwrap_err().to_string();
        assert!(error.contains("/scratch is a symbolic link"), "{error}");
    }

    #[test]
    fn a_taken_name_or_id_names_the_existing_entry() {
        for (user, expected) in [
            (
                "{ name: messagebus, uid: 1000 }",
                "/etc/passwd:\n  messagebus:x:100:107",
            ),
            ("{ name: trainer, uid: 42 }", "/etc/passwd:\n  _apt:x:42:"),
            (
                "{ name: trainer, uid: 1000, gid: 100 }",
                "/etc/group:\n  users:x:100:",
            ),
            ("{ name: shadow, uid: 1000 }", "/etc/group:\n  shadow:x:42:"),
        ] {
            let root = tempfile::tempdir().unwrap();
            let error = stage(&layer(root.path(), user, None), root.path())
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(expected),
                "{user}: expected `{expected}` in {error}"
            );
            assert!(error.contains("hint: choose another"), "{error}");
        }
    }
}
