//! Fault injection: the simulator behaves like a hostile or unlucky network, and says
//! whether the merchant answered as a correct receiver does.
//!
//! | fault | what is sent | a correct receiver |
//! |---|---|---|
//! | `duplicate` | the same signed request, again and again | answers 2xx every time (and books once) |
//! | `concurrent` | the same signed request, several at the same moment | answers 2xx to all (and books once) |
//! | `tamper-body` | a byte of the body changed after signing, then the genuine request | refuses the forgery with 401, then accepts the genuine one as new (2xx, not "already processed") |
//! | `tamper-signature` | a character of the signature changed, then the genuine request | refuses the forgery with 401, then accepts the genuine one as new (2xx, not "already processed") |
//! | `wrong-key` | signed with a key the merchant does not know, then the genuine request | refuses the forgery with 401, then accepts the genuine one as new (2xx, not "already processed") |
//! | `reorder` | a success (4), then the failure (-3) that came before it, delivered late (its `updatedUtc` a minute older) | acknowledges both (2xx); its booking keeps the success (a result older than the one booked must not replace it — not seen from outside: a test of the merchant's own checks it) |
//! | `slow-body` | the body trickled out over a while | answers — 2xx, or 408 when it gives up — and never hangs |
//! | `drop-mid-request` | half the body, then the connection closed; then the whole request | answers the whole request 2xx |
//! | `reuse-nonce` | a request, then the same nonce with another amount | accepts the first (2xx); validation: 403 to the second; callback: no second booking (2xx "already processed" or a 4xx) |

use bytes::Bytes;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::SimError;
use super::request::{Payment, RequestKind, set_times, to_text};
use super::trigger::{Exchange, Trigger};
use crate::model::TransactionStatus;
use crate::signature::{SigningKey, generate_key_pair};

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The same request `n` times in a row.
    Duplicate(u32),
    /// The same request `n` times at once.
    Concurrent(u32),
    /// A body byte changed after signing, then the genuine request.
    TamperBody,
    /// A signature character changed, then the genuine request.
    TamperSignature,
    /// Signed with an unknown key, then the genuine request.
    WrongKey,
    /// A success, then the older failure of the same nonce, delivered late (callbacks).
    Reorder,
    /// The body sent slowly over this long.
    SlowBody(Duration),
    /// The connection dropped half-way through the body, then the request again.
    DropMidRequest,
    /// The nonce again for another payment: another amount, and the aggregator's ids of
    /// that payment (validation id, transaction id, reference id).
    ReuseNonce,
}

/// What the merchant answered to a fault, and whether a correct receiver answers so.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The fault.
    pub fault: Fault,
    /// What a correct receiver does.
    pub expected: &'static str,
    /// Each answer, in order: status (or why none) and message.
    pub answers: Vec<String>,
    /// Whether the answers are what a correct receiver gives.
    pub correct: bool,
}

fn summary(exchange: &Exchange) -> String {
    match (exchange.status, &exchange.error) {
        (Some(status), _) => format!(
            "{status} {}",
            exchange.message().unwrap_or_else(|| exchange.body.clone())
        ),
        (None, Some(error)) => format!("no answer: {error}"),
        (None, None) => "no answer".into(),
    }
}

