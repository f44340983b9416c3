//! How a signature is written in its header: base64, base64url or hex.

use base64::{
    Engine,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};

use super::error::Error;

/// Reads standard base64 with or without padding.
const STANDARD_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
/// Reads base64url with or without padding.
const URL_SAFE_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The text encoding of a signature in its header.
///
/// Decoding is lenient about padding (`base64` and `base64url` both accept it present or
/// absent); encoding writes exactly the named form.
///
/// ```
/// use payhook::signature::Encoding;
///
/// assert_eq!(Encoding::Hex.encode(&[0xde, 0xad]), "dead");
/// assert_eq!(Encoding::Base64UrlNoPad.encode(&[0xfb, 0xff]), "-_8");
/// assert_eq!(Encoding::Base64Url.decode("-_8")?, vec![0xfb, 0xff]);
/// # Ok::<(), payhook::signature::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    /// Standard base64, padded. The default.
    #[default]
    Base64,
    /// URL-safe base64, padded.
    Base64Url,
    /// URL-safe base64 without padding.
    Base64UrlNoPad,
    /// Lowercase hexadecimal (uppercase is read too).
    Hex,
}

impl Encoding {
    /// Every encoding, in a stable order.
    pub const ALL: [Encoding; 4] = [
        Self::Base64,
        Self::Base64Url,
        Self::Base64UrlNoPad,
        Self::Hex,
    ];

    /// The name used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Base64 => "base64",
            Self::Base64Url => "base64url",
            Self::Base64UrlNoPad => "base64url-nopad",
            Self::Hex => "hex",
        }
    }

    /// Writes `bytes` in this encoding.
    pub fn encode(self, bytes: &[u8]) -> String {
        match self {
            Self::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
            Self::Base64Url => base64::engine::general_purpose::URL_SAFE.encode(bytes),
            Self::Base64UrlNoPad => base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
            Self::Hex => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// Reads `text` in this encoding.
    ///
    /// # Errors
    ///
    /// [`Error`] when `text` is not valid in the encoding.
    pub fn decode(self, text: &str) -> Result<Vec<u8>, Error> {
        let error = |reason: String| Error::Decode {
            encoding: self.name(),
            reason,
        };
        match self {
            Self::Base64 => STANDARD_ANY_PADDING
                .decode(text)
                .map_err(|e| error(e.to_string())),
            Self::Base64Url | Self::Base64UrlNoPad => URL_SAFE_ANY_PADDING
                .decode(text)
                .map_err(|e| error(e.to_string())),
            Self::Hex => decode_hex(text)
                .ok_or_else(|| error("expected an even number of hex digits".to_owned())),
        }
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| {
            let digit = |b: u8| (b as char).to_digit(16);
            u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()
        })
        .collect()
}

named_enum!(Encoding, Error::UnknownEncoding);

/// `--alg`-style arguments of a command line list every name (`clap` feature).
#[cfg(feature = "clap")]
impl clap::ValueEnum for Encoding {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_round_trips_every_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        for encoding in Encoding::ALL {
            assert_eq!(
                encoding.decode(&encoding.encode(&bytes)).unwrap(),
                bytes,
                "{encoding}"
            );
            assert_eq!(encoding.name().parse::<Encoding>().unwrap(), encoding);
        }
    }

    #[test]
    fn padding_is_optional_when_reading() {
        assert_eq!(Encoding::Base64.decode("AQ==").unwrap(), [1]);
        assert_eq!(Encoding::Base64.decode("AQ").unwrap(), [1]);
        assert_eq!(Encoding::Base64Url.decode("AQ").unwrap(), [1]);
        assert_eq!(Encoding::Base64UrlNoPad.decode("AQ==").unwrap(), [1]);
    }

    #[test]
    fn malformed_text_is_an_error() {
        assert!(
            Encoding::Base64.decode("a-b_").is_err(),
            "url alphabet is not standard base64"
        );
        assert!(Encoding::Base64Url.decode("a+b/").is_err());
        assert!(Encoding::Hex.decode("abc").is_err());
        assert!(Encoding::Hex.decode("zz").is_err());
        assert!(Encoding::Base64.decode("!!!!").is_err());
    }
}
