//! Values from the wire as they go into logs: control characters escaped (a newline in a
//! client id must not forge a log line), and cut to a bounded length (a long identifier must
//! not make every log line of its request long).

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
        for c in self.0.chars().take(SHOWN) {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        if self.0.chars().nth(SHOWN).is_some() {
            write!(f, "…({} bytes)", self.0.len())?;
        }
        Ok(())
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
}
