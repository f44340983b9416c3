//! Transaction status codes (spec 3.1) and transaction types.
//!
//! Both are integers on the wire. A code this version of payhook does not know is kept as
//! `Unknown(code)` and written back unchanged: a new status from the aggregator must never
//! make a callback undeliverable.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::fmt;

/// The `transactionStatus` of a transaction (spec 3.1).
///
/// ```
/// use payhook::model::TransactionStatus;
///
/// let status = TransactionStatus::from_code(-2);
/// assert_eq!(status, TransactionStatus::PaymentSystemError);
/// assert!(status.is_final() && status.is_failure() && status.sent_in_callbacks());
/// assert_eq!(TransactionStatus::from_code(9), TransactionStatus::Unknown(9));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransactionStatus {
    /// `0` — "unknown" in the spec: the aggregator itself does not know the state yet.
    Undetermined,
    /// `1` — not confirmed.
    NotConfirmed,
    /// `2` — scheduled.
    Scheduled,
    /// `3` — pending.
    Pending,
    /// `4` — success.
    Success,
    /// `-1` — cancelled.
    Cancelled,
    /// `-2` — payment system error; the money has to be returned.
    PaymentSystemError,
    /// `-3` — generic payment system error.
    GenericPaymentSystemError,
    /// `-4` — network error.
    NetworkError,
    /// `-5` — internal error.
    InternalError,
    /// `-6` — failed to validate payment ability.
    ValidationFailed,
    /// A code that interface version 0.3.2 does not define, kept as received.
    Unknown(i32),
}

impl TransactionStatus {
    /// Every status the spec defines, in the order of its table.
    pub const KNOWN: [TransactionStatus; 11] = [
        Self::Undetermined,
        Self::NotConfirmed,
        Self::Scheduled,
        Self::Pending,
        Self::Success,
        Self::Cancelled,
        Self::PaymentSystemError,
        Self::GenericPaymentSystemError,
        Self::NetworkError,
        Self::InternalError,
        Self::ValidationFailed,
    ];

    /// The status for a wire code; codes the spec does not define become `Unknown(code)`.
    pub fn from_code(code: i32) -> Self {
        match code {
            0 => Self::Undetermined,
            1 => Self::NotConfirmed,
            2 => Self::Scheduled,
            3 => Self::Pending,
            4 => Self::Success,
            -1 => Self::Cancelled,
            -2 => Self::PaymentSystemError,
            -3 => Self::GenericPaymentSystemError,
            -4 => Self::NetworkError,
            -5 => Self::InternalError,
            -6 => Self::ValidationFailed,
            other => Self::Unknown(other),
        }
    }

    /// The wire code.
    pub fn code(self) -> i32 {
        match self {
            Self::Undetermined => 0,
            Self::NotConfirmed => 1,
            Self::Scheduled => 2,
            Self::Pending => 3,
            Self::Success => 4,
            Self::Cancelled => -1,
            Self::PaymentSystemError => -2,
            Self::GenericPaymentSystemError => -3,
            Self::NetworkError => -4,
            Self::InternalError => -5,
            Self::ValidationFailed => -6,
            Self::Unknown(code) => code,
        }
    }

    /// `true` for success (4).
    pub fn is_success(self) -> bool {
        self == Self::Success
    }

    /// `true` for the failure codes -1 to -6. An unknown code is neither success nor failure.
    pub fn is_failure(self) -> bool {
        (-6..=-1).contains(&self.code()) && !matches!(self, Self::Unknown(_))
    }

    /// `true` when the transaction will not change any more by itself: success or a failure.
    pub fn is_final(self) -> bool {
        self.is_success() || self.is_failure()
    }

    /// `true` for the codes the spec says appear in callbacks (4 and -1 to -6).
    pub fn sent_in_callbacks(self) -> bool {
        self.is_final()
    }

    /// `true` for the codes the spec defines for a transaction still in progress (0 to 3):
    /// no callback is due for it yet. An unknown code is not one of them: what it means is
    /// not known, and a callback may carry it.
    pub(crate) fn in_progress(self) -> bool {
        !self.is_final() && !matches!(self, Self::Unknown(_))
    }

    /// The spec's meaning of the code, for logs and reports.
    pub fn description(self) -> &'static str {
        match self {
            Self::Undetermined => "unknown",
            Self::NotConfirmed => "not confirmed",
            Self::Scheduled => "scheduled",
            Self::Pending => "pending",
            Self::Success => "success",
            Self::Cancelled => "cancelled",
            Self::PaymentSystemError => "payment system error (money has to be returned)",
            Self::GenericPaymentSystemError => "generic payment system error",
            Self::NetworkError => "network error",
            Self::InternalError => "internal error",
            Self::ValidationFailed => "failed to validate payment ability",
            Self::Unknown(_) => "status not defined by interface 0.3.2",
        }
    }
}

impl fmt::Display for TransactionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.code(), self.description())
    }
}

/// The `transactionType` of a transaction: the direction money moves.
///
/// ```
/// use payhook::model::TransactionType;
///
/// assert_eq!(TransactionType::from_code(2), TransactionType::Withdrawal);
/// assert_eq!(TransactionType::from_cash_in(true), TransactionType::Deposit);
/// assert_eq!(TransactionType::from_code(7).code(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransactionType {
    /// `1` — cash-in.
    Deposit,
    /// `2` — cash-out.
    Withdrawal,
    /// A code that interface version 0.3.2 does not define, kept as received.
    Unknown(i32),
}

