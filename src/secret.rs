//! Secrets that must not leak: passwords, tokens, shared keys — and the files that hold
//! them, or that decide what is trusted: warned of when others may read them, refused when
//! others may write them, warned of when a directory above lets others replace them
//! (`check_trusted_file`).
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
#[derive(Clone, Default, Eq, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

/// How a secret is written where a configuration is printed (`payhook check-config`); read
/// as a secret, it is refused: a printed configuration saved as it is would otherwise hold
/// a credential everyone knows.
pub(crate) const REDACTED: &str = "<redacted>";

/// Read as a string, except [`REDACTED`](crate::config::REDACTED): the placeholder of a printed configuration, which
/// as a shared secret or a password would let in anyone who read payhook's docs.
///
/// ```
/// use payhook::Secret;
///
/// let read: Secret = serde_json::from_str(r#""hunter2""#).unwrap();
/// assert_eq!(read.expose(), "hunter2");
/// let error = serde_json::from_str::<Secret>(r#""<redacted>""#).unwrap_err();
/// assert!(error.to_string().contains("placeholder"));
/// ```
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        if value == REDACTED {
            return Err(serde::de::Error::custom(
                "is \"<redacted>\", the placeholder `payhook check-config` prints for a \
                 secret, not one: put the real value back",
            ));
        }
        Ok(Self(value))
    }
}

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
             (chmod 600 {})",
            path.display(),
            shell_quoted(path)
        );
    }
}

/// Why anyone on the machine could change the file at `path` — others may write it
/// (`o+w`), and it is not on a read-only mount — as a sentence to follow the path with;
/// `None` otherwise, on other systems than Unix, and when the permissions cannot be read
/// (reading the file then fails with its own error). For files whose contents decide what
/// is trusted — the aggregator's keys, the CA the gateway is checked against, the
/// configuration — a refusal: whoever wrote their own key there would have forged
/// callbacks accepted, and no orchestrator makes such a file `o+w`.
fn changeable_by_anyone(path: &Path) -> Option<String> {
    let mode = writable_by_others(path)?;
    Some(format!(
        "can be written by any user (mode {mode:04o}): restrict it (chmod o-w {})",
        shell_quoted(path)
    ))
}

/// The check of a file whose contents decide what is trusted, before it is read: refused
/// ([`changeable_by_anyone`]: why, to follow the path with) when others may write it;
/// warned of ([`warn_if_replaceable_by_anyone`], `holding`: what it holds) when a directory
/// above lets them replace it.
pub(crate) fn check_trusted_file(path: &Path, holding: &str) -> Result<(), String> {
    if let Some(why) = changeable_by_anyone(path) {
        return Err(why);
    }
    warn_if_replaceable_by_anyone(path, holding);
    Ok(())
}

/// Warns when a directory above the file at `path` (`holding`: what it holds) lets any user
/// replace it — others may write the directory (`o+w`) without its sticky bit (`/tmp`'s),
/// and it is not on a read-only mount — along the path as given and along the path its links
/// lead to. A warning, not a refusal: a directory every container of a pod may write
/// (Kubernetes' `emptyDir`, where an agent writes secrets) is one a non-root service cannot
/// restrict.
fn warn_if_replaceable_by_anyone(path: &Path, holding: &str) {
    if let Some((dir, mode)) = replaceable_in(path) {
        tracing::warn!(
            file = %path.display(),
            directory = %dir.display(),
            mode = format_args!("{mode:04o}"),
            "{} holds {holding} and is under {}, where any user may replace it: move it, or \
             restrict the directory (chmod o-w {})",
            path.display(),
            dir.display(),
            shell_quoted(&dir)
        );
    }
}

/// `path` as the shell reads it back: in single quotes, each quote in it written `'\''`.
fn shell_quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// The permission bits of the file or directory at `path` (following links).
#[cfg(unix)]
fn mode_of(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    Some(std::fs::metadata(path).ok()?.permissions().mode() & 0o7777)
}

/// The file's permission bits when others may write it and it is not on a read-only mount.
#[cfg(unix)]
fn writable_by_others(path: &Path) -> Option<u32> {
    let mode = mode_of(path)?;
    (mode & 0o002 != 0 && !on_read_only_mount(path)).then_some(mode)
}

