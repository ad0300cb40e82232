//! The recipe's `apt:` list: Debian and Ubuntu packages the user adds to the base,
//! each a package name optionally pinned to an exact version, `git` or
//! `git=1:2.39.5-0+deb12u2`.
//!
//! Parsed strictly at load time against Debian Policy's syntax (5.6.1 package names, 5.6.12
//! versions, as dpkg's `parseversion` enforces them), so what reaches `apt-get install` is
//! one word that apt reads as "install this package": no option (nothing starts with `-`), no
//! architecture qualifier, no target release, no version relation. Whether the package exists
//! is not known here: apt answers that when the recipe is locked. Which packages the image
//! must not get twice (CUDA, cuDNN, NCCL, the driver) is `matrix::validate`'s knowledge.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::reference::escape;

/// A Debian binary package name: lowercase letters, digits, `+`, `-` and `.`, starting
/// with a letter or digit, at least two characters (Debian Policy 5.6.1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DebName(String);

/// A Debian version, `[epoch:]upstream[-revision]` (Debian Policy 5.6.12). Compared as
/// text only (equality): dpkg's ordering is apt's business at lock time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DebVersion(String);

/// One entry of `apt:`: a package, optionally pinned to an exact version. Displays as the
/// argument `apt-get install` takes (`git`, `git=1:2.39.5-0+deb12u2`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SystemPackage {
    pub name: DebName,
    pub version: Option<DebVersion>,
}

const NAME_RULE: &str = "a Debian package name is lowercase letters, digits, `+`, `-` and `.`, starts with a letter or digit and is at least 2 characters long (Debian Policy 5.6.1)";
const VERSION_RULE: &str = "a Debian version is `[epoch:]upstream[-revision]`: the epoch a number, the upstream version starting with a digit and made of letters, digits and `. + ~ : -`, the revision of letters, digits and `. + ~` (Debian Policy 5.6.12)";

impl DebName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DebName {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c);
        let starts_well = text.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
        if text.len() >= 2 && starts_well && text.chars().all(allowed) {
            return Ok(DebName(text.to_string()));
        }
        let lower = text.to_ascii_lowercase();
        if lower != text && lower.parse::<DebName>().is_ok() {
            return Err(format!(
                "the package name `{}` has capital letters: {NAME_RULE}; write `{}`",
                escape(text),
                escape(&lower)
            ));
        }
        Err(format!(
            "`{}` is not a Debian package name: {NAME_RULE}",
            escape(text)
        ))
    }
}

impl DebVersion {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The epoch, `0` when the version has none.
    pub fn epoch(&self) -> u32 {
        self.parts().0
    }

    /// The upstream version: between the epoch's `:` and the last `-`.
    pub fn upstream(&self) -> &str {
        self.parts().1
    }

    /// The Debian revision after the last `-`, if any.
    pub fn revision(&self) -> Option<&str> {
        self.parts().2
    }

    /// `(epoch, upstream, revision)`: dpkg's split, on text already checked.
    fn parts(&self) -> (u32, &str, Option<&str>) {
        let (epoch, rest) = match self.0.split_once(':') {
            Some((epoch, rest)) => (epoch.parse().unwrap_or(0), rest),
            None => (0, self.0.as_str()),
        };
        match rest.rsplit_once('-') {
            Some((upstream, revision)) => (epoch, upstream, Some(revision)),
            None => (epoch, rest, None),
        }
    }
}