impl TransactionType {
    /// The type for a wire code; codes the spec does not define become `Unknown(code)`.
    pub fn from_code(code: i32) -> Self {
        match code {
            1 => Self::Deposit,
            2 => Self::Withdrawal,
            other => Self::Unknown(other),
        }
    }

    /// The type matching a validation request's `cashIn` flag.
    pub fn from_cash_in(cash_in: bool) -> Self {
        if cash_in {
            Self::Deposit
        } else {
            Self::Withdrawal
        }
    }

    /// The wire code.
    pub fn code(self) -> i32 {
        match self {
            Self::Deposit => 1,
            Self::Withdrawal => 2,
            Self::Unknown(code) => code,
        }
    }
}

impl fmt::Display for TransactionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deposit => f.write_str("deposit"),
            Self::Withdrawal => f.write_str("withdrawal"),
            Self::Unknown(code) => write!(f, "type {code}"),
        }
    }
}

/// Reads a wire code: an integer in `i32` range, in any JSON form of a whole number (`4`,
/// `4.0`, `4e0`, as JSON Schema counts integers), or a string holding one in decimal digits.
///
/// Read from the number's text, exactly, as every integer of the model is
/// ([`super::integer`]): through `f64`, `3.9999999999999999` rounds to `4.0` and was read
/// as a success.
fn code_from<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    let raw = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
    let text = raw.get();
    let expected = &"an integer code";
    if text.starts_with('"') {
        let digits: String = serde_json::from_str(text).map_err(de::Error::custom)?;
        return digits
            .parse()
            .map_err(|_| de::Error::invalid_value(de::Unexpected::Str(&digits), expected));
    }
    let code = super::integer::from_text::<D::Error>(text)
        .map_err(|_| de::Error::invalid_value(de::Unexpected::Other(text), expected))?;
    i32::try_from(code)
        .map_err(|_| de::Error::invalid_value(de::Unexpected::Signed(code), expected))
}

macro_rules! wire_code_serde {
    ($type:ty) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_i32(self.code())
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                code_from(deserializer).map(Self::from_code)
            }
        }
    };
}

wire_code_serde!(TransactionStatus);
wire_code_serde!(TransactionType);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_round_trips() {
        for status in TransactionStatus::KNOWN {
            assert_eq!(TransactionStatus::from_code(status.code()), status);
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(
                serde_json::from_str::<TransactionStatus>(&json).unwrap(),
                status
            );
        }
    }

    #[test]
    fn exactly_the_spec_codes_are_sent_in_callbacks() {
        let sent: Vec<i32> = TransactionStatus::KNOWN
            .iter()
            .filter(|s| s.sent_in_callbacks())
            .map(|s| s.code())
            .collect();
        assert_eq!(sent, [4, -1, -2, -3, -4, -5, -6]);
    }

    #[test]
    fn pending_states_are_neither_final_success_nor_failure() {
        for code in 0..=3 {
            let status = TransactionStatus::from_code(code);
            assert!(
                !status.is_final() && !status.is_success() && !status.is_failure(),
                "{status}"
            );
        }
    }

    #[test]
    fn an_unexpected_code_is_kept_not_refused() {
        let status: TransactionStatus = serde_json::from_str("-42").unwrap();
        assert_eq!(status, TransactionStatus::Unknown(-42));
        assert!(!status.is_final() && !status.is_failure());
        assert_eq!(serde_json::to_string(&status).unwrap(), "-42");
    }

    #[test]
    fn a_whole_float_code_is_that_code_and_a_fraction_is_refused() {
        assert_eq!(
            serde_json::from_str::<TransactionStatus>("4.0").unwrap(),
            TransactionStatus::Success
        );
        assert_eq!(
            serde_json::from_str::<TransactionType>("-0.0").unwrap(),
            TransactionType::from_code(0)
        );
        assert_eq!(
            serde_json::from_str::<TransactionStatus>("4e0").unwrap(),
            TransactionStatus::Success
        );
        // Read through f64, each of these was a whole code (4, -1, 2): a success, a
        // cancellation, a withdrawal.
        for refused in [
            "4.5",
            "2147483648.0",
            "\" 4\"",
            "3.9999999999999999",
            "-0.9999999999999999999",
            "1.99999999999999999",
        ] {
            assert!(
                serde_json::from_str::<TransactionStatus>(refused).is_err(),
                "{refused}"
            );
        }
    }

    #[test]
    fn a_numeric_string_code_is_accepted() {
        assert_eq!(
            serde_json::from_str::<TransactionStatus>("\"4\"").unwrap(),
            TransactionStatus::Success
        );
    }

    #[test]
    fn a_code_outside_i32_or_of_the_wrong_type_is_an_error() {
        assert!(serde_json::from_str::<TransactionStatus>("4294967296").is_err());
        assert!(serde_json::from_str::<TransactionStatus>("true").is_err());
        assert!(serde_json::from_str::<TransactionType>("1.5").is_err());
    }

    #[test]
    fn transaction_types_are_tolerant() {
        assert_eq!(
            serde_json::from_str::<TransactionType>("1").unwrap(),
            TransactionType::Deposit
        );
        assert_eq!(
            serde_json::from_str::<TransactionType>("3").unwrap(),
            TransactionType::Unknown(3)
        );
    }
}