/// Injects `fault` into requests of `kind` for `payment` sent to `url`.
///
/// # Errors
///
/// [`SimError::Request`] when the fault needs a signing key and the trigger has none, when
/// it does not apply to `kind`, or when a raw connection cannot be made.
pub async fn inject(
    trigger: &Trigger,
    url: &str,
    kind: RequestKind,
    payment: &Payment,
    fault: Fault,
) -> Result<Verdict, SimError> {
    let body = to_text(&payment.body(kind));
    let signature = |body: &str| -> Result<Option<(http::HeaderName, String)>, SimError> {
        trigger
            .signer()
            .map(|s| Ok((s.header().clone(), s.value(body.as_bytes())?)))
            .transpose()
    };
    let needs_signer = || {
        trigger
            .signer()
            .ok_or_else(|| SimError::request(format!("{fault:?} needs a signing key (--key)")))
    };
    let (expected, exchanges, correct): (&'static str, Vec<Exchange>, Judge) = match fault {
        Fault::Duplicate(n) => {
            let mut all = Vec::new();
            for _ in 0..n.max(2) {
                all.push(trigger.send(url, body.as_bytes()).await?);
            }
            ("2xx every time", all, all_success)
        }
        Fault::Concurrent(n) => {
            let sends = (0..n.max(2)).map(|_| trigger.send(url, body.as_bytes()));
            let all = futures_util::future::join_all(sends)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?;
            ("2xx to every copy", all, all_success)
        }
        // Each of these sends the forged request, then the genuine one: a receiver that
        // refuses both (the wrong key configured, every request refused) tells nothing by
        // refusing the forgery, and one that held the nonce as seen after the forgery
        // refuses the aggregator's own retry; neither is judged correct.
        Fault::TamperBody => {
            let signed = signature(&body)?;
            needs_signer()?;
            let tampered = tamper_body(&body);
            let forged = trigger
                .send_with(url, tampered.as_bytes(), signed.clone())
                .await?;
            let genuine = trigger.send_with(url, body.as_bytes(), signed).await?;
            (
                FORGED_401_THEN_GENUINE,
                vec![forged, genuine],
                forged_401_then_genuine,
            )
        }
        Fault::TamperSignature => {
            let signer = needs_signer()?;
            let value = tamper_signature(&signer.value(body.as_bytes())?);
            let forged = trigger
                .send_with(url, body.as_bytes(), Some((signer.header().clone(), value)))
                .await?;
            let genuine = trigger.send(url, body.as_bytes()).await?;
            (
                FORGED_401_THEN_GENUINE,
                vec![forged, genuine],
                forged_401_then_genuine,
            )
        }
        Fault::WrongKey => {
            let signer = needs_signer()?;
            let algorithm = signer.algorithm();
            let pair = generate_key_pair(algorithm)
                .map_err(|e| SimError::request("cannot make a stranger's key").because(e))?;
            let stranger = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), algorithm)
                .map_err(|e| SimError::request("cannot read the stranger's key").because(e))?;
            let value = signer.with_key(stranger).value(body.as_bytes())?;
            let forged = trigger
                .send_with(url, body.as_bytes(), Some((signer.header().clone(), value)))
                .await?;
            let genuine = trigger.send(url, body.as_bytes()).await?;
            (
                FORGED_401_THEN_GENUINE,
                vec![forged, genuine],
                forged_401_then_genuine,
            )
        }
        Fault::Reorder => {
            if kind != RequestKind::Callback {
                return Err(SimError::request("reorder applies to callbacks"));
            }
            let success = Payment {
                status: TransactionStatus::Success,
                ..payment.clone()
            };
            let failure = Payment {
                status: TransactionStatus::GenericPaymentSystemError,
                ..payment.clone()
            };
            // One transaction, created two minutes ago: it failed a minute ago, and that
            // failure's delivery was still being retried when its success (now) was
            // delivered.
            let now = chrono::Utc::now();
            let created = now - chrono::Duration::minutes(2);
            let mut newer = success.body(kind);
            set_times(&mut newer, created, now);
            let mut late = failure.body(kind);
            set_times(&mut late, created, now - chrono::Duration::minutes(1));
            let mut all = Vec::new();
            for body in [to_text(&newer), to_text(&late)] {
                all.push(trigger.send(url, body.as_bytes()).await?);
            }
            (
                "2xx to both: the late failure is acknowledged, and must not undo the success \
                 (its updatedUtc is older)",
                all,
                all_success,
            )
        }
        Fault::SlowBody(spread) => {
            let signed = signature(&body)?;
            let exchange = raw(url, &body, trigger, signed, Delivery::Slow(spread)).await?;
            (
                "an answer (2xx, or 408 when it gives up), never a hang",
                vec![exchange],
                answered_2xx_or_408,
            )
        }
        Fault::DropMidRequest => {
            let signed = signature(&body)?;
            let dropped = raw(url, &body, trigger, signed, Delivery::DropHalfway).await?;
            let again = trigger.send(url, body.as_bytes()).await?;
            (
                "the whole request afterwards answered 2xx",
                vec![dropped, again],
                last_success,
            )
        }
        Fault::ReuseNonce => {
            let first = trigger.send(url, body.as_bytes()).await?;
            // Another payment under the same nonce, as the aggregator would send it: ids of
            // its own (a retry of the first would keep them) and another amount. Under the
            // first one's ids, a receiver that tells payments apart by those ids — and
            // would approve the second payment — passed.
            let fresh = Payment::default();
            let other = Payment {
                amount: payment.amount + rust_decimal::Decimal::ONE,
                validation_id: fresh.validation_id,
                transaction_id: fresh.transaction_id,
                reference_id: fresh.reference_id,
                ..payment.clone()
            };
            let second = trigger
                .send(url, to_text(&other.body(kind)).as_bytes())
                .await?;
            match kind {
                RequestKind::TransactionValidation => (
                    "the first allowed (2xx), the second 403",
                    vec![first, second],
                    second_403,
                ),
                RequestKind::Callback => (
                    "the first acknowledged (2xx), then no second booking: 2xx \"already \
                     processed\" or a 4xx",
                    vec![first, second],
                    not_booked_twice,
                ),
                RequestKind::ProvidersValidation => {
                    return Err(SimError::request(
                        "reuse-nonce applies to transaction validations and callbacks",
                    ));
                }
            }
        }
    };
    Ok(Verdict {
        fault,
        expected,
        correct: correct(&exchanges),
        answers: exchanges.iter().map(summary).collect(),
    })
}

