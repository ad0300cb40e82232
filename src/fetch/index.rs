//! Package indexes speaking the simple repository API: PyPI's PEP 691 JSON form and the
//! PEP 503 HTML form used by extra indexes such as `https://download.pytorch.org/whl/cu124`.
//!
//! One [`SimpleIndex`] asks for JSON first (`Accept: application/vnd.pypi.simple.v1+json`,
//! HTML as a low-priority fallback) and parses whichever the server sends, so the rest of
//! cudastack sees one [`ProjectPage`] type: every file with its URL, sha256, size (when the
//! index publishes it), `Requires-Python`, yank status, upload time and whether a PEP 658 /
//! PEP 714 core-metadata file sits next to it. This module only reads listings; choosing a
//! file is the resolver's job ([`crate::lock`]) and downloading it the downloader's.

use std::collections::BTreeMap;
use std::str::FromStr;

use pep440_rs::VersionSpecifiers;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::Url;
use serde::Deserialize;

use crate::digest::{Digest, DigestError};
use crate::fetch::file_name::{FileName, FileNameError};
use crate::fetch::html;
use crate::fetch::http::{redacted, HttpClient, HttpError};
use crate::names::{PackageName, WheelFilename};

/// The `Accept` header for PEP 691 content negotiation: JSON preferred, HTML accepted.
pub const SIMPLE_ACCEPT: &str =
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01";

/// PyPI's simple index.
pub const PYPI_SIMPLE_URL: &str = "https://pypi.org/simple/";

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("Failed to parse the PEP 691 JSON index page `{}`", redacted(url))]
    Json {
        url: Url,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "Index page `{}` lists `{filename}` with an unusable sha256",
        redacted(url)
    )]
    BadDigest {
        url: Url,
        filename: String,
        #[source]
        source: DigestError,
    },
    #[error(
        "Index page `{}` links to `{href}`, which is not a valid URL",
        redacted(url)
    )]
    BadHref {
        url: Url,
        href: String,
        #[source]
        source: url::ParseError,
    },
    #[error(
        "Index page `{}` lists a file name that cudastack will not use",
        redacted(url)
    )]
    BadFileName {
        url: Url,
        #[source]
        source: FileNameError,
    },
    #[error(
        "Index page `{}` links to `{}`; an index may link only to http and https files",
        redacted(url),
        redacted(href)
    )]
    BadScheme { url: Url, href: Url },
    #[error(
        "Index page `{}` is neither PEP 691 JSON nor PEP 503 HTML (Content-Type `{content_type}`)",
        redacted(url)
    )]
    UnknownFormat { url: Url, content_type: String },
}

/// Whether a PEP 658 core-metadata file (`<file url>.metadata`) is served for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CoreMetadata {
    #[default]
    Absent,
    /// Present; `sha256` is the hash of the `.metadata` file when the index gave one.
    Present { sha256: Option<Digest> },
}

/// One file of a project as listed by an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistFile {
    /// A plain file name (checked when the page is parsed: no separators, no `..`).
    pub filename: FileName,
    pub url: Url,
    pub sha256: Option<Digest>,
    /// Size in bytes (PEP 700; JSON indexes only).
    pub size: Option<u64>,
    /// `Requires-Python` as published; `None` when absent or unparsable (PEP 440 says to
    /// ignore an invalid value rather than reject the file).
    pub requires_python: Option<VersionSpecifiers>,
    pub yanked: bool,
    pub yanked_reason: Option<String>,
    /// When the index says the file was uploaded (PEP 700 `upload-time`, or the
    /// `data-upload-time` attribute PyTorch's HTML index adds), as published.
    pub upload_time: Option<String>,
    pub core_metadata: CoreMetadata,
}

impl DistFile {
    /// The parsed wheel name, or `None` for sdists and unknown files.
    pub fn wheel(&self) -> Option<WheelFilename> {
        WheelFilename::from_str(&self.filename).ok()
    }

