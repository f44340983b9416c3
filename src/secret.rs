//! Secrets that must not leak: passwords, tokens, shared keys — and the files that hold
//! them, or that decide what is trusted: warned of when others may read them, refused when
//! others may change them ([`changeable_by_anyone`]).
//!
//! A [`Secret`] prints as `Secret(***)` in `Debug` and has no `Display`, so that a stray
//! `{:?}` on a config or a login request never writes a password into a log. The value is
//! reached only through [`Secret::expose`], which makes every use easy to find.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

/// A string that redacts itself in `Debug` output.
///
/// ```
/// use payhook::Secret;
///
/// let password = Secret::new("hunter2");
/// assert_eq!(format!("{password:?}"), "Secret(***)");
/// assert_eq!(password.expose(), "hunter2");
/// assert!(password == Secret::new("hunter2") && password != Secret::new("hunter3"));
/// ```
#[derive(Clone, Default, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

/// Compared in constant time: the HMACs of the two values (under a key of no secrecy: only
/// the comparison's time matters) are compared by ring. A derived `==` on a secret a caller
/// presented would tell, by its time, how many of its first bytes were right.
impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"payhook secret comparison");
        let tag = ring::hmac::sign(&key, self.0.as_bytes());
        ring::hmac::verify(&key, other.0.as_bytes(), tag.as_ref()).is_ok()
    }
}

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value itself. Call this only where the value is sent or compared.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `true` when the secret is the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

/// `text` — an answer that may echo the request that carried `secrets`, such as a proxy's
/// error page — with each of them replaced by `***`, as it is and as a JSON string carries
/// it (a `"` or a `\` in a password is sent as `\"` or `\\`), then cut to `chars`
/// characters (after the replacement, so that no part of one is left).
pub(crate) fn redacted(text: &str, secrets: &[&str], chars: usize) -> String {
    let forms = secrets
        .iter()
        .filter(|secret| !secret.is_empty())
        .flat_map(|secret| {
            let json = serde_json::to_string(secret).unwrap_or_default();
            [(*secret).to_owned(), json.trim_matches('"').to_owned()]
        });
    forms
        .fold(text.to_owned(), |text, form| {
            text.replace(form.as_str(), "***")
        })
        .chars()
        .take(chars)
        .collect()
}

/// Warns when the file at `path`, which holds `holding` (the secret's name, never its
/// value), can be read by users other than its owner: its group's or others' read
/// permission is set (Unix), so anyone on the machine who reads it holds the secret. A
/// warning, not a refusal: an orchestrator's mounted secrets are often readable by all
/// (`0644`) inside a container that has one user. Nothing on other systems, or when the
/// file's permissions cannot be read (reading it then fails with its own error).
pub(crate) fn warn_if_readable_by_others(path: &Path, holding: &str) {
    if let Some(mode) = readable_by_others(path) {
        tracing::warn!(
            file = %path.display(),
            mode = format_args!("{mode:04o}"),
            "{} holds {holding} and can be read by users other than its owner: restrict it \
             (chmod 600 {:?})",
            path.display(),
            path.display().to_string()
        );
    }
}

/// Why anyone on the machine could change the file at `path` — the file itself may be
/// written by others (`o+w`), or its directory lets others replace it (`o+w` without the
/// sticky bit) — as a sentence to follow the path with; `None` otherwise (Unix), and on other
/// systems, or when the permissions cannot be read (reading the file then fails with its
/// own error). For files whose contents decide what is trusted — the aggregator's keys, the
/// CA the gateway is checked against, the configuration — a refusal, not a warning: whoever
/// could replace them could have forged callbacks accepted.
pub(crate) fn changeable_by_anyone(path: &Path) -> Option<String> {
    let (file, directory) = writable_by_others(path)?;
    let fix = |what: &Path, how: &str| format!("{how} {:?}", what.display().to_string());
    Some(match directory {
        None => format!(
            "can be written by any user (mode {file:04o}): restrict it ({})",
            fix(path, "chmod o-w")
        ),
        Some((dir, mode)) => format!(
            "is in {} (mode {mode:04o}), where any user can replace it: move it, or restrict \
             the directory ({})",
            dir.display(),
            fix(&dir, "chmod o-w")
        ),
    })
}

/// The file's permission bits, and the directory's (with its path) when that is what lets
/// others change it: `None` when neither does.
#[cfg(unix)]
fn writable_by_others(path: &Path) -> Option<(u32, Option<(std::path::PathBuf, u32)>)> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    if mode & 0o002 != 0 && !on_read_only_mount(path) {
        return Some((mode, None));
    }
    // Replacing needs the directory the name is in (a link's own, not its target's).
    let absolute = std::path::absolute(path).ok()?;
    let dir = absolute.parent()?;
    let dir_mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o7777;
    // The sticky bit (`/tmp`): only a file's owner may rename or remove it.
    (dir_mode & 0o002 != 0 && dir_mode & 0o1000 == 0 && !on_read_only_mount(dir))
        .then(|| (mode, Some((dir.to_owned(), dir_mode))))
}