/// Whether a fault's answers are what a correct receiver gives.
type Judge = fn(&[Exchange]) -> bool;

fn all_success(all: &[Exchange]) -> bool {
    all.iter().all(Exchange::is_success)
}

/// What a correct receiver answers to a forged request and then the genuine one.
const FORGED_401_THEN_GENUINE: &str = "the forged request 401, then the genuine one accepted \
     (2xx, and not as one already processed: the forgery must leave no trace)";

/// The forgery refused with 401, and the genuine request then accepted as new: a 2xx
/// whose message does not say "already". A receiver that marked the nonce as seen before
/// it checked the forgery's signature answers the aggregator's genuine request as a
/// duplicate, and never books it; one that answers it 4xx or 5xx has not taken it either.
fn forged_401_then_genuine(all: &[Exchange]) -> bool {
    matches!(all, [forged, genuine]
        if forged.status == Some(401) && genuine.is_success() && !said_already(genuine))
}

/// Whether the answer's message says the request was processed already.
fn said_already(exchange: &Exchange) -> bool {
    exchange
        .message()
        .is_some_and(|m| m.to_ascii_lowercase().contains("already"))
}

fn answered_2xx_or_408(all: &[Exchange]) -> bool {
    all.iter().all(|e| e.is_success() || e.status == Some(408))
}

fn last_success(all: &[Exchange]) -> bool {
    all.last().is_some_and(Exchange::is_success)
}

/// The first request accepted: without it, a refusal of the second proves nothing (a
/// receiver that refuses everything refuses it too).
fn first_accepted(all: &[Exchange]) -> bool {
    all.first().is_some_and(Exchange::is_success)
}

fn second_403(all: &[Exchange]) -> bool {
    first_accepted(all) && all.get(1).is_some_and(|e| e.status == Some(403))
}

fn not_booked_twice(all: &[Exchange]) -> bool {
    first_accepted(all)
        && all.get(1).is_some_and(|e| {
            e.status.is_some_and(|s| (400..500).contains(&s)) || (e.is_success() && said_already(e))
        })
}

