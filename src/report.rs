//! How payhook prints an error for people: the message and each cause of its `source()`
//! chain once, as a report on several lines ([`Report`]) or on one line for logs
//! (`InLine`). Below every module, so that any of them can print what it logs.

use std::{error::Error as StdError, fmt};

/// Renders an error and its [`source`](StdError::source) chain for a person: the message,
/// then each cause on its own line (`  caused by: ...`). A cause whose text the message
/// already quotes is not repeated (an error of another crate may embed its cause), so
/// every cause reads once. Never `Debug`.
///
/// ```
/// use std::io;
///
/// #[derive(Debug)]
/// struct Outer(io::Error);
/// impl std::fmt::Display for Outer {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("cannot open the ledger")
///     }
/// }
/// impl std::error::Error for Outer {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// }
///
/// let error = Outer(io::Error::new(io::ErrorKind::NotFound, "ledger.db is missing"));
/// assert_eq!(
///     payhook::Report::new(&error).to_string(),
///     "cannot open the ledger\n  caused by: ledger.db is missing",
/// );
/// ```
#[derive(Clone, Copy)]
pub struct Report<'a>(&'a (dyn StdError + 'static));

impl<'a> Report<'a> {
    /// A report of `error`.
    pub fn new(error: &'a (dyn StdError + 'static)) -> Self {
        Self(error)
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_with_causes(self.0, "\n  caused by: ", f)
    }
}

impl fmt::Debug for Report<'_> {
    /// The same as `Display`: a report is for people, also where `{:?}` is used.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An error and its causes on one line (`message: cause: cause`), for logs: the same
/// causes as [`Report`], each once, and no line breaks that would split a log record.
pub(crate) struct InLine<'a>(pub(crate) &'a (dyn StdError + 'static));

impl fmt::Display for InLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A message may carry text from the wire (a handler's error quoting a client id): a
        // line break in it must not forge a log record.
        write_with_causes(self.0, ": ", &mut Escaped(f))
    }
}

/// Writes to the formatter with control characters escaped, as [`crate::Logged`] shows a
/// value from the wire.
struct Escaped<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        crate::logged::write_escaped(self.0, text.chars())
    }
}

/// `error`'s message, then each cause of its `source()` chain after `separator`, skipping a
/// cause whose text is already shown (an error of another crate may embed its cause).
fn write_with_causes(
    error: &(dyn StdError + 'static),
    separator: &str,
    f: &mut dyn fmt::Write,
) -> fmt::Result {
    let mut shown = error.to_string();
    f.write_str(&shown)?;
    let mut cause = error.source();
    while let Some(error) = cause {
        let text = error.to_string();
        if !text.is_empty() && !shown.contains(&text) {
            write!(f, "{separator}{text}")?;
            shown.push_str(&text);
        }
        cause = error.source();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_in_line_forges_no_log_line() {
        let inner = std::io::Error::other("client a\n2026-01-01T00:00:00Z INFO booked\u{1b}[2J");
        let outer = crate::store::StoreError::backend("handler failed\r\nagain", inner);
        let line = InLine(&outer).to_string();
        assert!(!line.chars().any(char::is_control), "{line}");
        assert_eq!(
            line,
            "handler failed\\r\\nagain: client a\\n2026-01-01T00:00:00Z INFO booked\\u{1b}[2J"
        );
    }
}
