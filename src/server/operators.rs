//! Operators of the operating API with tokens of their own (`[admin.operators]`), so that
//! what a person does to the merchant's money through it — a held result resolved, a
//! postponed validation decided — is kept with who did it, as a login and not as their word.
//!
//! The configuration holds each operator's token by its SHA-256 (`sha256:` and 64 hex
//! digits), never the token: a copy of the file lets nobody in. A token is 32 random bytes
//! ([`OperatorToken::generate`], behind `payhook operator-token NAME`), so one hash is as
//! hard to reverse as the token is to guess; no slow hash is needed. A presented token is
//! hashed once and compared with every operator's hash in constant time.
//!
//! ```
//! use payhook::server::OperatorToken;
//!
//! let made = OperatorToken::generate().expect("random bytes");
//! assert!(made.token().expose().starts_with("phop_"));
//! assert_eq!(made.digest(), OperatorToken::digest_of(made.token().expose()));
//! let entry = made.entry("alice").expect("a name an operator may have");
//! assert_eq!(entry, format!("alice = \"{}\"", made.digest()));
//! assert!(made.entry(" alice").is_err());
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::Secret;
use crate::auth::Expected;
use crate::config::ConfigError;
use crate::setting::InvalidSetting;
use crate::signature::Encoding;

/// What an operator's entry in `[admin.operators]` starts with: the hash's name.
const DIGEST_PREFIX: &str = "sha256:";

/// What a generated token starts with, so that one found in a log or a paste is known for
/// what it is.
const TOKEN_PREFIX: &str = "phop_";

/// The longest operator name, in characters; and in bytes, within what a store keeps of a
/// person's name (`store::held::person`), so that two names are never kept as one.
const NAME_CHARS: usize = 64;
const NAME_BYTES: usize = crate::store::held::NAME_BYTES;

/// A new operator's token and the hash the service's configuration keeps of it.
pub struct OperatorToken {
    token: Secret,
}

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorToken")
            .field("digest", &self.digest())
            .finish_non_exhaustive()
    }
}

impl OperatorToken {
    /// A token of 32 random bytes (URL-safe base64, unpadded, after `phop_`). `None` when the
    /// system gives no random bytes.
    pub fn generate() -> Option<Self> {
        let bytes: [u8; 32] = ring::rand::generate(&ring::rand::SystemRandom::new())
            .ok()?
            .expose();
        Some(Self {
            token: Secret::new(format!(
                "{TOKEN_PREFIX}{}",
                Encoding::Base64UrlNoPad.encode(&bytes)
            )),
        })
    }

    /// The token, for the operator alone (`PAYHOOK_ADMIN_TOKEN` where they run `payhook`,
    /// the inspector's form).
    pub fn token(&self) -> &Secret {
        &self.token
    }

    /// What `[admin.operators]` keeps of it: `sha256:` and its hash in hex.
    pub fn digest(&self) -> String {
        Self::digest_of(self.token.expose())
    }

    /// `sha256:` and the hex SHA-256 of `token`: an operator's entry for a token made
    /// elsewhere — of at least 32 random bytes, as [`Self::generate`] makes: one a person
    /// chose can be found again from its hash by whoever reads the configuration.
    pub fn digest_of(token: &str) -> String {
        format!("{DIGEST_PREFIX}{}", digest_hex(token))
    }

    /// The line of `[admin.operators]` that lets this token in as `name`: `name =
    /// "sha256:…"`, the name quoted unless it is letters, digits, `-` and `_`.
    ///
    /// # Errors
    ///
    /// [`InvalidOperatorName`] for a name the configuration refuses.
    pub fn entry(&self, name: &str) -> Result<String, InvalidOperatorName> {
        check_name(name)?;
        let bare = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        // A JSON string is a TOML basic string: the same quotes and escapes.
        let key = if bare {
            name.to_owned()
        } else {
            serde_json::to_string(name).map_err(|_| InvalidOperatorName)?
        };
        Ok(format!("{key} = \"{}\"", self.digest()))
    }
}

