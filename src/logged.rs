//! Values from the wire as they go into logs: control characters escaped (a newline in a
//! client id must not forge a log line), and cut to a bounded length (a long identifier must
//! not make every log line of its request long).

use std::borrow::Cow;
use std::fmt;

/// Characters of a value shown in a log line; the rest is elided.
const SHOWN: usize = 128;

/// `value` for a log field: printable as is, control characters escaped as `\n`, `\u{1b}`,
/// ..., at most 128 characters followed by `…(N bytes)`.
///
/// Wrap every value that came from the wire (a nonce, a client id, a message) when your
/// handler logs it, as payhook does in its own logs:
///
/// ```
/// use payhook::Logged;
///
/// let client_id = "client-42\n2026-01-01T00:00:00Z INFO forged line";
/// tracing::info!(client = %Logged(client_id), "booked");
/// assert_eq!(
///     Logged(client_id).to_string(),
///     "client-42\\n2026-01-01T00:00:00Z INFO forged line"
/// );
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Logged<'a>(pub &'a str);

impl fmt::Display for Logged<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0.chars().take(SHOWN))?;
        if self.0.chars().nth(SHOWN).is_some() {
            write!(f, "…({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

/// `value` whole, for a person to read (a listing on a terminal, a reason to act on):
/// control characters escaped as [`Logged`] escapes them, nothing cut.
///
/// ```
/// use payhook::Escaped;
///
/// let reason = format!("{} cannot take 10 more\u{1b}[2J", "c".repeat(300));
/// let shown = Escaped(&reason).to_string();
/// assert!(shown.starts_with(&"c".repeat(300)));
/// assert!(shown.ends_with("cannot take 10 more\\u{1b}[2J"));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0.chars())
    }
}

/// Writes `chars` to `out` with control characters escaped (`\n`, `\u{1b}`): a line break
/// from the wire must not forge a log line. So are the characters that break or reorder a
/// line without being controls ([`rewrites_the_line`]).
pub(crate) fn write_escaped(
    out: &mut dyn fmt::Write,
    chars: impl Iterator<Item = char>,
) -> fmt::Result {
    for c in chars {
        if c.is_control() || rewrites_the_line(c) {
            write!(out, "{}", c.escape_default())?;
        } else {
            out.write_char(c)?;
        }
    }
    Ok(())
}

/// Characters that are not controls but change how a line reads: the line and paragraph
/// separators (U+2028, U+2029), which some log viewers and terminals break lines on, and
/// the bidirectional marks, embeddings, overrides and isolates, which show a nonce's
/// characters in another order than they are (U+061C, U+200E, U+200F, U+202A to U+202E,
/// U+2066 to U+2069).
fn rewrites_the_line(c: char) -> bool {
    matches!(
        c,
        '\u{2028}'
            | '\u{2029}'
            | '\u{061C}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// `text`, or its first `max` bytes (fewer, to end on a whole character) and `…`: for what
/// is kept of a value from the wire, bounded by bytes.
pub(crate) fn cut_bytes(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}

/// `text`, or its first `max` characters and `…`: for what is kept of a value from the
/// wire, bounded by characters.
pub(crate) fn cut_chars(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]).into(),
        None => text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_values_cut() {
        assert_eq!(
            Logged("a\nb\r\u{1b}[31m\0ü").to_string(),
            "a\\nb\\r\\u{1b}[31m\\u{0}ü"
        );
        let long = "x".repeat(1000);
        let shown = Logged(&long).to_string();
        assert!(shown.starts_with(&"x".repeat(SHOWN)));
        assert!(shown.ends_with("…(1000 bytes)"), "{shown}");
        assert_eq!(Logged("plain-nonce").to_string(), "plain-nonce");
    }

    #[test]
    fn separators_and_bidirectional_controls_are_escaped() {
        // U+2028 breaks the line in some viewers; U+202E shows `n-123` as `n-321`.
        assert_eq!(
            Logged("a\u{2028}b\u{2029}c").to_string(),
            "a\\u{2028}b\\u{2029}c"
        );
        assert_eq!(
            Logged("n-\u{202E}321\u{202C}").to_string(),
            "n-\\u{202e}321\\u{202c}"
        );
        for c in [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{2066}', '\u{2069}',
        ] {
            assert_eq!(
                Logged(&c.to_string()).to_string(),
                c.escape_default().to_string()
            );
        }
        // Letters of right-to-left scripts are shown as they are.
        assert_eq!(Logged("שלום-ü").to_string(), "שלום-ü");
    }

    #[test]
    fn values_are_cut_on_whole_characters() {
        assert_eq!(cut_bytes("abc", 3), "abc");
        assert_eq!(cut_bytes("aé", 2), "a…", "é is two bytes: not cut in half");
        assert_eq!(cut_bytes("aéb", 3), "aé…");
        assert_eq!(cut_chars("üüü", 3), "üüü");
        assert_eq!(cut_chars("üüüü", 3), "üüü…");
    }
}