/// Whether `path` lies on a file system mounted read-only, where its permission bits give
/// nobody a write: an orchestrator's volumes of configuration and secrets are mounted so,
/// with directories `0777` (Kubernetes), and so are `:ro` bind mounts. Read from
/// `/proc/self/mountinfo` (Linux); `false` where it cannot be told.
#[cfg(unix)]
fn on_read_only_mount(path: &Path) -> bool {
    let (Ok(path), Ok(table)) = (
        std::fs::canonicalize(path),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return false;
    };
    read_only_in(&table, &path)
}

/// Whether the mount `table` (`/proc/self/mountinfo`'s lines) says that `path` (canonical)
/// is on a read-only mount: the mount whose point is the longest that holds it — the last
/// listed of those at the same point, mounted over the others — has the option `ro`.
#[cfg(unix)]
fn read_only_in(table: &str, path: &Path) -> bool {
    let mut found: Option<(usize, bool)> = None;
    for line in table.lines() {
        // ID, parent ID, major:minor, root, mount point, mount options, …
        let mut fields = line.split(' ').skip(4);
        let (Some(point), Some(options)) = (fields.next(), fields.next()) else {
            continue;
        };
        let point = unescape_mount_point(point);
        if path.starts_with(&point) && found.is_none_or(|(length, _)| point.len() >= length) {
            found = Some((point.len(), options.split(',').any(|o| o == "ro")));
        }
    }
    found.is_some_and(|(_, read_only)| read_only)
}

/// A mount point as `mountinfo` writes it, with a space, tab, line feed or backslash as an
/// octal escape (`\040`).
#[cfg(unix)]
fn unescape_mount_point(field: &str) -> String {
    let mut point = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        point.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match code {
            Some(byte) => {
                point.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                point.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    point.push_str(rest);
    point
}

#[cfg(not(unix))]
fn writable_by_others(_: &Path) -> Option<(u32, Option<(std::path::PathBuf, u32)>)> {
    None
}

/// The permission bits of the file at `path` when its group or others may read it.
#[cfg(unix)]
fn readable_by_others(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & 0o044 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn readable_by_others(_: &Path) -> Option<u32> {
    None
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_secret_is_redacted_as_it_is_and_as_json_carries_it_before_the_text_is_cut() {
        let text = r#"echo: {"password":"pa\"ss"} pa"ss Bearer tok-123"#;
        assert_eq!(
            redacted(text, &["pa\"ss", "tok-123", ""], 200),
            r#"echo: {"password":"***"} *** Bearer ***"#
        );
        // Cut after the replacement: no part of the token is left at the cut.
        assert_eq!(redacted("Bearer tok-123", &["tok-123"], 10), "Bearer ***");
        assert_eq!(redacted("Bearer tok-123", &["tok-123"], 9), "Bearer **");
    }

    #[test]
    fn a_file_is_changeable_by_anyone_when_others_may_write_it_or_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(&path, "key").unwrap();
        let set = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        set(dir.path(), 0o755);
        for mode in [0o644, 0o664, 0o600, 0o444] {
            set(&path, mode);
            assert_eq!(changeable_by_anyone(&path), None, "{mode:o}");
        }
        set(&path, 0o666);
        let said = changeable_by_anyone(&path).unwrap();
        assert!(
            said.starts_with("can be written by any user (mode 0666): restrict it (chmod o-w "),
            "{said}"
        );
        set(&path, 0o644);
        set(dir.path(), 0o777);
        let said = changeable_by_anyone(&path).unwrap();
        assert!(
            said.contains("(mode 0777), where any user can replace it"),
            "{said}"
        );
        // Like /tmp: others may write, but only a file's owner may replace it.
        set(dir.path(), 0o1777);
        assert_eq!(changeable_by_anyone(&path), None);
        set(dir.path(), 0o700);
    }

    #[test]
    fn a_read_only_mount_is_told_by_the_longest_mount_point_that_holds_the_path() {
        let table = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /etc/config ro,relatime - ext4 /dev/sda1 rw
31 22 0:41 / /etc/config-rw rw,relatime - ext4 /dev/sda1 rw
32 22 0:42 / /srv/with\\040space ro - tmpfs tmpfs rw
33 22 0:43 / /mnt/over ro - tmpfs tmpfs rw
34 22 0:44 / /mnt/over rw - tmpfs tmpfs rw
";
        for (path, read_only) in [
            ("/etc/config/payhook.toml", true),
            ("/etc/config", true),
            ("/etc/config-rw/payhook.toml", false),
            ("/etc/passwd", false),
            ("/srv/with space/key.pem", true),
            ("/srv/with/key.pem", false),
            ("/mnt/over/key.pem", false),
        ] {
            assert_eq!(read_only_in(table, Path::new(path)), read_only, "{path}");
        }
        assert!(!read_only_in("", Path::new("/etc/config")));
        assert_eq!(unescape_mount_point("a\\134b\\x"), "a\\b\\x");
    }

    #[test]
    fn a_file_is_readable_by_others_when_its_group_or_others_may_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "token").unwrap();
        for (mode, readable) in [(0o600, false), (0o400, false), (0o640, true), (0o604, true)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                readable_by_others(&path),
                readable.then_some(mode),
                "{mode:o}"
            );
        }
        assert_eq!(readable_by_others(&dir.path().join("missing")), None);
    }
}