    /// The upload time, parsed; None when the index gives none or an unreadable one.
    pub fn uploaded_at(&self) -> Option<jiff::Timestamp> {
        self.upload_time.as_deref()?.parse().ok()
    }

    /// The PEP 658 metadata URL: the file URL with `.metadata` appended to its path.
    pub fn metadata_url(&self) -> Url {
        let mut url = self.url.clone();
        url.set_fragment(None);
        let path = format!("{}.metadata", url.path());
        url.set_path(&path);
        url
    }
}

/// Everything an index lists for one project.
#[derive(Debug, Clone)]
pub struct ProjectPage {
    pub name: PackageName,
    /// The page the listing came from (for error messages and lock provenance).
    pub url: Url,
    pub files: Vec<DistFile>,
}

impl ProjectPage {
    /// The wheels of this project on the page, parsed. Files that are not wheels, and
    /// wheels of another project (a page for `torch` listing `evil-1.0-...whl`), are skipped.
    pub fn wheels(&self) -> impl Iterator<Item = (WheelFilename, &DistFile)> {
        self.files.iter().filter_map(|file| {
            let wheel = file.wheel()?;
            if wheel.name != self.name {
                tracing::debug!(page = %self.url, filename = %file.filename, "skipping a wheel of another project");
                return None;
            }
            Some((wheel, file))
        })
    }
}

/// A simple-API index rooted at a base URL (`https://pypi.org/simple/`).
#[derive(Debug, Clone)]
pub struct SimpleIndex {
    client: HttpClient,
    base: Url,
}

impl SimpleIndex {
    pub fn new(client: HttpClient, mut base: Url) -> Self {
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        SimpleIndex { client, base }
    }

    /// PyPI's simple index.
    pub fn pypi(client: HttpClient) -> Self {
        Self::new(client, Url::parse(PYPI_SIMPLE_URL).expect("constant URL"))
    }

    pub fn base(&self) -> &Url {
        &self.base
    }

    pub fn client(&self) -> &HttpClient {
        &self.client
    }

    /// The page URL for a project: `<base>/<normalised name>/`.
    pub fn project_url(&self, name: &PackageName) -> Url {
        self.base
            .join(&format!("{name}/"))
            .expect("a normalised package name is a valid path segment")
    }

    /// Fetch and parse the listing of one project. A project the index does not have is
    /// [`HttpError::NotFound`] with the page URL.
    pub async fn project(&self, name: &PackageName) -> Result<ProjectPage, IndexError> {
        let url = self.project_url(name);
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(SIMPLE_ACCEPT));
        let (response_headers, body) = self.client.get_bytes_with_headers(&url, headers).await?;
        let content_type = response_headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let files = if content_type.contains("json") {
            parse_json(&url, &body)?
        } else if content_type.contains("html") {
            parse_html(&url, &String::from_utf8_lossy(&body))?
        } else if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
            parse_json(&url, &body)?
        } else if body.windows(2).any(|w| w.eq_ignore_ascii_case(b"<a")) {
            parse_html(&url, &String::from_utf8_lossy(&body))?
        } else {
            return Err(IndexError::UnknownFormat { url, content_type });
        };
        Ok(ProjectPage {
            name: name.clone(),
            url,
            files,
        })
    }
}

