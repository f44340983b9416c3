//! Finding an unknown signature scheme from one captured request.
//!
//! Given the aggregator's public key(s) and a real signed request, [`sniff`] tries every
//! header × prefix × encoding × algorithm the key can verify, and reports each combination
//! that verifies. One match is the scheme to configure.

use super::{Algorithm, Encoding, Error, MAX_HEADER_LEN, PublicKey};

/// A combination that verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniffMatch {
    /// The header that carries the signature.
    pub header: String,
    /// The scheme prefix in front of the signature (empty when none).
    pub prefix: String,
    /// The signature's encoding.
    pub encoding: Encoding,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The id of the key that verified, if it has one.
    pub key_id: Option<String>,
}

impl SniffMatch {
    /// The `[signature]` configuration for this scheme.
    pub fn config_snippet(&self) -> String {
        format!(
            "[signature]\nheader = \"{}\"\nalgorithm = \"{}\"\nencoding = \"{}\"\nprefix = \"{}\"",
            self.header, self.algorithm, self.encoding, self.prefix
        )
    }
}

/// Encodings tried; base64url with and without padding decode alike and are told apart by
/// the text afterwards.
const TRIED: [Encoding; 3] = [Encoding::Base64, Encoding::Base64Url, Encoding::Hex];

/// Every (header, prefix, encoding, algorithm, key) that verifies `body`.
///
/// ```
/// use payhook::signature::{Algorithm, Encoding, SigningKey, generate_key_pair, sniff};
///
/// let pair = generate_key_pair(Algorithm::Ed25519)?;
/// let signer = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), Algorithm::Ed25519)?;
/// let value = signer.header_value(b"{}", Encoding::Hex, Some("ed25519="))?;
/// let headers = [("Content-Type".to_owned(), "application/json".to_owned()), ("X-Sig".to_owned(), value)];
/// let found = sniff(&[signer.public_key()], &headers, b"{}");
/// assert_eq!(found.len(), 1);
/// assert_eq!((found[0].header.as_str(), found[0].prefix.as_str()), ("X-Sig", "ed25519="));
/// assert_eq!(found[0].encoding, Encoding::Hex);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sniff(keys: &[PublicKey], headers: &[(String, String)], body: &[u8]) -> Vec<SniffMatch> {
    let mut found = Vec::new();
    for (name, value) in headers.iter().filter(|(_, v)| v.len() <= MAX_HEADER_LEN) {
        for (prefix, text) in candidates(value) {
            for encoding in TRIED {
                let Ok(signature) = encoding.decode(text) else {
                    continue;
                };
                for key in keys {
                    for algorithm in Algorithm::for_key(key.kind()) {
                        if key.verifies(algorithm, body, &signature) {
                            found.push(SniffMatch {
                                header: name.clone(),
                                prefix: prefix.to_owned(),
                                encoding: refine(encoding, text),
                                algorithm,
                                key_id: key.id().map(str::to_owned),
                            });
                        }
                    }
                }
            }
        }
    }
    found.dedup();
    found
}

/// The ways a header value may hold a signature: whole, or after a `name=` prefix, also
/// within a comma-separated list (`t=…,v1=…`).
fn candidates(value: &str) -> Vec<(&str, &str)> {
    let parts = std::iter::once(value).chain(value.split(',').filter(|_| value.contains(',')));
    let mut out = Vec::new();
    for part in parts {
        let part = part.trim();
        out.push(("", part));
        if let Some(at) = part.find('=')
            && at > 0
            && at + 1 < part.len()
            && part[..at]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            out.push((&part[..=at], &part[at + 1..]));
        }
    }
    out
}

/// Names base64url without padding when the text carries none (either setting reads it).
fn refine(encoding: Encoding, text: &str) -> Encoding {
    match encoding {
        Encoding::Base64Url if !text.ends_with('=') => Encoding::Base64UrlNoPad,
        other => other,
    }
}

/// A captured request: its headers in order, and its exact body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedRequest {
    /// Header names and values, as captured.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked when it was sent chunked.
    pub body: Vec<u8>,
}

/// Splits a captured raw HTTP/1.1 request (as `nc -l`, `tcpdump -A` or a proxy log shows
/// it) into its headers and its exact body bytes. `Content-Length` and chunked bodies are
/// read as the server would read them; line ends may be CRLF or LF.
///
/// # Errors
///
/// [`Error`] when there is no blank line after the headers or the body is cut.
///
/// ```
/// use payhook::signature::parse_raw_request;
///
/// let raw = b"POST /cb HTTP/1.1\r\nX-Signature: abc\r\nContent-Length: 2\r\n\r\n{}";
/// let captured = parse_raw_request(raw)?;
/// assert_eq!(captured.headers[0], ("X-Signature".to_owned(), "abc".to_owned()));
/// assert_eq!(captured.body, b"{}");
/// # Ok::<(), payhook::signature::Error>(())
/// ```
pub fn parse_raw_request(raw: &[u8]) -> Result<CapturedRequest, Error> {
    let error = |reason: &str| Error::RawRequest(reason.to_owned());
    let (head_end, separator) = find(raw, b"\r\n\r\n")
        .map(|at| (at, 4))
        .or_else(|| find(raw, b"\n\n").map(|at| (at, 2)))
        .ok_or_else(|| error("no blank line after the headers"))?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    if !request_line.contains("HTTP/") && !request_line.contains(':') {
        return Err(error("the first line is not a request line"));
    }
    let rest = &raw[head_end + separator..];
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let body = if header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        dechunk(rest).ok_or_else(|| error("the chunked body is cut or malformed"))?
    } else if let Some(length) = header("content-length") {
        let length: usize = length
            .parse()
            .map_err(|_| error("Content-Length is not a number"))?;
        rest.get(..length)
            .ok_or_else(|| error("the body is shorter than Content-Length"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(CapturedRequest { headers, body })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?.trim();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 1..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size..)?;
        rest = rest
            .strip_prefix(b"\r\n")
            .or_else(|| rest.strip_prefix(b"\n"))?;
    }
}