/// A name `[admin.operators]` does not take: it must be 1 to 64 characters (at most 128
/// bytes), without control, invisible or direction characters, nor blanks around it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "an operator's name must be 1 to 64 characters (at most 128 bytes), without control, \
     invisible or direction characters, nor blanks around it"
)]
pub struct InvalidOperatorName;

/// Characters that show nothing, or turn the text around: two names that differ only by
/// them look the same in a log or on the inspector's page.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

fn check_name(name: &str) -> Result<(), InvalidOperatorName> {
    if name.is_empty()
        || name.chars().count() > NAME_CHARS
        || name.len() > NAME_BYTES
        || name.chars().any(|c| c.is_control() || is_invisible(c))
        || name.trim() != name
    {
        Err(InvalidOperatorName)
    } else {
        Ok(())
    }
}

/// The hex SHA-256 of `token`, as an operator's entry holds it after `sha256:` and as an
/// inspector session signs the credential it was opened with.
pub(crate) fn digest_hex(token: &str) -> String {
    Encoding::Hex.encode(&sha256(token))
}

fn sha256(token: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    out
}

/// Who an operating call comes from, as its credentials say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A bearer of `admin.token`, which every operator may share: a name they give is
    /// their word.
    Shared,
    /// The operator this name stands for in `[admin.operators]`.
    Operator(Arc<str>),
    /// An operator of `[admin.operators]` named in `admin.viewers`: they may look, not
    /// change.
    Viewer(Arc<str>),
}

impl Caller {
    /// The operator's name, when the credentials are an operator's own.
    pub(crate) fn operator(&self) -> Option<&str> {
        match self {
            Self::Operator(name) | Self::Viewer(name) => Some(name),
            Self::Shared => None,
        }
    }

    /// Whether the caller may change what the service holds (decide, retry, book,
    /// resolve): every caller but a viewer.
    pub(crate) fn may_change(&self) -> bool {
        !matches!(self, Self::Viewer(_))
    }
}

/// One operator: the name, and their token's hash, compared in constant time.
struct Operator {
    name: Arc<str>,
    /// Named in `admin.viewers`: may look, not change.
    viewer: bool,
    digest: Expected,
    /// The hash in hex, which an inspector session signs beside the name: a new token for
    /// the operator ends their sessions.
    digest_hex: String,
    /// Whether their token was seen not to be one `payhook operator-token` makes (and said).
    chosen_by_hand: AtomicBool,
}

/// The operators of `[admin.operators]`, checked and ready to compare tokens with.
#[derive(Default)]
pub(crate) struct Operators {
    operators: Vec<Operator>,
}

impl Operators {
    /// The operators `configured` names, those in `viewers` as viewers; entries that do
    /// not parse are left out (the configuration's check, [`check`], refuses them first).
    pub(crate) fn new(configured: &BTreeMap<String, String>, viewers: &[String]) -> Self {
        let operators = configured
            .iter()
            .filter_map(|(name, value)| {
                let digest = parse_digest(value)?;
                Some(Operator {
                    name: name.as_str().into(),
                    viewer: viewers.contains(name),
                    digest: Expected::new(&digest),
                    digest_hex: Encoding::Hex.encode(&digest),
                    chosen_by_hand: AtomicBool::new(false),
                })
            })
            .collect();
        Self { operators }
    }