#[derive(Deserialize)]
struct JsonPage {
    files: Vec<JsonFile>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BoolOrString {
    Bool(bool),
    String(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BoolOrHashes {
    Bool(bool),
    Hashes(BTreeMap<String, String>),
}

#[derive(Deserialize)]
struct JsonFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: BTreeMap<String, String>,
    #[serde(rename = "requires-python")]
    requires_python: Option<String>,
    size: Option<u64>,
    #[serde(rename = "upload-time")]
    upload_time: Option<String>,
    yanked: Option<BoolOrString>,
    #[serde(rename = "core-metadata")]
    core_metadata: Option<BoolOrHashes>,
    /// The PEP 658 name, kept by PEP 714 for compatibility.
    #[serde(rename = "dist-info-metadata")]
    dist_info_metadata: Option<BoolOrHashes>,
}

fn parse_requires_python(value: Option<&str>, filename: &str) -> Option<VersionSpecifiers> {
    let value = value?.trim();
    if value.is_empty() {
        return None;
    }
    match VersionSpecifiers::from_str(value) {
        Ok(specifiers) => Some(specifiers),
        Err(error) => {
            tracing::debug!(filename, value, %error, "ignoring unparsable Requires-Python");
            None
        }
    }
}

/// Resolve a file's link against its page. A page served over HTTP may link only to HTTP
/// files: a `file:` link would make `lock` read (and hash into the lock) a local file the
/// index chose. A user name or password in the link is dropped: the URL goes into the lock,
/// and the index's credentials come from the environment, netrc or keyring (some private
/// indexes echo the credentials of the request into their links).
fn file_url(page: &Url, href: &str) -> Result<Url, IndexError> {
    let mut url = page.join(href).map_err(|source| IndexError::BadHref {
        url: page.clone(),
        href: href.to_string(),
        source,
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(IndexError::BadScheme {
            url: page.clone(),
            href: url,
        });
    }
    if !url.username().is_empty() || url.password().is_some() {
        let _ = url.set_username("");
        let _ = url.set_password(None);
    }
    Ok(url)
}

fn file_name(page: &Url, name: String) -> Result<FileName, IndexError> {
    FileName::new(name).map_err(|source| IndexError::BadFileName {
        url: page.clone(),
        source,
    })
}

fn parse_digest(page: &Url, filename: &str, hex: &str) -> Result<Digest, IndexError> {
    Digest::from_hex(hex).map_err(|source| IndexError::BadDigest {
        url: page.clone(),
        filename: filename.to_string(),
        source,
    })
}

/// Parse a PEP 691 JSON project page. Relative file URLs are resolved against `page`.
pub fn parse_json(page: &Url, body: &[u8]) -> Result<Vec<DistFile>, IndexError> {
    let parsed: JsonPage = serde_json::from_slice(body).map_err(|source| IndexError::Json {
        url: page.clone(),
        source,
    })?;
    parsed
        .files
        .into_iter()
        .map(|file| {
            let url = file_url(page, &file.url)?;
            let filename = file_name(page, file.filename)?;
            let sha256 = file
                .hashes
                .get("sha256")
                .map(|hex| parse_digest(page, &filename, hex))
                .transpose()?;
            let (yanked, yanked_reason) = match file.yanked {
                None | Some(BoolOrString::Bool(false)) => (false, None),
                Some(BoolOrString::Bool(true)) => (true, None),
                Some(BoolOrString::String(reason)) => (true, Some(reason)),
            };
            let core_metadata = match file.core_metadata.or(file.dist_info_metadata) {
                None | Some(BoolOrHashes::Bool(false)) => CoreMetadata::Absent,
                Some(BoolOrHashes::Bool(true)) => CoreMetadata::Present { sha256: None },
                Some(BoolOrHashes::Hashes(hashes)) => CoreMetadata::Present {
                    sha256: hashes
                        .get("sha256")
                        .map(|hex| parse_digest(page, &filename, hex))
                        .transpose()?,
                },
            };
            Ok(DistFile {
                requires_python: parse_requires_python(file.requires_python.as_deref(), &filename),
                filename,
                url,
                sha256,
                size: file.size,
                yanked,
                yanked_reason,
                upload_time: file.upload_time,
                core_metadata,
            })
        })
        .collect()
}

/// Parse a PEP 503 HTML project page: one anchor per file, the sha256 in the URL fragment,
/// `data-requires-python`, `data-yanked`, and `data-core-metadata` (PEP 714) or
/// `data-dist-info-metadata` (PEP 658) as `true` or `sha256=<hex>`.
pub fn parse_html(page: &Url, body: &str) -> Result<Vec<DistFile>, IndexError> {
    let mut files = Vec::new();
    for anchor in html::anchors(body) {
        let Some(href) = anchor.attribute("href") else {
            continue;
        };
        let mut url = file_url(page, href)?;
        let filename = url
            .path_segments()
            .and_then(|mut segments| segments.next_back().map(str::to_string))
            .map(|segment| percent_decode(&segment))
            .unwrap_or_default();
        if filename.is_empty() {
            continue;
        }
        let filename = file_name(page, filename)?;
        let mut sha256 = None;
        if let Some(fragment) = url.fragment() {
            if let Some(hex) = fragment.strip_prefix("sha256=") {
                sha256 = Some(parse_digest(page, &filename, hex)?);
            }
        }
        url.set_fragment(None);
        let core_metadata = match anchor
            .attribute("data-core-metadata")
            .or_else(|| anchor.attribute("data-dist-info-metadata"))
        {
            None | Some("false") => CoreMetadata::Absent,
            Some(value) => CoreMetadata::Present {
                sha256: value
                    .strip_prefix("sha256=")
                    .map(|hex| parse_digest(page, &filename, hex))
                    .transpose()?,
            },
        };
        let yanked_attribute = anchor.attribute("data-yanked");
        files.push(DistFile {
            requires_python: parse_requires_python(
                anchor.attribute("data-requires-python"),
                &filename,
            ),
            url,
            sha256,
            size: None,
            yanked: yanked_attribute.is_some(),
            yanked_reason: yanked_attribute
                .filter(|reason| !reason.is_empty())
                .map(str::to_string),
            // Not in PEP 503: PyTorch's index and uv's mirrors publish it.
            upload_time: anchor.attribute("data-upload-time").map(str::to_string),
            core_metadata,
            filename,
        });
    }
    Ok(files)
}

/// Decode `%XX` escapes in a URL path segment (`torch-2.4.1%2Bcu124-...whl`).
fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(value) = u8::from_str_radix(&segment[i + 1..i + 3], 16) {
                out.push(value);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0000000000000000000000000000000000000000000000000000000000000abc";

    /// A link with `user:password@` (an index echoing the request's credentials)
    /// is locked without them.
    #[test]
    fn credentials_in_file_links_are_dropped() {
        let page = Url::parse("https://pypi.internal.example/simple/acme/").unwrap();
        let json = format!(
            r#"{{"files":[{{"filename":"acme-1.0-py3-none-any.whl","url":"https://bob:s3cret@pypi.internal.example/packages/acme-1.0-py3-none-any.whl","hashes":{{"sha256":"{HEX}"}}}}]}}"#
        );
        let files = parse_json(&page, json.as_bytes()).unwrap();
        assert_eq!(
            files[0].url.as_str(),
            "https://pypi.internal.example/packages/acme-1.0-py3-none-any.whl"
        );
        let html = format!("<a href=\"https://tok3n@pypi.internal.example/packages/acme-1.0-py3-none-any.whl#sha256={HEX}\">acme</a>");
        let files = parse_html(&page, &html).unwrap();
        assert!(!files[0].url.as_str().contains("tok3n"), "{}", files[0].url);
    }

    #[test]
    fn parses_pep691_json() {
        let page = Url::parse("https://pypi.org/simple/idna/").unwrap();
        let body = format!(
            r#"{{"meta":{{"api-version":"1.1"}},"name":"idna","files":[
            {{"filename":"idna-3.7-py3-none-any.whl","url":"https://files.example/idna-3.7-py3-none-any.whl",
              "hashes":{{"sha256":"{HEX}"}},"requires-python":">=3.5","size":66836,
              "upload-time":"2024-04-11T03:34:43.276066Z","yanked":false,
              "core-metadata":{{"sha256":"{HEX}"}},"data-dist-info-metadata":{{"sha256":"{HEX}"}}}},
            {{"filename":"idna-3.6.tar.gz","url":"../../packages/idna-3.6.tar.gz","hashes":{{}},
              "yanked":"broken build","core-metadata":false}}]}}"#
        );
        let files = parse_json(&page, body.as_bytes()).unwrap();
        assert_eq!(files.len(), 2);
        let wheel = &files[0];
        assert_eq!(wheel.sha256, Some(Digest::from_hex(HEX).unwrap()));
        assert_eq!(wheel.size, Some(66836));
        assert!(!wheel.yanked);
        assert_eq!(
            wheel.core_metadata,
            CoreMetadata::Present {
                sha256: Some(Digest::from_hex(HEX).unwrap())
            }
        );
        assert!(wheel
            .requires_python
            .as_ref()
            .unwrap()
            .contains(&"3.11".parse().unwrap()));
        assert_eq!(
            wheel.metadata_url().as_str(),
            "https://files.example/idna-3.7-py3-none-any.whl.metadata"
        );
        let sdist = &files[1];
        assert_eq!(
            sdist.url.as_str(),
            "https://pypi.org/packages/idna-3.6.tar.gz"
        );
        assert!(sdist.yanked);
        assert_eq!(sdist.yanked_reason.as_deref(), Some("broken build"));
        assert_eq!(sdist.core_metadata, CoreMetadata::Absent);
        assert!(sdist.wheel().is_none());
    }

