//! Text from outside (an image's labels, a registry's answer, a file name in a pull
//! request) made safe to show: escaped before it reaches a terminal, and cut when it is
//! too long for a message.
//!
//! A terminal obeys what it prints: an escape sequence in a label can clear the screen or
//! retitle the window, a carriage return or a newline can print a fake `ok` line, and a
//! Unicode bidi control can reorder what a reader sees. [`escape`] writes every such
//! character as a visible escape (`\u{1b}`, `\n`); [`escape_keeping_lines`] keeps newlines
//! and tabs, for whole blocks a command renders itself. JSON output does not come here:
//! serde escapes it and it must stay exact.

use std::borrow::Cow;
use std::path::Path;

/// The longest text a message shows whole; longer is cut with an ellipsis and its length.
pub const MESSAGE_LIMIT: usize = 200;

/// Whether `c` must not reach a terminal as it is: C0 and C1 controls and DEL (escape
/// sequences, carriage return, newline), the line and paragraph separators, and the
/// Unicode bidi controls (Trojan Source, CVE-2021-42574).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{061C}' // Arabic letter mark
            | '\u{200E}' | '\u{200F}' // left-to-right and right-to-left marks
            | '\u{202A}'..='\u{202E}' // embeddings and overrides
            | '\u{2066}'..='\u{2069}' // isolates
        )
}

/// `text` with every unsafe character (newlines included) written as a Rust escape, so it
/// stays on one line and changes nothing on the terminal.
pub fn escape(text: &str) -> Cow<'_, str> {
    escape_where(text, is_unsafe)
}

/// `text` with every unsafe character but newline and tab escaped: for a block of lines.
pub fn escape_keeping_lines(text: &str) -> Cow<'_, str> {
    escape_where(text, |c| c != '\n' && c != '\t' && is_unsafe(c))
}

fn escape_where(text: &str, unsafe_char: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` escaped and, when longer than [`MESSAGE_LIMIT`] characters, cut: its start, an
/// ellipsis, and how long it was (a 100 KB file name must not fill the screen).
pub fn short(text: &str) -> String {
    let escaped = escape(text);
    let length = escaped.chars().count();
    if length <= MESSAGE_LIMIT {
        return escaped.into_owned();
    }
    let start: String = escaped.chars().take(MESSAGE_LIMIT).collect();
    format!("{start}… ({} bytes)", text.len())
}

/// A path for a message: lossy UTF-8, escaped and cut as [`short`] does.
pub fn path(path: &Path) -> String {
    short(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_bidi() {
        let label = "12.4\u{1b}]0;owned\u{7}\r\nok: fake\u{202E}txt.exe\u{2066}";
        let shown = escape(label);
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        assert_eq!(
            shown,
            "12.4\\u{1b}]0;owned\\u{7}\\r\\nok: fake\\u{202e}txt.exe\\u{2066}"
        );
        assert!(matches!(escape("12.4.1"), Cow::Borrowed("12.4.1")));
        assert_eq!(escape("Ünïcödé ok"), "Ünïcödé ok");
    }

    #[test]
    fn blocks_keep_their_lines_but_no_escape_codes() {
        let shown = escape_keeping_lines("a\n\tb\u{1b}[2J\r\u{9b}c");
        assert_eq!(shown, "a\n\tb\\u{1b}[2J\\r\\u{9b}c");
    }

    #[test]
    fn long_text_is_cut_with_its_length() {
        let name = "x".repeat(100_000);
        let shown = short(&name);
        assert!(shown.len() < 300, "{} bytes", shown.len());
        assert!(shown.ends_with("… (100000 bytes)"), "{shown}");
        assert_eq!(short("train.py"), "train.py");
        // Multi-byte characters are cut on a character boundary.
        assert!(short(&"é".repeat(1000)).ends_with("… (2000 bytes)"));
    }
}