impl FromStr for DebVersion {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            Err(format!(
                "`{}` is not a Debian version: {why}; {VERSION_RULE}",
                escape(text)
            ))
        };
        // dpkg's split: the epoch before the first `:`, the revision after the last `-`.
        let rest = match text.split_once(':') {
            Some((epoch, rest)) => {
                if epoch.is_empty() || !epoch.bytes().all(|b| b.is_ascii_digit()) {
                    return bad(&format!("the epoch `{}` is not a number", escape(epoch)));
                }
                // dpkg keeps the epoch in an int.
                if epoch.parse::<i32>().is_err() {
                    return bad(&format!("the epoch `{epoch}` is too large"));
                }
                rest
            }
            None => text,
        };
        let upstream = match rest.rsplit_once('-') {
            Some((upstream, revision)) => {
                if revision.is_empty() {
                    return bad("the revision after the last `-` is empty");
                }
                if let Some(c) = revision
                    .chars()
                    .find(|c| !c.is_ascii_alphanumeric() && !".+~".contains(*c))
                {
                    return bad(&format!(
                        "the revision `{}` has `{}`",
                        escape(revision),
                        escape(&c.to_string())
                    ));
                }
                upstream
            }
            None => rest,
        };
        if !upstream.starts_with(|c: char| c.is_ascii_digit()) {
            return bad("the upstream version must start with a digit");
        }
        if let Some(c) = upstream
            .chars()
            .find(|c| !c.is_ascii_alphanumeric() && !".+~:-".contains(*c))
        {
            let why = if "*?[]".contains(c) {
                "a pin is one exact version, not a pattern".to_string()
            } else {
                format!(
                    "the upstream version `{}` has `{}`",
                    escape(upstream),
                    escape(&c.to_string())
                )
            };
            return bad(&why);
        }
        Ok(DebVersion(text.to_string()))
    }
}

impl FromStr for SystemPackage {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let entry = escape(text);
        if let Some(at) = text.find(['<', '>']) {
            return Err(format!("apt package `{entry}`: a version relation (`{}`) is not accepted; pin one exact version with `name=VERSION`, or give the name alone and `cudastack lock` records the version it resolves", escape(&text[at..])));
        }
        let (name, version) = match text.split_once('=') {
            Some((name, version)) => (name, Some(version)),
            None => (text, None),
        };
        if let Some((bare, qualifier)) = name.split_once(':') {
            return Err(format!("apt package `{entry}`: the architecture qualifier `:{}` is not accepted; packages are installed for the platform being built (each entry of `platforms:` is locked on its own); write `{}`", escape(qualifier), escape(bare)));
        }
        if let Some((bare, release)) = name.split_once('/') {
            return Err(format!("apt package `{entry}`: the target release `/{}` is not accepted; packages come from the base's release (`base:`), the one the lock resolves against; write `{}`, pinned with `={{VERSION}}` if you need one version", escape(release), escape(bare)));
        }
        if name.ends_with('-') && name.parse::<DebName>().is_ok() {
            // `apt-get install foo-` removes `foo`.
            return Err(format!("apt package `{entry}`: a name ending in `-` asks apt-get to remove the package; `apt:` only adds packages"));
        }
        let name = name
            .parse::<DebName>()
            .map_err(|why| format!("apt package `{entry}`: {why}"))?;
        let version = match version {
            Some("") => return Err(format!("apt package `{entry}`: the version after `=` is empty; write `{name}` for the version the lock resolves, or `{name}=VERSION` to pin one")),
            Some(version) => Some(
                version
                    .parse::<DebVersion>()
                    .map_err(|why| format!("apt package `{entry}`: {why}"))?,
            ),
            None => None,
        };
        Ok(SystemPackage { name, version })
    }
}

impl fmt::Display for DebName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for DebVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for SystemPackage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(version) => write!(f, "{}={version}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

impl Serialize for SystemPackage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SystemPackage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        super::deserialize_from_str(deserializer)
    }
}

/// The `apt:` list: each entry parsed, no package named twice, sorted by name (apt installs
/// a set; the order means nothing, so it must not change the recipe's digest).
pub(super) fn deserialize_list<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<SystemPackage>, D::Error> {
    let mut packages = deserializer.deserialize_any(ListVisitor)?;
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = packages
        .windows(2)
        .find(|pair| pair[0].name == pair[1].name)
    {
        let (first, second) = (&pair[0], &pair[1]);
        let both = if first == second {
            format!("`{first}` twice")
        } else {
            format!("as `{first}` and as `{second}`")
        };
        return Err(serde::de::Error::custom(format!(
            "apt package `{}` is listed {both}; keep one entry",
            first.name
        )));
    }
    Ok(packages)
}

