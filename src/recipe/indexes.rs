//! The recipe's `indexes:` list: private and extra Python package indexes, each
//! a name, a simple-API URL (PEP 503 HTML or PEP 691 JSON) and the packages pinned to it.
//!
//! Parsed strictly at load time. A URL may not carry `user:password@`: the URL is part of
//! the recipe's digest and each locked file's URL is written into the lock, so credentials
//! in it would end up in files that are committed and shared; they come from the
//! environment, netrc or a keyring helper instead (`fetch::credentials`,
//! docs/recipe-indexes.md). Whether the index answers is known only at lock time.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::Url;

use crate::names::PackageName;
use crate::reference::escape;

/// An index name: lowercase letters, digits and `-`, starting with a letter or digit, at
/// most 64 characters. It names the index in errors and in the credential variables
/// (`CUDASTACK_INDEX_<NAME>_USERNAME`), so it must become a shell variable name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IndexName(String);

const NAME_RULE: &str = "an index name is lowercase letters, digits and `-`, starts with a letter or digit and is at most 64 characters (it becomes part of CUDASTACK_INDEX_<NAME>_USERNAME)";

impl IndexName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name in a credential variable: upper case, `-` as `_` (`acme-internal` ->
    /// `ACME_INTERNAL`), as uv does for `UV_INDEX_<NAME>_USERNAME`.
    pub fn env_key(&self) -> String {
        self.0.to_ascii_uppercase().replace('-', "_")
    }
}

impl FromStr for IndexName {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        let starts_well = text.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !text.is_empty() && text.len() <= 64 && starts_well && text.chars().all(allowed) {
            return Ok(IndexName(text.to_string()));
        }
        Err(format!(
            "`{}` is not an index name: {NAME_RULE}",
            escape(text)
        ))
    }
}

impl fmt::Display for IndexName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The URL of a simple index: http or https, without credentials, query or fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexUrl(Url);

impl IndexUrl {
    pub fn as_url(&self) -> &Url {
        &self.0
    }

    /// Parse an index URL for index `name` (named in the errors). Credentials are refused
    /// before anything else is said, and no error repeats a password: each shows the URL
    /// through [`masked`].
    fn parse(text: &str, name: &IndexName) -> Result<Self, String> {
        let shown = masked(text);
        let url = Url::parse(text).map_err(|error| {
            format!(
                "index `{name}`: `{shown}` is not a URL ({error}); write the simple index's address, such as `https://pypi.internal.example/simple`"
            )
        })?;
        if !url.username().is_empty() || url.password().is_some() {
            let mut bare = url.clone();
            let _ = bare.set_username("");
            let _ = bare.set_password(None);
            let key = name.env_key();
            return Err(format!(
                "index `{name}`: the URL carries credentials (`user:password@`); the recipe's URLs are written into its digest and the lock, so the credentials would be too; write `url: \"{}\"` and give the credentials as CUDASTACK_INDEX_{key}_USERNAME and CUDASTACK_INDEX_{key}_PASSWORD (with CUDASTACK_INDEX_{key}_URL set to that URL), in ~/.netrc (or $NETRC) as `machine {} login USER password PASSWORD`, or through `keyring` with CUDASTACK_KEYRING_PROVIDER=subprocess (docs/recipe-indexes.md)",
                masked(bare.as_str()),
                bare.host_str().unwrap_or_default()
            ));
        }
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "index `{name}`: `{shown}` has scheme `{}`; an index is read over https (or http)",
                escape(url.scheme())
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "index `{name}`: `{shown}` has a query or fragment; a simple index is a plain path, such as `https://pypi.internal.example/simple`"
            ));
        }
        Ok(IndexUrl(url))
    }
}

