//! Login and token refresh (spec 2.1, 4.1, 5).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::timestamp;
use crate::Secret;

/// Body of `POST {auth_url}/api/v1/login`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoginRequest {
    /// Merchant user name.
    pub username: String,
    /// Merchant password; redacted in `Debug`.
    pub password: Secret,
}

/// Body of `POST {auth_url}/api/v1/refresh-token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefreshRequest {
    /// The refresh token of the current session; redacted in `Debug`.
    pub refresh_token: Secret,
}

/// Response of login and refresh (spec 2.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoginSession {
    /// Merchant user name.
    pub username: String,
    /// JWT access token; redacted in `Debug`.
    pub access_token: Secret,
    /// Token used to obtain a new access token; redacted in `Debug`.
    pub refresh_token: Secret,
    /// Expiry of the access token.
    #[serde(with = "timestamp::utc")]
    pub access_token_expiry_utc: DateTime<Utc>,
    /// Expiry of the refresh token.
    #[serde(with = "timestamp::utc")]
    pub refresh_token_expiry_utc: DateTime<Utc>,
    /// Roles of the user; absent or `null` reads as none.
    #[serde(default, deserialize_with = "super::null_as_default")]
    pub roles: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::round_trip;

    #[test]
    fn login_request_round_trips_and_hides_the_password() {
        let request: LoginRequest = round_trip(r#"{"username":"shop","password":"s3cret"}"#);
        assert_eq!(request.password.expose(), "s3cret");
        assert!(!format!("{request:?}").contains("s3cret"));
    }

    #[test]
    fn refresh_request_round_trips() {
        let request: RefreshRequest = round_trip(r#"{"refreshToken":"r-token"}"#);
        assert_eq!(request.refresh_token.expose(), "r-token");
    }

    #[test]
    fn login_session_round_trips_and_hides_tokens() {
        let session: LoginSession = round_trip(
            r#"{"username":"shop","accessToken":"a.b.c","refreshToken":"r-token",
                "accessTokenExpiryUtc":"2026-01-02T03:04:05Z","refreshTokenExpiryUtc":"2026-01-09T03:04:05Z",
                "roles":["Merchant"]}"#,
        );
        assert_eq!(session.roles, ["Merchant"]);
        let debug = format!("{session:?}");
        assert!(
            !debug.contains("a.b.c") && !debug.contains("r-token"),
            "{debug}"
        );
    }

    #[test]
    fn login_session_from_dotnet_without_zone_and_roles() {
        let session: LoginSession = serde_json::from_str(
            r#"{"username":"shop","accessToken":"a","refreshToken":"r",
                "accessTokenExpiryUtc":"2026-01-02T03:04:05.1234567","refreshTokenExpiryUtc":"2026-01-09T03:04:05",
                "roles":null}"#,
        )
        .unwrap();
        assert!(session.roles.is_empty());
        assert_eq!(
            timestamp::format_utc(&session.refresh_token_expiry_utc),
            "2026-01-09T03:04:05Z"
        );
    }
}
