//! The mock gateway's tokens: real JWTs (HS256, HMAC-SHA256 with ring), so that a merchant's
//! client sees what it will see in production — opaque bearer strings with an expiry.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde::{Deserialize, Serialize};

/// What a token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Use {
    Access,
    Refresh,
}

/// The claims of a mock token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claims {
    /// The merchant user.
    pub(crate) sub: String,
    /// Issued at, seconds since the Unix epoch.
    pub(crate) iat: i64,
    /// Expires at, seconds since the Unix epoch (rounded up): the standard claim, as a
    /// production token carries it.
    pub(crate) exp: i64,
    /// Expires at, milliseconds since the Unix epoch: what the mock checks, so that
    /// sub-second lifetimes can be tested.
    pub(crate) exp_ms: i64,
    /// Access or refresh.
    #[serde(rename = "use")]
    pub(crate) token_use: Use,
    /// Unique id, so that a refresh token can be used once.
    pub(crate) jti: String,
}

/// `exp_ms` as the standard `exp` claim: whole seconds, rounded up.
pub(crate) fn expiry_seconds(exp_ms: i64) -> i64 {
    exp_ms.saturating_add(999).div_euclid(1000)
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    Malformed,
    BadSignature,
    Expired,
    WrongUse,
}

/// Issues and checks tokens with one secret.
pub(crate) struct Issuer {
    key: hmac::Key,
}

impl Issuer {
    pub(crate) fn new(secret: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    pub(crate) fn issue(&self, claims: &Claims) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap_or_default());
        let signing_input = format!("{header}.{payload}");
        let tag = hmac::sign(&self.key, signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The claims of `token` when it is ours, unexpired at `now_ms` and for `wanted`.
    pub(crate) fn check(&self, token: &str, wanted: Use, now_ms: i64) -> Result<Claims, Refused> {
        let (signing_input, tag) = token.rsplit_once('.').ok_or(Refused::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| Refused::Malformed)?;
        // Constant-time comparison inside ring.
        hmac::verify(&self.key, signing_input.as_bytes(), &tag)
            .map_err(|_| Refused::BadSignature)?;
        let (_, payload) = signing_input.split_once('.').ok_or(Refused::Malformed)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| Refused::Malformed)?;
        let claims: Claims = serde_json::from_slice(&payload).map_err(|_| Refused::Malformed)?;
        if claims.token_use != wanted {
            return Err(Refused::WrongUse);
        }
        if claims.exp_ms <= now_ms {
            return Err(Refused::Expired);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(token_use: Use, exp_ms: i64) -> Claims {
        Claims {
            sub: "shop".into(),
            iat: 0,
            exp: expiry_seconds(exp_ms),
            exp_ms,
            token_use,
            jti: "j-1".into(),
        }
    }

    #[test]
    fn a_token_checks_until_it_expires_and_only_for_its_use() {
        let issuer = Issuer::new(b"secret");
        let token = issuer.issue(&claims(Use::Access, 1_000));
        assert_eq!(token.split('.').count(), 3);
        let checked = issuer.check(&token, Use::Access, 999).unwrap();
        assert_eq!(checked.sub, "shop");
        // The standard claim too, in whole seconds rounded up.
        assert_eq!((checked.exp, checked.exp_ms), (1, 1_000));
        assert_eq!(expiry_seconds(1_001), 2);
        let payload = token.split('.').nth(1).unwrap();
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap();
        let payload: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(payload["exp"], 1);
        assert_eq!(
            issuer.check(&token, Use::Access, 1_000),
            Err(Refused::Expired)
        );
        assert_eq!(
            issuer.check(&token, Use::Refresh, 0),
            Err(Refused::WrongUse)
        );
    }

    #[test]
    fn a_forged_or_mangled_token_is_refused() {
        let issuer = Issuer::new(b"secret");
        let token = Issuer::new(b"other").issue(&claims(Use::Access, i64::MAX));
        assert_eq!(
            issuer.check(&token, Use::Access, 0),
            Err(Refused::BadSignature)
        );
        let good = issuer.issue(&claims(Use::Access, i64::MAX));
        let (head, _) = good.rsplit_once('.').unwrap();
        let tampered = format!("{head}x.{}", good.rsplit_once('.').unwrap().1);
        assert_eq!(
            issuer.check(&tampered, Use::Access, 0),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            issuer.check("garbage", Use::Access, 0),
            Err(Refused::Malformed)
        );
    }
}