/// The body with one digit of its amount changed (or else its last byte).
fn tamper_body(body: &str) -> String {
    let mut bytes = body.as_bytes().to_vec();
    let index = body
        .find("\"amount\":")
        .map(|i| i + "\"amount\":".len())
        .filter(|&i| bytes.get(i).is_some_and(u8::is_ascii_digit))
        .unwrap_or(bytes.len().saturating_sub(2));
    if let Some(byte) = bytes.get_mut(index) {
        *byte = if *byte == b'9' {
            b'1'
        } else {
            byte.saturating_add(1)
        };
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The signature with one character changed (staying in its alphabet): to another letter
/// whatever its case, since hex is read in either case (`a` and `A` are the same digit).
fn tamper_signature(signature: &str) -> String {
    let mut chars: Vec<char> = signature.chars().collect();
    let middle = chars.len() / 2;
    if let Some(c) = chars.get_mut(middle) {
        *c = if c.eq_ignore_ascii_case(&'a') {
            'B'
        } else {
            'A'
        };
    }
    chars.into_iter().collect()
}

/// How a raw request's body goes out.
enum Delivery {
    /// Trickled over this long.
    Slow(Duration),
    /// Half of it, then the connection closed.
    DropHalfway,
}

/// One request over a raw connection (plain `http://` only), to control how the body goes;
/// with `trigger`'s headers (`-H`, a shared secret say) and `signature`.
async fn raw(
    url: &str,
    body: &str,
    trigger: &Trigger,
    signature: Option<(http::HeaderName, String)>,
    delivery: Delivery,
) -> Result<Exchange, SimError> {
    let uri = crate::gateway::parse_http_url(url).map_err(SimError::request)?;
    if uri.scheme_str() != Some("http") {
        return Err(SimError::request(
            "slow-body and drop-mid-request need a plain http:// endpoint",
        ));
    }
    let host = uri.host().unwrap_or("127.0.0.1");
    let port = uri.port_u16().unwrap_or(80);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    // What is printed: the head with credentials redacted, as `Trigger::send` prints it.
    let mut shown = head.clone();
    for (name, value) in trigger.headers() {
        head.push_str(&format!(
            "{name}: {}\r\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
        let value = crate::handler::RequestContext::shown_value(name, value);
        shown.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some((name, value)) = &signature {
        head.push_str(&format!("{name}: {value}\r\n"));
        shown.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    shown.push_str("\r\n");
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| SimError::request(format!("cannot connect to {host}:{port}")).because(e))?;
    let io = |e: std::io::Error| e.to_string();
    let outcome: Result<Option<Bytes>, String> = async {
        stream.write_all(head.as_bytes()).await.map_err(io)?;
        match delivery {
            Delivery::DropHalfway => {
                stream
                    .write_all(&body.as_bytes()[..body.len() / 2])
                    .await
                    .map_err(io)?;
                stream.shutdown().await.map_err(io)?;
                drop(stream);
                Ok(None)
            }
            Delivery::Slow(spread) => {
                let chunks = body.len().clamp(1, 20);
                let pause = spread / u32::try_from(chunks).unwrap_or(20);
                for chunk in body.as_bytes().chunks(body.len().div_ceil(chunks)) {
                    // The server may answer (408) and close before the body is done.
                    if stream.write_all(chunk).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                }
                let mut answer = Vec::new();
                let read = tokio::time::timeout(
                    spread + Duration::from_secs(60),
                    stream.read_to_end(&mut answer),
                );
                let _ = read.await.map_err(|_| "no answer".to_owned())?;
                Ok(Some(Bytes::from(answer)))
            }
        }
    }
    .await;
    let latency = started.elapsed();
    let (status, answer, error) = match outcome {
        Ok(Some(bytes)) => parse_answer(&bytes),
        Ok(None) => (
            None,
            String::new(),
            Some("connection closed by us half-way (as intended)".to_owned()),
        ),
        Err(error) => (None, String::new(), Some(error)),
    };
    Ok(Exchange {
        request: format!("{shown}{body}").replace("\r\n", "\n"),
        status,
        latency,
        body: answer,
        error,
    })
}

/// The status and body of a raw HTTP/1.1 answer.
fn parse_answer(bytes: &[u8]) -> (Option<u16>, String, Option<String>) {
    let text = String::from_utf8_lossy(bytes);
    let status = text
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok());
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    match status {
        Some(status) => (Some(status), body, None),
        None => (
            None,
            String::new(),
            Some("no HTTP answer before the connection closed".into()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tampered_signature_decodes_to_other_bytes_in_every_encoding() {
        use crate::signature::Encoding;
        for signature in ["00a0", "00A0", "0aaa", "AAAA", "aaaa", "0b0b", "ab+/"] {
            let tampered = tamper_signature(signature);
            assert_ne!(
                tampered.to_ascii_lowercase(),
                signature.to_ascii_lowercase(),
                "{signature}"
            );
            for encoding in [Encoding::Hex, Encoding::Base64] {
                if let (Ok(before), Ok(after)) =
                    (encoding.decode(signature), encoding.decode(&tampered))
                {
                    assert_ne!(before, after, "{signature} {encoding:?}");
                }
            }
        }
    }

    #[test]
    fn tampering_changes_exactly_one_character() {
        let body = r#"{"amount":10.00,"currency":"EUR"}"#;
        let tampered = tamper_body(body);
        assert_eq!(tampered, r#"{"amount":20.00,"currency":"EUR"}"#);
        let signature = "abcdefgh==";
        let changed = tamper_signature(signature);
        assert_eq!(changed.len(), signature.len());
        assert_eq!(
            changed
                .chars()
                .zip(signature.chars())
                .filter(|(a, b)| a != b)
                .count(),
            1
        );
    }

    #[test]
    fn raw_answers_are_parsed() {
        let (status, body, error) =
            parse_answer(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 2\r\n\r\n{}");
        assert_eq!((status, body.as_str(), error), (Some(408), "{}", None));
        assert_eq!(parse_answer(b"").0, None);
    }
}