/// `text` as an error may show it: escaped, its userinfo, query and fragment replaced by
/// `****`.
/// Read from the text, not from a parsed URL, because a text the URL parser refuses or
/// reads another way (`bob:s3cret@host/simple` has the scheme `bob`) still holds the
/// secret. The userinfo is all before the last `@` ahead of any `?` or `#` (a password
/// may hold an unencoded `/` or `@`), masked whole: a user name alone is often a token.
pub(super) fn masked(text: &str) -> String {
    let scheme = |at: &usize| {
        text[..*at]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    };
    let start = text.find("://").filter(scheme).map_or(0, |at| at + 3);
    let (head, tail) = text.split_at(start);
    let end = tail.find(['?', '#']).unwrap_or(tail.len());
    let rest = match tail[..end].rfind('@') {
        Some(at) => format!("****@{}", &tail[at + 1..]),
        None => tail.to_string(),
    };
    let rest = match rest.find(['?', '#']) {
        Some(at) => format!("{}****", &rest[..=at]),
        None => rest,
    };
    escape(&format!("{head}{rest}"))
}

/// `text` (a requirement, or a message that quotes one) with every word that holds a URL
/// or a user name (`://` or `@`) shown through [`masked`]: `acme @
/// https://bob:token@host/acme.whl` must not put the token into an error.
pub(crate) fn masked_urls(text: &str) -> String {
    text.split_inclusive(char::is_whitespace)
        .map(|piece| {
            let word = piece.trim_end_matches(char::is_whitespace);
            let space = &piece[word.len()..];
            if word.contains("://") || (word.contains('@') && word != "@") {
                format!("{}{space}", masked(word))
            } else {
                piece.to_string()
            }
        })
        .collect()
}

impl fmt::Display for IndexUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

/// One entry of `indexes:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageIndex {
    pub name: IndexName,
    pub url: IndexUrl,
    /// Distributions taken from this index only, never looked up anywhere else (dependency
    /// confusion: a public package of the same name cannot replace them). Sorted.
    pub packages: Vec<PackageName>,
}

/// The entry as written, before its fields are parsed together (the URL's errors name the
/// index).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIndex {
    name: String,
    url: String,
    #[serde(default)]
    packages: Vec<String>,
}

impl TryFrom<RawIndex> for PackageIndex {
    type Error = String;
    fn try_from(raw: RawIndex) -> Result<Self, String> {
        let name: IndexName = raw.name.parse()?;
        let url = IndexUrl::parse(&raw.url, &name)?;
        let mut packages = Vec::new();
        for text in &raw.packages {
            let package = PackageName::from_str(text).map_err(|error| {
                format!(
                    "index `{name}`: `{}` in `packages` is not a package name ({error})",
                    escape(text)
                )
            })?;
            if packages.contains(&package) {
                return Err(format!(
                    "index `{name}`: `{package}` is listed twice in `packages`"
                ));
            }
            packages.push(package);
        }
        packages.sort();
        Ok(PackageIndex {
            name,
            url,
            packages,
        })
    }
}

impl Serialize for PackageIndex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("name", self.name.as_str())?;
        map.serialize_entry("url", self.url.as_url().as_str())?;
        if !self.packages.is_empty() {
            let packages: Vec<&str> = self.packages.iter().map(|p| p.as_ref()).collect();
            map.serialize_entry("packages", &packages)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PackageIndex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawIndex::deserialize(deserializer)?;
        PackageIndex::try_from(raw).map_err(serde::de::Error::custom)
    }
}

/// Read `indexes:`: names and URLs unique, each package pinned to one index at most. The
/// order is kept: packages not pinned are looked up index by index in this order.
pub(super) fn deserialize_list<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<PackageIndex>, D::Error> {
    let indexes = Vec::<PackageIndex>::deserialize(deserializer)?;
    check_list(&indexes).map_err(serde::de::Error::custom)?;
    Ok(indexes)
}