    /// The operator whose token `presented` is. Every operator's hash is compared, each in
    /// constant time, whichever matches. A token that is not of the shape `payhook
    /// operator-token` makes is said once at warning level (per operator, per reading of
    /// the configuration): one a person chose can be found again from its unsalted hash by
    /// whoever reads the configuration.
    pub(crate) fn holder_of(&self, presented: &str) -> Option<Caller> {
        let digest = sha256(presented);
        let operator = self.operators.iter().fold(None, |found, operator| {
            let matches = operator.digest.matches(&digest);
            found.or(matches.then_some(operator))
        })?;
        if !made_by_payhook(presented) && !operator.chosen_by_hand.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                operator = %crate::logged::Logged(&operator.name),
                "admin: this operator's token was not made by `payhook operator-token`: one a \
                 person chose can be found again from its hash by whoever reads the \
                 configuration; give them one it makes"
            );
        }
        Some(operator.caller())
    }

    /// The hex hash of `name`'s token now, for a session's signature; `None` once they are
    /// no longer an operator.
    pub(crate) fn digest_hex(&self, name: &str) -> Option<&str> {
        self.operators
            .iter()
            .find(|operator| &*operator.name == name)
            .map(|operator| operator.digest_hex.as_str())
    }

    /// The operator `name` could be read as: the same once characters that show nothing
    /// are taken out, white space trimmed and letters compared without their case (`Alice`,
    /// `alice\u{200B}`). Letters of other scripts that look alike are not caught.
    pub(crate) fn passed_for(&self, name: &str) -> Option<&str> {
        let seen = name
            .chars()
            .filter(|c| !is_invisible(*c) && !c.is_control())
            .collect::<String>()
            .trim()
            .to_lowercase();
        // An operator's own name has none of those and no white space around it
        // (`check_name`): its case alone is taken off.
        self.operators
            .iter()
            .find(|operator| operator.name.to_lowercase() == seen)
            .map(|operator| &*operator.name)
    }

    /// The operator of this name, as held here, and what they may do under this
    /// configuration (a session never signs it: started again with the same sessions'
    /// secret and a new configuration, a service gives an open session the new role).
    pub(crate) fn named(&self, name: &str) -> Option<Caller> {
        self.operators
            .iter()
            .find(|operator| &*operator.name == name)
            .map(Operator::caller)
    }
}

impl Operator {
    fn caller(&self) -> Caller {
        let name = Arc::clone(&self.name);
        if self.viewer {
            Caller::Viewer(name)
        } else {
            Caller::Operator(name)
        }
    }
}