#[cfg(not(unix))]
fn writable_by_others(_: &Path) -> Option<u32> {
    None
}

/// The first directory (and its mode), from the file up, that lets any user replace what is
/// under it: along the path as given (a link's own directory) and along the one its links
/// lead to (the target's).
#[cfg(unix)]
fn replaceable_in(path: &Path) -> Option<(std::path::PathBuf, u32)> {
    let given = std::path::absolute(path).ok()?;
    let resolved = std::fs::canonicalize(path).ok();
    let directories = given
        .ancestors()
        .skip(1)
        .chain(resolved.iter().flat_map(|p| p.ancestors().skip(1)));
    for dir in directories {
        let Some(mode) = mode_of(dir) else {
            continue;
        };
        // The sticky bit: only a file's owner may rename or remove it there.
        if mode & 0o002 != 0 && mode & 0o1000 == 0 && !on_read_only_mount(dir) {
            return Some((dir.to_owned(), mode));
        }
    }
    None
}

#[cfg(not(unix))]
fn replaceable_in(_: &Path) -> Option<(std::path::PathBuf, u32)> {
    None
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
/// listed of those at the same point, mounted over the others — has the option `ro`, for
/// the mount or for its file system.
#[cfg(unix)]
fn read_only_in(table: &str, path: &Path) -> bool {
    let mut found: Option<(usize, bool)> = None;
    for line in table.lines() {
        // ID, parent ID, major:minor, root, mount point, mount options, optional fields,
        // `-`, file system type, source, the file system's own options.
        let mut fields = line.split(' ').skip(4);
        let (Some(point), Some(options)) = (fields.next(), fields.next()) else {
            continue;
        };
        let super_options = fields.skip_while(|f| *f != "-").nth(3).unwrap_or_default();
        let read_only = [options, super_options]
            .iter()
            .any(|options| options.split(',').any(|o| o == "ro"));
        let point = unescape_mount_point(point);
        if path.starts_with(&point) && found.is_none_or(|(length, _)| point.len() >= length) {
            found = Some((point.len(), read_only));
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
    let mode = mode_of(path)?;
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
    fn a_file_is_changeable_by_anyone_when_others_may_write_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("it's key.pem");
        std::fs::write(&path, "key").unwrap();
        for mode in [0o644, 0o664, 0o600, 0o444] {
            set(&path, mode);
            assert_eq!(changeable_by_anyone(&path), None, "{mode:o}");
        }
        set(&path, 0o666);
        assert_eq!(
            changeable_by_anyone(&path).unwrap(),
            format!(
                "can be written by any user (mode 0666): restrict it (chmod o-w '{}')",
                path.display().to_string().replace('\'', r"'\''")
            )
        );
    }

    fn set(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_directory_above_lets_anyone_replace_a_file_unless_it_is_sticky() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        let path = keys.join("key.pem");
        std::fs::write(&path, "key").unwrap();
        set(dir.path(), 0o755);
        assert_eq!(replaceable_in(&path), None);
        // Not the file's own directory: the one above it, whose `keys` anyone may rename.
        set(dir.path(), 0o777);
        assert_eq!(replaceable_in(&path), Some((dir.path().to_owned(), 0o777)));
        set(dir.path(), 0o1777);
        assert_eq!(replaceable_in(&path), None);
        // A link in a safe directory to a file in an unsafe one: the target's counts.
        set(dir.path(), 0o755);
        let elsewhere = tempfile::tempdir().unwrap();
        let link = elsewhere.path().join("key.pem");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        set(elsewhere.path(), 0o755);
        assert_eq!(replaceable_in(&link), None);
        set(&keys, 0o777);
        assert_eq!(replaceable_in(&link), Some((keys.clone(), 0o777)));
        set(&keys, 0o755);
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
35 22 0:45 / /mnt/sb rw,relatime shared:7 - squashfs /dev/loop0 ro
";
        for (path, read_only) in [
            ("/etc/config/payhook.toml", true),
            ("/etc/config", true),
            ("/etc/config-rw/payhook.toml", false),
            ("/etc/passwd", false),
            ("/srv/with space/key.pem", true),
            ("/srv/with/key.pem", false),
            ("/mnt/over/key.pem", false),
            ("/mnt/sb/key.pem", true),
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
