//! The merchant's nonce: what a payment's deliveries are deduplicated by.

use serde::{Deserialize, Serialize};

/// A payment's nonce, as the merchant created it: unique per transaction, and what
/// payhook deduplicates a payment's callbacks and validations by.
///
/// On the wire it is a JSON string, unchanged. It reads as a `&str` where one is wanted,
/// and is made from one:
///
/// ```
/// use payhook::model::Nonce;
///
/// let nonce = Nonce::from("n-42");
/// assert_eq!(nonce, "n-42");
/// assert!(nonce.starts_with("n-"));
/// assert_eq!(nonce.to_string(), "n-42");
/// assert_eq!(serde_json::to_string(&nonce).unwrap(), r#""n-42""#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Nonce(String);

impl Nonce {
    /// The nonce's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The nonce's text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::ops::Deref for Nonce {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Nonce {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Nonce {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<String> for Nonce {
    fn from(text: String) -> Self {
        Self(text)
    }
}

impl From<&str> for Nonce {
    fn from(text: &str) -> Self {
        Self(text.to_owned())
    }
}

impl From<&String> for Nonce {
    fn from(text: &String) -> Self {
        Self(text.clone())
    }
}

impl From<Nonce> for String {
    fn from(nonce: Nonce) -> Self {
        nonce.0
    }
}

impl std::fmt::Display for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Nonce {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Nonce {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Nonce {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<Nonce> for str {
    fn eq(&self, other: &Nonce) -> bool {
        self == other.0
    }
}

impl PartialEq<Nonce> for &str {
    fn eq(&self, other: &Nonce) -> bool {
        *self == other.0
    }
}

impl PartialEq<Nonce> for String {
    fn eq(&self, other: &Nonce) -> bool {
        *self == other.0
    }
}

/// A nonce binds and reads as PostgreSQL `text`, so that a merchant's SQL effects can bind
/// `&callback.nonce` as they bind a `String`.
#[cfg(feature = "postgres")]
mod postgres {
    use sqlx::encode::IsNull;
    use sqlx::error::BoxDynError;
    use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
    use sqlx::{Decode, Encode, Postgres, Type};

    use super::Nonce;

    impl Type<Postgres> for Nonce {
        fn type_info() -> PgTypeInfo {
            <String as Type<Postgres>>::type_info()
        }

        fn compatible(ty: &PgTypeInfo) -> bool {
            <String as Type<Postgres>>::compatible(ty)
        }
    }

    impl Encode<'_, Postgres> for Nonce {
        fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
            <&str as Encode<Postgres>>::encode(self.as_str(), buf)
        }
    }

    impl<'r> Decode<'r, Postgres> for Nonce {
        fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
            <String as Decode<Postgres>>::decode(value).map(Nonce)
        }
    }
}
