//! One list of settings: the keys the configuration types accept (what validation knows) are
//! exactly the keys of the README's configuration table, and each row names the environment
//! variable that sets its key. A key added to a section without a README row, or a row for a
//! key that no longer exists, fails here.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::Config;
use payhook::config::KeySource;
use std::collections::BTreeSet;
use std::time::Duration;

const ENDPOINTS: [&str; 2] = ["providers_validation", "transaction_validation"];

/// A configuration with every optional setting present, so that serializing it writes every
/// key the types know.
fn every_setting_set() -> Config {
    let mut config = Config::default();
    config.gateway.auth_url = Some("https://auth.example".into());
    config.gateway.gateway_url = Some("https://gateway.example".into());
    config.gateway.username = Some("merchant".into());
    config.gateway.password = Some("password".into());
    config.gateway.proxy = Some("http://proxy.example:3128".into());
    config.gateway.no_proxy = Some("internal.example".into());
    config.gateway.ca_file = Some("ca.pem".into());
    config.gateway.client_cert_file = Some("client.pem".into());
    config.gateway.client_key_file = Some("client-key.pem".into());
    config.validation.deadline = Some(Duration::from_secs(60));
    config.store.url = Some("postgres://db.example/payments".into());
    config.admin.token = Some("a-token-of-sixteen-chars".into());
    config.admin.session_secret = Some("a-secret-of-at-least-32-characters".into());
    config
        .admin
        .operators
        .insert("alice".into(), format!("sha256:{}", "ab".repeat(32)));
    config.admin.viewers = vec!["alice".into()];
    config.signature.keys = vec![KeySource {
        value: Some("key".into()),
        ..KeySource::default()
    }];
    for endpoint in [
        &mut config.auth.providers_validation,
        &mut config.auth.transaction_validation,
    ] {
        // A credential is taken only with a method that asks for one.
        endpoint.method = payhook::config::AuthMethod::SharedSecret;
        endpoint.secret = Some("secret-0123456789".into());
        endpoint.username = Some("user".into());
        endpoint.password = Some("password-0123456789".into());
    }
    config
}

/// Settings that are maps of names the configuration chooses (`admin.operators`): leaves
/// themselves, whatever names they hold.
const MAPS: [&str; 1] = ["admin.operators"];

/// Dotted paths of the leaves of `table`; arrays (`signature.keys`) and [`MAPS`] are leaves.
fn leaves(table: &toml::Table, prefix: &str, out: &mut BTreeSet<String>) {
    for (name, value) in table {
        let path = format!("{prefix}{name}");
        match value {
            toml::Value::Table(inner) if !MAPS.contains(&path.as_str()) => {
                leaves(inner, &format!("{path}."), out);
            }
            _ => {
                out.insert(path);
            }
        }
    }
}

fn keys_of_the_types() -> BTreeSet<String> {
    let text = every_setting_set().to_toml_redacted().unwrap();
    let mut keys = BTreeSet::new();
    leaves(&text.parse().unwrap(), "", &mut keys);
    keys
}

/// One row of the README's table: its keys and its environment variables, `<endpoint>`
/// spelled out, and a cell's shorthand (`auth.<endpoint>.username`, `password`;
/// `PAYHOOK_GATEWAY_AUTH_HEADER`, `_AUTH_SCHEME`) completed from the first name of the cell.
struct Row {
    keys: Vec<String>,
    variables: Vec<String>,
}

fn backticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn readme_rows() -> Vec<Row> {
    let readme = include_str!("../README.md");
    let start = readme.find("\n## Configuration").unwrap();
    let table = readme[start..]
        .lines()
        .skip_while(|line| !line.starts_with("| key |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'));
    let mut rows = Vec::new();
    for line in table {
        let cells: Vec<&str> = line.split(" | ").collect();
        let (first, last) = (cells[0].trim_start_matches("| "), cells[cells.len() - 1]);
        let mut keys = Vec::new();
        // The keys come before any explanation in parentheses.
        let names = backticked(first.split(" (").next().unwrap());
        let parent = names[0].rsplit_once('.').unwrap().0;
        for name in &names {
            let full = if name.contains('.') {
                (*name).to_owned()
            } else {
                format!("{parent}.{name}")
            };
            keys.extend(spelled_out(&full, "<endpoint>", false));
        }
        let mut variables = Vec::new();
        let names = backticked(last);
        let first_variable = names[0].split('=').next().unwrap();
        for name in &names {
            let name = name.split('=').next().unwrap();
            let full = match name.strip_prefix('_') {
                Some(tail) => {
                    let parts: Vec<&str> = first_variable.split('_').collect();
                    let replaced = tail.split('_').count();
                    format!("{}_{tail}", parts[..parts.len() - replaced].join("_"))
                }
                None => name.to_owned(),
            };
            variables.extend(spelled_out(&full, "<ENDPOINT>", true));
        }
        rows.push(Row { keys, variables });
    }
    rows
}

fn spelled_out(name: &str, placeholder: &str, upper: bool) -> Vec<String> {
    if !name.contains(placeholder) {
        return vec![name.to_owned()];
    }
    ENDPOINTS
        .iter()
        .map(|endpoint| {
            let endpoint = if upper {
                endpoint.to_ascii_uppercase()
            } else {
                (*endpoint).to_owned()
            };
            name.replace(placeholder, &endpoint)
        })
        .collect()
}

#[test]
fn the_readme_table_lists_exactly_the_keys_the_configuration_accepts() {
    let documented: BTreeSet<String> = readme_rows().into_iter().flat_map(|r| r.keys).collect();
    let accepted = keys_of_the_types();
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "keys the configuration accepts but the README's table lacks: {undocumented:?}; \
         rows of the table for keys that do not exist: {unknown:?}"
    );
    // The table counts every key once.
    let rows = readme_rows();
    let listed: usize = rows.iter().map(|r| r.keys.len()).sum();
    assert_eq!(listed, documented.len(), "a key has two rows");
}

#[test]
fn each_row_names_the_variable_of_each_of_its_keys() {
    for row in readme_rows() {
        let expected: Vec<String> = row
            .keys
            .iter()
            .map(|key| format!("PAYHOOK_{}", key.replace('.', "_").to_ascii_uppercase()))
            .collect();
        assert_eq!(row.variables, expected, "row of {:?}", row.keys);
    }
}

#[test]
fn every_key_the_configuration_writes_it_reads_back_and_no_other() {
    // The keys derived above are the ones loading accepts: the fully set configuration,
    // written as TOML (secrets given real values), loads; a key beside them does not.
    let text = every_setting_set()
        .to_toml_redacted()
        .unwrap()
        .replace(
            "\"<redacted>\"",
            "\"a-secret-of-more-than-thirty-two-chars\"",
        )
        // The store's address is a secret that must also be a PostgreSQL address.
        .replace(
            "\nurl = \"a-secret-of-more-than-thirty-two-chars\"",
            "\nurl = \"postgres://db.example/payments\"",
        );
    let read = Config::from_toml(&text).unwrap();
    assert_eq!(read.server, every_setting_set().server);
    assert_eq!(read.validation, every_setting_set().validation);
    let headers: Vec<&str> = text.lines().filter(|line| line.starts_with('[')).collect();
    assert!(headers.len() >= 9, "{headers:?}");
    for header in headers {
        let header = format!("\n{header}\n");
        let unknown =
            format!("\n{text}").replacen(&header, &format!("{header}unknown_key = 1\n"), 1);
        let error = Config::from_toml(&unknown).unwrap_err().to_string();
        assert!(error.contains("unknown_key"), "{header}: {error}");
    }
}