/// A sequence of entries; anything else is refused with the list form spelled out (a bare
/// `apt: git` otherwise reads "expected sequence start").
struct ListVisitor;

impl<'de> serde::de::Visitor<'de> for ListVisitor {
    type Value = Vec<SystemPackage>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of Debian packages, such as `apt: [git, openssh-client]`")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut packages = Vec::new();
        while let Some(package) = seq.next_element()? {
            packages.push(package);
        }
        Ok(packages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SystemPackage, String> {
        text.parse()
    }

    #[test]
    fn names_and_pins_print_as_apt_get_takes_them() {
        for text in [
            "git",
            "openssh-client",
            "libgl1",
            "g++",
            "libstdc++6",
            "python3.11",
            "0ad",
            "git=1:2.39.5-0+deb12u2",
            "libc6=2.36-9+deb12u9",
            "ca-certificates=20230311",
            "openssl=3.0.15-1~deb12u1",
            "foo=1.0~rc1+dfsg-2ubuntu0.1",
            "bar=2:1.2:3-4",
        ] {
            let package = parse(text).unwrap();
            assert_eq!(package.to_string(), text);
        }
        let git = parse("git=1:2.39.5-0+deb12u2").unwrap();
        assert_eq!(git.name.as_str(), "git");
        let version = git.version.unwrap();
        assert_eq!(version.epoch(), 1);
        assert_eq!(version.upstream(), "2.39.5");
        assert_eq!(version.revision(), Some("0+deb12u2"));
        let plain: DebVersion = "20230311".parse().unwrap();
        assert_eq!(
            (plain.epoch(), plain.upstream(), plain.revision()),
            (0, "20230311", None)
        );
        // A hyphen in the upstream version belongs there when a revision follows.
        let hyphen: DebVersion = "1.2-3-4".parse().unwrap();
        assert_eq!((hyphen.upstream(), hyphen.revision()), ("1.2-3", Some("4")));
    }

    #[test]
    fn refusals_name_the_entry_and_what_is_allowed() {
        for (text, expected) in [
            ("", "is not a Debian package name"),
            ("g", "at least 2 characters"),
            ("Git", "write `git`"),
            ("-y", "starts with a letter or digit"),
            ("git lfs", "is not a Debian package name"),
            ("lib_foo", "is not a Debian package name"),
            (
                "libc6:amd64",
                "architecture qualifier `:amd64` is not accepted",
            ),
            ("libc6:amd64=2.36-9", "write `libc6`"),
            (
                "git/bookworm-backports",
                "target release `/bookworm-backports`",
            ),
            ("git>=2.39", "version relation (`>=2.39`)"),
            ("git=", "the version after `=` is empty"),
            ("git=v2.39", "must start with a digit"),
            ("git=2.39*", "not a pattern"),
            ("git=a:2.39", "the epoch `a` is not a number"),
            ("git=:2.39", "the epoch `` is not a number"),
            ("git=99999999999:1", "too large"),
            ("git=2.39-", "revision after the last `-` is empty"),
            ("git=1:2.39-1:2", "the revision `1:2` has `:`"),
            ("git=2.39-1:2", "the epoch `2.39-1` is not a number"),
            ("git=2.39_1", "has `_`"),
            ("git=2.39=1", "has `=`"),
            ("git-", "asks apt-get to remove"),
            ("git\n", "`git\\n`"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(
                error.contains(expected),
                "{text:?}: expected `{expected}` in {error}"
            );
            assert!(
                error.starts_with(&format!("apt package `{}`", escape(text))),
                "{text:?}: {error}"
            );
        }
        let error = parse("git=v2").unwrap_err();
        assert!(error.contains("Debian Policy 5.6.12"), "{error}");
        let error = parse("lib_foo").unwrap_err();
        assert!(error.contains("Debian Policy 5.6.1"), "{error}");
    }
}