/// Whether `token` has the shape of one [`OperatorToken::generate`] makes: the prefix, then
/// 32 bytes in unpadded URL-safe base64 (43 characters).
fn made_by_payhook(token: &str) -> bool {
    token.strip_prefix(TOKEN_PREFIX).is_some_and(|rest| {
        rest.len() == 43
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// Refuses `admin.token` when it is an operator's token: every bearer of the shared token
/// would act as them; and, beside operators, `admin.session_secret` when it is the shared
/// token or an operator's: the sessions' key is derived from it, so its bearers could sign
/// an inspector session in any operator's name (their hashes are in the configuration). A
/// service neither starts nor reads its credentials again so configured. (The command line
/// may hold an operator's token as `admin.token`: it is the token it calls with.)
pub(super) fn check_tokens_apart(config: &super::AdminConfig) -> Result<(), ConfigError> {
    if let Some(name) = holding_the_shared_token(config) {
        return Err(ConfigError::Invalid {
            key: "admin.token".into(),
            reason: format!(
                "is the token of operator {} in admin.operators: every bearer of the shared \
                 token would act as them; give it a value of its own, or leave it out",
                crate::logged::Logged(name)
            ),
        });
    }
    match holding_the_session_secret(config) {
        None => Ok(()),
        Some(holder) => Err(ConfigError::Invalid {
            key: "admin.session_secret".into(),
            reason: format!(
                "is {holder}: its bearers could sign an inspector session in any operator's \
                 name; give it a random value of its own (e.g. `openssl rand -base64 32`)"
            ),
        }),
    }
}

/// Whether two entries of `[admin.operators]` hold one token's hash (however its hex is
/// written).
pub(super) fn same_digest(one: &str, other: &str) -> bool {
    match (parse_digest(one), parse_digest(other)) {
        (Some(one), Some(other)) => one == other,
        _ => one == other,
    }
}

/// The operator whose token `admin.token` is.
fn holding_the_shared_token(config: &super::AdminConfig) -> Option<&str> {
    operator_whose_token(config, config.token.as_ref()?.expose())
}

/// Whose token `admin.session_secret` is, where operators are configured: the shared
/// token's, or an operator's (named).
fn holding_the_session_secret(config: &super::AdminConfig) -> Option<String> {
    if config.operators.is_empty() {
        return None;
    }
    let secret = config.session_secret.as_ref()?.expose();
    if config.token.as_ref().is_some_and(|t| t.expose() == secret) {
        return Some("admin.token".into());
    }
    operator_whose_token(config, secret)
        .map(|name| format!("the token of operator {}", crate::logged::Logged(name)))
}

/// The operator of `[admin.operators]` whose entry holds `token`'s hash.
fn operator_whose_token<'c>(config: &'c super::AdminConfig, token: &str) -> Option<&'c str> {
    let digest = sha256(token);
    config
        .operators
        .iter()
        .find(|(_, value)| parse_digest(value) == Some(digest))
        .map(|(name, _)| name.as_str())
}

/// The hash an entry of `[admin.operators]` holds, when it is `sha256:` and 64 hex digits.
fn parse_digest(value: &str) -> Option<[u8; 32]> {
    let hex = value.strip_prefix(DIGEST_PREFIX)?;
    if hex.len() != 64 {
        return None;
    }
    Encoding::Hex.decode(hex).ok()?.try_into().ok()
}

/// Checks `admin.viewers`: each an operator of `[admin.operators]`, named once.
pub(crate) fn check_viewers(
    configured: &BTreeMap<String, String>,
    viewers: &[String],
) -> Result<(), InvalidSetting> {
    for (i, viewer) in viewers.iter().enumerate() {
        let reason = if !configured.contains_key(viewer) {
            "names no operator of admin.operators (a viewer is an operator with a token of \
             their own who may look, not change)"
        } else if viewers[..i].contains(viewer) {
            "names an operator twice"
        } else {
            continue;
        };
        return Err(InvalidSetting::new(
            format!("admin.viewers ({})", crate::logged::Logged(viewer)),
            reason,
        ));
    }
    Ok(())
}

/// Checks `[admin.operators]`: names of 1–64 characters with no control characters and no
/// blanks around them, each entry a SHA-256 as `sha256:` and 64 hex digits, no token shared
/// by two operators.
pub(crate) fn check(configured: &BTreeMap<String, String>) -> Result<(), InvalidSetting> {
    let mut seen: BTreeMap<[u8; 32], &str> = BTreeMap::new();
    for (name, value) in configured {
        let key = format!("admin.operators.{}", crate::logged::Logged(name.as_str()));
        if let Err(error) = check_name(name) {
            return Err(InvalidSetting::new(&key, error.to_string()));
        }
        let Some(digest) = parse_digest(value) else {
            return Err(InvalidSetting::new(
                &key,
                format!(
                    "must be `{DIGEST_PREFIX}` and 64 hex digits: the SHA-256 of the \
                     operator's token, never the token (`payhook operator-token NAME` makes a \
                     token and its line)"
                ),
            ));
        };
        if let Some(other) = seen.insert(digest, name) {
            return Err(InvalidSetting::new(
                &key,
                format!(
                    "the same token as operator {}: each operator needs a token of their own, \
                     or what one does is kept as the other's",
                    crate::logged::Logged(other)
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn a_token_is_known_by_its_hash_and_only_its_own_operator_holds_it() {
        let alice = OperatorToken::generate().unwrap();
        let bob = OperatorToken::generate().unwrap();
        let operators = Operators::new(
            &configured(&[
                ("alice", &alice.digest()),
                (
                    "bob",
                    &bob.digest().to_uppercase().replace("SHA256:", "sha256:"),
                ),
            ]),
            &["bob".to_owned()],
        );
        assert_eq!(
            operators.holder_of(alice.token().expose()),
            Some(Caller::Operator("alice".into()))
        );
        assert_eq!(
            operators.holder_of(bob.token().expose()),
            Some(Caller::Viewer("bob".into())),
            "hex digits in either case; bob is a viewer"
        );
        assert!(!operators.named("bob").unwrap().may_change());
        assert!(operators.named("alice").unwrap().may_change());
        assert_eq!(
            operators.holder_of(&alice.digest()),
            None,
            "the hash is no token"
        );
        assert_eq!(operators.holder_of(""), None);
        assert_eq!(
            operators.digest_hex("alice"),
            alice.digest().strip_prefix("sha256:")
        );
        assert_eq!(operators.digest_hex("carol"), None);
    }

    #[test]
    fn a_token_of_the_generated_shape_is_told_from_one_chosen_by_hand() {
        let made = OperatorToken::generate().unwrap();
        assert!(made_by_payhook(made.token().expose()));
        for chosen in [
            "alice-token-0123456789",
            "phop_alice-token-for-tests-0123456789",
            &format!("{}=", made.token().expose()),
            &made.token().expose().replace("phop_", "PHOP_"),
        ] {
            assert!(!made_by_payhook(chosen), "{chosen}");
        }
    }

    #[test]
    fn a_generated_token_is_32_random_bytes_and_never_shown_by_debug() {
        let made = OperatorToken::generate().unwrap();
        let encoded = made.token().expose().strip_prefix("phop_").unwrap();
        assert_eq!(Encoding::Base64UrlNoPad.decode(encoded).unwrap().len(), 32);
        assert_ne!(made.token(), OperatorToken::generate().unwrap().token());
        let shown = format!("{made:?}");
        assert!(!shown.contains(encoded), "{shown}");
        assert!(shown.contains(&made.digest()), "{shown}");
    }

    #[test]
    fn operators_the_configuration_cannot_name_or_hash_are_refused() {
        let digest = OperatorToken::digest_of("a token");
        assert!(check(&configured(&[("alice", &digest)])).is_ok());
        assert!(check(&configured(&[("Ana María O'Neil", &digest)])).is_ok());
        for (name, value, said) in [
            ("", digest.as_str(), "1 to 64"),
            (" alice", &digest, "blanks"),
            ("al\u{7}ice", &digest, "control"),
            ("al\u{200B}ice", &digest, "invisible"),
            ("alice\u{202E}", &digest, "direction"),
            (&"a".repeat(65), &digest, "1 to 64"),
            (&"\u{10000}".repeat(33), &digest, "128 bytes"),
            ("alice", "hunter2-secret", "never the token"),
            ("alice", &digest[7..], "sha256:"),
            ("alice", "sha256:abc", "64 hex"),
            ("alice", &digest.replace('a', "g"), "64 hex"),
            ("alice", &format!("{digest}00"), "64 hex"),
        ] {
            let error = check(&configured(&[(name, value)])).unwrap_err();
            assert!(
                error.to_string().contains(said),
                "{name:?} = {value:?}: {error}"
            );
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
        let error = check(&configured(&[("alice", &digest), ("bob", &digest)])).unwrap_err();
        assert!(error.to_string().contains("operator alice"), "{error}");
    }

    #[test]
    fn a_viewer_is_an_operator_named_once() {
        let operators = configured(&[("alice", &OperatorToken::digest_of("a token"))]);
        assert!(check_viewers(&operators, &["alice".to_owned()]).is_ok());
        let error = check_viewers(&operators, &["carol".to_owned()]).unwrap_err();
        assert!(
            error.to_string().contains("admin.viewers (carol)"),
            "{error}"
        );
        assert!(error.to_string().contains("names no operator"), "{error}");
        let twice = ["alice".to_owned(), "alice".to_owned()];
        let error = check_viewers(&operators, &twice).unwrap_err();
        assert!(error.to_string().contains("twice"), "{error}");
    }
}