    #[test]
    fn parses_pytorch_style_html() {
        let page = Url::parse("https://download.pytorch.org/whl/cu124/torch/").unwrap();
        let body = format!(
            r#"<!DOCTYPE html><html><body><h1>Links for torch</h1>
<a href="/whl/cu124/torch-2.4.1%2Bcu124-cp311-cp311-linux_x86_64.whl#sha256={HEX}" data-requires-python="&gt;=3.8.0" data-dist-info-metadata="sha256={HEX}">torch-2.4.1+cu124-cp311-cp311-linux_x86_64.whl</a><br/>
<A HREF='torch-2.4.0-cp311-none-macosx_11_0_arm64.whl' data-yanked="">x</A>
<a href="torch-2.3.0-cp311-cp311-win_amd64.whl#sha256={HEX}" data-core-metadata="true" data-yanked="bad &amp; broken">y</a>
</body></html>"#
        );
        let files = parse_html(&page, &body).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            files[0].filename,
            "torch-2.4.1+cu124-cp311-cp311-linux_x86_64.whl"
        );
        assert_eq!(
            files[0].url.as_str(),
            "https://download.pytorch.org/whl/cu124/torch-2.4.1%2Bcu124-cp311-cp311-linux_x86_64.whl"
        );
        assert_eq!(files[0].sha256, Some(Digest::from_hex(HEX).unwrap()));
        assert!(!files[0]
            .requires_python
            .as_ref()
            .unwrap()
            .contains(&"3.7".parse().unwrap()));
        assert!(matches!(
            files[0].core_metadata,
            CoreMetadata::Present { sha256: Some(_) }
        ));
        assert_eq!(files[0].wheel().unwrap().version.to_string(), "2.4.1+cu124");
        assert_eq!(
            files[1].url.as_str(),
            "https://download.pytorch.org/whl/cu124/torch/torch-2.4.0-cp311-none-macosx_11_0_arm64.whl"
        );
        assert!(files[1].yanked);
        assert_eq!(files[1].yanked_reason, None);
        assert_eq!(files[1].sha256, None);
        assert_eq!(
            files[2].core_metadata,
            CoreMetadata::Present { sha256: None }
        );
        assert_eq!(files[2].yanked_reason.as_deref(), Some("bad & broken"));
    }

    #[test]
    fn bad_hash_in_html_names_the_file() {
        let page = Url::parse("http://127.0.0.1/simple/x/").unwrap();
        let error =
            parse_html(&page, r#"<a href="x-1-py3-none-any.whl#sha256=zz">x</a>"#).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("x-1-py3-none-any.whl"), "{message}");
        assert!(message.contains("http://127.0.0.1/simple/x/"), "{message}");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Bb"), "a+b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("x%zz"), "x%zz");
    }

    /// Names from an index become paths; a page cannot smuggle in a separator.
    #[test]
    fn file_names_that_are_paths_refuse_the_page() {
        let page = Url::parse("https://pypi.org/simple/torch/").unwrap();
        for name in ["../../x.whl", "/tmp/x", "a/b.whl", ".."] {
            let body = format!(
                r#"{{"files":[{{"filename":"{name}","url":"https://files.example/x","hashes":{{}}}}]}}"#
            );
            let error = parse_json(&page, body.as_bytes()).unwrap_err();
            assert!(
                matches!(error, IndexError::BadFileName { .. }),
                "{name}: {error}"
            );
        }
        // In HTML the name is the last path segment: `%2F` must not decode into a path.
        let html = r#"<a href="https://files.example/..%2F..%2Fetc%2Fx.whl">x</a>"#;
        let error = parse_html(&page, html).unwrap_err();
        assert!(matches!(error, IndexError::BadFileName { .. }), "{error}");
    }

    /// An index page linking to `file:` would make `lock` hash local files into the lock.
    #[test]
    fn links_to_local_files_refuse_the_page() {
        let page = Url::parse("https://pypi.org/simple/torch/").unwrap();
        let html = r#"<a href="file:///etc/shadow#sha256=00">torch-1.0-py3-none-any.whl</a>"#;
        let error = parse_html(&page, html).unwrap_err();
        assert!(error.to_string().contains("file:///etc/shadow"), "{error}");
        let json = r#"{"files":[{"filename":"torch-1.0-py3-none-any.whl","url":"file:///etc/shadow","hashes":{}}]}"#;
        let error = parse_json(&page, json.as_bytes()).unwrap_err();
        assert!(matches!(error, IndexError::BadScheme { .. }), "{error}");
    }

    #[test]
    fn wheels_of_other_projects_are_not_offered() {
        let url = Url::parse("https://pypi.org/simple/torch/").unwrap();
        let json = r#"{"files":[
            {"filename":"torch-1.0-py3-none-any.whl","url":"https://f.example/a","hashes":{}},
            {"filename":"evil-1.0-py3-none-any.whl","url":"https://f.example/b","hashes":{}}]}"#;
        let page = ProjectPage {
            name: "torch".parse().unwrap(),
            files: parse_json(&url, json.as_bytes()).unwrap(),
            url,
        };
        let names: Vec<String> = page.wheels().map(|(w, _)| w.name.to_string()).collect();
        assert_eq!(names, ["torch"]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Whatever a page says, every file name parsed from it is one plain component.
        #[test]
        fn parsed_names_are_plain(name in "[a-z./%2F\\\\]{0,12}", href in "[a-z./%2F:]{0,16}") {
            let page = Url::parse("https://pypi.org/simple/torch/").unwrap();
            let json = serde_json::json!({"files": [{"filename": name, "url": href, "hashes": {}}]});
            if let Ok(files) = parse_json(&page, json.to_string().as_bytes()) {
                for file in files {
                    proptest::prop_assert_eq!(file.filename.as_path().components().count(), 1);
                    proptest::prop_assert!(matches!(file.url.scheme(), "http" | "https"));
                }
            }
            let html = format!("<a href=\"{href}{name}\">x</a>");
            if let Ok(files) = parse_html(&page, &html) {
                for file in files {
                    proptest::prop_assert_eq!(file.filename.as_path().components().count(), 1);
                }
            }
        }
    }
}