fn check_list(indexes: &[PackageIndex]) -> Result<(), String> {
    let mut pinned: BTreeMap<&PackageName, &IndexName> = BTreeMap::new();
    for (i, index) in indexes.iter().enumerate() {
        for earlier in &indexes[..i] {
            if earlier.name == index.name {
                return Err(format!(
                    "index name `{}` is used twice; give each index its own name",
                    index.name
                ));
            }
            if same_index(earlier.url.as_url(), index.url.as_url()) {
                return Err(format!(
                    "indexes `{}` and `{}` have the same URL `{}`; keep one",
                    earlier.name, index.name, index.url
                ));
            }
        }
        for package in &index.packages {
            if let Some(other) = pinned.insert(package, &index.name) {
                return Err(format!(
                    "package `{package}` is pinned to index `{other}` and to index `{}`; a package comes from one index",
                    index.name
                ));
            }
        }
    }
    Ok(())
}

/// Two URLs of one index (`.../simple` and `.../simple/`).
fn same_index(a: &Url, b: &Url) -> bool {
    a.as_str().trim_end_matches('/') == b.as_str().trim_end_matches('/')
}

/// The index `package` is pinned to, if any.
pub fn pinned_index<'a>(
    indexes: &'a [PackageIndex],
    package: &PackageName,
) -> Option<&'a PackageIndex> {
    indexes
        .iter()
        .find(|index| index.packages.contains(package))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Vec<PackageIndex>, String> {
        #[derive(Deserialize, Debug)]
        struct Holder {
            #[serde(deserialize_with = "deserialize_list")]
            indexes: Vec<PackageIndex>,
        }
        serde_saphyr::from_str::<Holder>(yaml)
            .map(|h| h.indexes)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_names_urls_and_pins() {
        let indexes = parse(
            "indexes:\n  - { name: internal, url: \"https://pypi.internal.example/simple\", packages: [Acme_Tokenizer, acme-core] }\n  - { name: extra-2, url: \"http://127.0.0.1:8080/simple/\" }\n",
        )
        .unwrap();
        assert_eq!(indexes[0].name.as_str(), "internal");
        assert_eq!(indexes[0].name.env_key(), "INTERNAL");
        assert_eq!(indexes[1].name.env_key(), "EXTRA_2");
        let pins: Vec<String> = indexes[0].packages.iter().map(|p| p.to_string()).collect();
        assert_eq!(pins, ["acme-core", "acme-tokenizer"]);
        let acme = PackageName::from_str("acme.tokenizer").unwrap();
        assert_eq!(
            pinned_index(&indexes, &acme).unwrap().name.as_str(),
            "internal"
        );
        assert!(pinned_index(&indexes, &PackageName::from_str("numpy").unwrap()).is_none());
        let json = serde_json::to_string(&indexes).unwrap();
        assert_eq!(
            json,
            r#"[{"name":"internal","url":"https://pypi.internal.example/simple","packages":["acme-core","acme-tokenizer"]},{"name":"extra-2","url":"http://127.0.0.1:8080/simple/"}]"#
        );
    }

    #[test]
    fn credentials_in_the_url_are_refused_with_the_ways_to_give_them() {
        let recipe = "name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\nindexes: [{ name: acme-internal, url: \"https://bob:s3cret@pypi.internal.example/simple\" }]\n";
        let error = crate::recipe::Recipe::parse(recipe, std::path::Path::new("t.yaml"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("carries credentials"), "{error}");
        assert!(
            error.contains("CUDASTACK_INDEX_ACME_INTERNAL_USERNAME"),
            "{error}"
        );
        assert!(
            error.contains("netrc") && error.contains("keyring"),
            "{error}"
        );
        assert!(
            !error.contains("s3cret"),
            "the error repeats the password: {error}"
        );
        // A user name alone is refused too: it would be written into the lock.
        let error =
            parse("indexes: [{ name: a, url: \"https://bob@pypi.internal.example/simple\" }]\n")
                .unwrap_err();
        assert!(error.contains("carries credentials"), "{error}");
    }

    /// No recipe error repeats a password, whatever else is wrong with the URL: credentials
    /// are refused first, and every other message shows the URL masked.
    #[test]
    fn no_error_repeats_a_password() {
        for (url, says) in [
            ("ftp://bob:s3cret@h.example/simple", "carries credentials"),
            (
                "https://bob:s3cret@h.example/simple?x=1",
                "carries credentials",
            ),
            ("https://s3cret@h.example/simple", "carries credentials"),
            (
                "bob:s3cret@h.example/simple",
                "`****@h.example/simple` has scheme `bob`",
            ),
            (
                "https://bob:s3cret@[::1/simple",
                "`https://****@[::1/simple` is not a URL",
            ),
            (
                "https://bob:s3/cret@h.example/simple",
                "`https://****@h.example/simple` is not a URL",
            ),
            (
                "https://bob:s3@cret@h.example:x/simple",
                "`https://****@h.example:x/simple` is not a URL",
            ),
            (
                "bob:s3cret@h/x?u=http://y",
                "`****@h/x?****` has scheme `bob`",
            ),
            (
                "https://h.example/simple?token=s3cret",
                "`https://h.example/simple?****` has a query",
            ),
            (
                "https://h.example/simple#s3cret",
                "`https://h.example/simple#****` has a query",
            ),
        ] {
            let recipe = format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\nindexes: [{{ name: a, url: \"{url}\" }}]\n");
            let error = crate::recipe::Recipe::parse(&recipe, std::path::Path::new("t.yaml"))
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{url}: expected `{says}` in {error}");
            assert!(
                !error.contains("s3"),
                "{url}: the error repeats the password: {error}"
            );
        }
        assert_eq!(
            masked("https://h.example/simple"),
            "https://h.example/simple"
        );
        assert_eq!(masked("a\nb@c"), "****@c");
        // Each URL of a requirement or a message that quotes one.
        assert_eq!(
            masked_urls("`acme @ https://bob:s3cret@h.example/a.whl ; os_name ==`\n  ^^^"),
            "`acme @ https://****@h.example/a.whl ; os_name ==`\n  ^^^"
        );
        assert_eq!(
            masked_urls("acme@https://bob:s3cret@h/a.whl"),
            "****@h/a.whl"
        );
        assert_eq!(
            masked_urls("a @ https://h/a.whl?token=s3cret x"),
            "a @ https://h/a.whl?**** x"
        );
        assert_eq!(masked_urls("numpy==1.26.4"), "numpy==1.26.4");
        assert_eq!(masked("x\ny"), "x\\ny");
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (yaml, says) in [
            ("[{ name: Internal, url: \"https://a.example/simple\" }]", "is not an index name"),
            ("[{ name: \"in ternal\", url: \"https://a.example/simple\" }]", "is not an index name"),
            ("[{ name: a, url: \"ftp://a.example/simple\" }]", "has scheme `ftp`"),
            ("[{ name: a, url: \"a.example/simple\" }]", "is not a URL"),
            ("[{ name: a, url: \"https://a.example/simple?x=1\" }]", "query or fragment"),
            ("[{ name: a, url: \"https://a.example/simple\", packages: [\"acme tokenizer\"] }]", "is not a package name"),
            ("[{ name: a, url: \"https://a.example/simple\", packages: [x, X] }]", "listed twice"),
            ("[{ name: a, url: \"https://a.example/simple\" }, { name: a, url: \"https://b.example/simple\" }]", "used twice"),
            ("[{ name: a, url: \"https://a.example/simple\" }, { name: b, url: \"https://a.example/simple/\" }]", "the same URL"),
            ("[{ name: a, url: \"https://a.example/simple\", packages: [x] }, { name: b, url: \"https://b.example/simple\", packages: [x] }]", "pinned to index `a` and to index `b`"),
            ("[{ name: a, url: \"https://a.example/simple\", user: x }]", "unknown field"),
        ] {
            let error = parse(&format!("indexes: {yaml}\n")).unwrap_err();
            assert!(error.contains(says), "{yaml}: {error}");
        }
    }
}
