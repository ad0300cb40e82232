//! A small, forgiving reader of `<a ...>` elements for PEP 503 pages.
//!
//! PEP 503 pages are machine-written lists of anchors; a full HTML parser would be a large
//! dependency for one element type. This reader finds `<a` start tags (any case), reads
//! their attributes (double-, single- or un-quoted, names lower-cased) and decodes the
//! character references PyPI-style indexes emit (`&gt;`, `&amp;`, `&#62;`, `&#x3e;`). It
//! never fails: malformed markup yields fewer anchors, not an error.

/// One anchor start tag and its attributes, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    attributes: Vec<(String, String)>,
}

impl Anchor {
    /// The decoded value of an attribute (`Some("")` for a bare attribute like `data-yanked`).
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Every `<a>` start tag in `body`.
pub fn anchors(body: &str) -> Vec<Anchor> {
    let bytes = body.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 <= bytes.len() {
        if bytes[i] == b'<'
            && bytes[i + 1].eq_ignore_ascii_case(&b'a')
            && bytes
                .get(i + 2)
                .is_some_and(|b| b.is_ascii_whitespace() || *b == b'>' || *b == b'/')
        {
            let (anchor, end) = parse_tag(body, i + 2);
            out.push(anchor);
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// Parse attributes from `start` to the closing `>`; returns the anchor and the index after it.
fn parse_tag(body: &str, start: usize) -> (Anchor, usize) {
    let bytes = body.as_bytes();
    let mut attributes = Vec::new();
    let mut i = start;
    loop {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b'/') {
            i += 1;
        }
        if i >= bytes.len() {
            return (Anchor { attributes }, i);
        }
        if bytes[i] == b'>' {
            return (Anchor { attributes }, i + 1);
        }
        let name_start = i;
        while i < bytes.len()
            && !bytes[i].is_ascii_whitespace()
            && !matches!(bytes[i], b'=' | b'>' | b'/')
        {
            i += 1;
        }
        let name = body[name_start..i].to_ascii_lowercase();
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if i < bytes.len() && bytes[i] == b'=' {
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < bytes.len() && (bytes[i] == b'"' || bytes[i] == b'\'') {
                let quote = bytes[i];
                let value_start = i + 1;
                let value_end = body[value_start..]
                    .bytes()
                    .position(|b| b == quote)
                    .map_or(bytes.len(), |offset| value_start + offset);
                value = decode_entities(&body[value_start..value_end]);
                i = (value_end + 1).min(bytes.len());
            } else {
                let value_start = i;
                while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'>' {
                    i += 1;
                }
                value = decode_entities(&body[value_start..i]);
            }
        }
        if !name.is_empty() {
            attributes.push((name, value));
        }
    }
}

/// Decode the character references that appear in index attributes.
pub fn decode_entities(text: &str) -> String {
    if !text.contains('&') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let decoded = after.find(';').and_then(|semi| {
            let entity = &after[..semi];
            let ch = match entity {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                _ => {
                    if let Some(hex) = entity
                        .strip_prefix("#x")
                        .or_else(|| entity.strip_prefix("#X"))
                    {
                        u32::from_str_radix(hex, 16).ok().and_then(char::from_u32)
                    } else if let Some(dec) = entity.strip_prefix('#') {
                        dec.parse().ok().and_then(char::from_u32)
                    } else {
                        None
                    }
                }
            };
            ch.map(|ch| (ch, semi))
        });
        match decoded {
            Some((ch, semi)) => {
                out.push(ch);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_attributes_in_all_quoting_styles() {
        let found = anchors(
            r#"<html><a href="a.whl" data-x='1 2' data-y=bare data-flag>a</a><abbr>no</abbr><A
            HREF = "b.whl">b</A><a>c</a>"#,
        );
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].attribute("href"), Some("a.whl"));
        assert_eq!(found[0].attribute("data-x"), Some("1 2"));
        assert_eq!(found[0].attribute("data-y"), Some("bare"));
        assert_eq!(found[0].attribute("data-flag"), Some(""));
        assert_eq!(found[1].attribute("href"), Some("b.whl"));
        assert_eq!(found[2].attribute("href"), None);
    }

    #[test]
    fn decodes_entities() {
        assert_eq!(decode_entities("&gt;=3.8,&lt;4"), ">=3.8,<4");
        assert_eq!(
            decode_entities("&#62;&#x3C;&amp;&unknown;&"),
            "><&&unknown;&"
        );
    }

    #[test]
    fn truncated_markup_does_not_panic() {
        assert_eq!(anchors("<a href=\"x").len(), 1);
        assert_eq!(anchors("<a").len(), 0);
        assert_eq!(anchors("<a ").len(), 1);
    }
}
