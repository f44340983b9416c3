//! The OpenAPI document of the merchant-hosted endpoints, as one configuration serves them:
//! the shipped document ([`OPENAPI`], payhook's defaults) with the configured paths, each
//! endpoint's authentication, the signature header and the identifier limit put in. What the
//! aggregator's integrators read should be what this service answers.

use serde_json::{Value, json};

use crate::auth::{AuthMethod, EndpointAuthConfig};
use crate::config::Config;
use crate::signature::SignatureConfig;

/// The OpenAPI 3.1 document of the merchant-hosted endpoints as payhook serves them with
/// its defaults, as shipped (`openapi/merchant-endpoints.json`).
pub const OPENAPI: &str = include_str!("../../openapi/merchant-endpoints.json");

/// The shipped document's path of each endpoint (payhook's default paths).
const SHIPPED_PATHS: [&str; 3] = [
    "/payhook/providers-validation",
    "/payhook/transaction-validation",
    "/payhook/callback",
];

/// The sentence of the shipped document's description that says it describes the defaults.
const SHIPPED_SAYS: &str = "Paths are payhook's defaults (configurable), as are each endpoint's authentication, the signature header and the identifier and body limits: `payhook openapi` prints this document as the merchant's configuration serves them (`--shipped`: as here).";

/// The OpenAPI document of the endpoints as `config` serves them: its paths, the
/// authentication of each validation endpoint (`[auth]`) and of the callback (signed, unless
/// `callback.allow_unsigned` with no key to verify), the signature header, `server.max_identifier_chars` and
/// `server.body_limit`. `payhook openapi` prints it for the configuration it reads.
///
/// ```
/// let mut config = payhook::Config::default();
/// config.paths.callback = "/shop/aggregator/callback".into();
/// config.signature.header = "X-Aggregator-Signature".into();
/// let doc = payhook::server::openapi(&config);
/// assert!(doc["paths"]["/shop/aggregator/callback"]["post"].is_object());
/// assert_eq!(
///     doc["components"]["securitySchemes"]["aggregatorSignature"]["name"],
///     "X-Aggregator-Signature"
/// );
/// ```
#[must_use]
pub fn openapi(config: &Config) -> Value {
    // The shipped document is part of the crate and checked by its tests: it parses.
    let mut doc: Value = serde_json::from_str(OPENAPI).unwrap_or_default();
    let paths = [
        &config.paths.providers_validation,
        &config.paths.transaction_validation,
        &config.paths.callback,
    ];
    place(&mut doc, paths);
    let mut used = vec![describe_signature(&mut doc, &config.signature)];
    let validations = [
        (
            &config.auth.providers_validation,
            paths[0],
            "providers_validation",
            "Providers",
        ),
        (
            &config.auth.transaction_validation,
            paths[1],
            "transaction_validation",
            "Transaction",
        ),
    ];
    for (auth, path, section, scheme) in validations {
        let requirement = requirement(&mut doc["components"]["securitySchemes"], auth, scheme);
        used.extend(requirement.keys().cloned());
        let operation = &mut doc["paths"][path.as_str()]["post"];
        operation["security"] = json!([requirement]);
        describe_unauthorized(operation, auth, config.signature.header.trim());
        if !auth.allow_ips.is_empty() {
            note(
                operation,
                &format!(
                    "Answered only to the networks of auth.{section}.allow_ips; any other address gets 403."
                ),
            );
        }
    }
    // Unsigned callbacks are taken only where no key could verify one: with keys, every
    // callback must be signed, callback.allow_unsigned or not.
    let unsigned = config.callback.allow_unsigned && config.signature.keys.is_empty();
    let callback = &mut doc["paths"][paths[2].as_str()]["post"];
    callback["security"] = if unsigned {
        json!([{}])
    } else {
        json!([{"aggregatorSignature": []}])
    };
    if let Some(responses) = callback["responses"].as_object_mut() {
        if unsigned {
            // Nothing is asked of the caller: nothing is refused as unauthorized.
            responses.remove("401");
        } else if let Some(unauthorized) = responses.get_mut("401") {
            unauthorized["description"] = json!(format!(
                "Missing, malformed or invalid signature in {}.",
                config.signature.header.trim()
            ));
        }
    }
    if let Some(schemes) = doc["components"]["securitySchemes"].as_object_mut() {
        schemes.retain(|name, _| used.contains(name));
    }
    if config.server.metrics_allow_ips.is_empty()
        && let Some(paths) = doc["paths"].as_object_mut()
    {
        // An empty list removes the route.
        paths.remove("/metrics");
    }
    limit_identifiers(&mut doc, config.server.max_identifier_chars);
    let description = doc["info"]["description"]
        .as_str()
        .unwrap_or_default()
        .replace(
            SHIPPED_SAYS,
            &format!(
                "Rendered by `payhook openapi` from the merchant's configuration: its paths, each endpoint's authentication, its signature header, identifiers of at most {} characters (server.max_identifier_chars) and bodies of at most {} bytes (server.body_limit).",
                config.server.max_identifier_chars, config.server.body_limit
            ),
        );
    doc["info"]["description"] = json!(description);
    doc
}

/// Moves the operations of the shipped paths to `configured` (providers validation,
/// transaction validation, callback). Every shipped path is taken out before any is put
/// back: a configuration may swap two of them.
fn place(doc: &mut Value, configured: [&String; 3]) {
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    let operations: Vec<Value> = SHIPPED_PATHS
        .iter()
        .map(|path| paths.remove(*path).unwrap_or_default())
        .collect();
    for (path, operation) in configured.into_iter().zip(operations) {
        paths.insert(path.clone(), operation);
    }
}

/// Describes the signature's scheme as `signature` configures it — its header as the server
/// reads it (trimmed), its prefix, algorithm and encoding; returns the scheme's name.
fn describe_signature(doc: &mut Value, signature: &SignatureConfig) -> String {
    let (algorithm, encoding) = (signature.algorithm.name(), signature.encoding.name());
    let header = signature.header.trim();
    let prefix = if signature.prefix.is_empty() {
        String::new()
    } else {
        format!(", after `{}`", signature.prefix)
    };
    let scheme = &mut doc["components"]["securitySchemes"]["aggregatorSignature"];
    scheme["name"] = json!(header);
    scheme["description"] = json!(format!(
        "The aggregator's signature of the raw request body in {header}{prefix}: {algorithm} \
         (unless a key names its own), {encoding}. Required on callbacks unless the service \
         takes them unsigned (callback.allow_unsigned with no key); on validations whose auth \
         method is `signature`."
    ));
    "aggregatorSignature".to_owned()
}

/// The security requirement of a validation endpoint authenticated by `auth`: no
/// credentials (`{}`), the signature, HTTP Basic, or its shared-secret header — a scheme of
/// its own (`sharedSecret{name}`, the shipped `sharedSecret` with the configured header)
/// written into `schemes`.
fn requirement(
    schemes: &mut Value,
    auth: &EndpointAuthConfig,
    name: &str,
) -> serde_json::Map<String, Value> {
    let scheme = match auth.method {
        AuthMethod::None => return serde_json::Map::new(),
        AuthMethod::Signature => "aggregatorSignature".to_owned(),
        AuthMethod::Basic => "basic".to_owned(),
        AuthMethod::SharedSecret => {
            let scheme = format!("sharedSecret{name}");
            let mut shared = schemes["sharedSecret"].clone();
            let header = auth.header.trim();
            shared["name"] = json!(header);
            shared["description"] = json!(format!(
                "A static secret in {header}, compared in constant time."
            ));
            schemes[scheme.as_str()] = shared;
            scheme
        }
    };
    let mut requirement = serde_json::Map::new();
    requirement.insert(scheme, json!([]));
    requirement
}

/// The 401 answer of a validation endpoint as `auth` refuses (`signature_header`: where a
/// signature is read): none for an endpoint that asks for nothing, and the header
/// `WWW-Authenticate` only where the server sends it (Basic).
fn describe_unauthorized(operation: &mut Value, auth: &EndpointAuthConfig, signature_header: &str) {
    let Some(responses) = operation["responses"].as_object_mut() else {
        return;
    };
    let said = match auth.method {
        AuthMethod::None => {
            responses.remove("401");
            return;
        }
        AuthMethod::Signature => {
            format!("Missing, malformed or invalid signature in {signature_header}.")
        }
        AuthMethod::SharedSecret => format!("Missing or wrong secret in {}.", auth.header.trim()),
        AuthMethod::Basic => "Missing or wrong HTTP Basic credentials.".to_owned(),
    };
    let Some(unauthorized) = responses.get_mut("401") else {
        return;
    };
    unauthorized["description"] = json!(said);
    if auth.method == AuthMethod::Basic {
        unauthorized["headers"]["WWW-Authenticate"]["description"] =
            json!("Basic realm=\"payhook\"");
    } else if let Some(fields) = unauthorized.as_object_mut() {
        fields.remove("headers");
    }
}

/// Adds `sentence` to `operation`'s description.
fn note(operation: &mut Value, sentence: &str) {
    let described = operation["description"].as_str().unwrap_or_default();
    operation["description"] = json!(format!("{described} {sentence}").trim().to_owned());
}

/// Sets every identifier's `maxLength` (the ones the document ties to
/// `server.max_identifier_chars`) to `max_chars`.
fn limit_identifiers(value: &mut Value, max_chars: usize) {
    match value {
        Value::Object(object) => {
            let identifier = object
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| d.contains("server.max_identifier_chars"));
            if identifier && object.contains_key("maxLength") {
                object.insert("maxLength".to_owned(), json!(max_chars));
            }
            object
                .values_mut()
                .for_each(|v| limit_identifiers(v, max_chars));
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| limit_identifiers(v, max_chars)),
        _ => {}
    }
}
