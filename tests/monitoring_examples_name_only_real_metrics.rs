//! The example Grafana dashboard and Prometheus alerts (`examples/monitoring/`) and the
//! metrics table of `src/server/metrics.rs` name only metrics a running service exposes, and
//! the table names every one it exposes: a renamed metric cannot leave an alert silently
//! watching nothing.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::collections::BTreeSet;
use support::gateway::FakeGateway;
use support::*;

/// Each `payhook_…` name in `text`, with what stands inside the braces right after it (a
/// selector's matchers), if any.
fn mentions(text: &str) -> Vec<(String, Option<&str>)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("payhook_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        let inside = rest
            .strip_prefix('{')
            .and_then(|r| r.split_once('}'))
            .map(|(inside, _)| inside);
        found.push((name, inside));
    }
    found
}

/// `payhook_…` names in `text`.
fn names(text: &str) -> BTreeSet<String> {
    mentions(text).into_iter().map(|(name, _)| name).collect()
}

/// What the service exposes: metric families (from `# TYPE`), sample names, and each
/// sample's labels.
struct Exposed {
    families: BTreeSet<String>,
    samples: BTreeSet<String>,
    /// Per sample name, every `label=value` pair one of its samples carries.
    labels: std::collections::BTreeMap<String, BTreeSet<(String, String)>>,
}

impl Exposed {
    /// Whether a query may name `name`: a sample /metrics has — `payhook_x_total` for a
    /// counter, `payhook_x_bucket` for a histogram, never the bare family of either, which
    /// Prometheus holds no series of.
    fn has_sample(&self, name: &str) -> bool {
        self.samples.contains(name)
    }

    /// Whether a query's matcher `label` `op` `value` can select a sample of `name`: the
    /// label exists on it, and for `=` some sample has that value.
    fn matches(&self, name: &str, label: &str, op: &str, value: &str) -> bool {
        let pairs = self.labels.get(name);
        pairs.is_some_and(|pairs| match op {
            "=" => pairs.contains(&(label.to_owned(), value.to_owned())),
            _ => pairs.iter().any(|(l, _)| l == label),
        })
    }

    /// Whether the table may name `name`: a family, or one of its samples.
    fn has(&self, name: &str) -> bool {
        if self.samples.contains(name) || self.families.contains(name) {
            return true;
        }
        ["_bucket", "_sum", "_count", "_total"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .any(|family| self.families.contains(family))
    }
}

async fn exposed() -> Exposed {
    let gateway = FakeGateway::start().await;
    let mut config = test_config();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.admin.token = Some("admin-token-0123456789".into());
    config.validation.retry_schedule = vec![std::time::Duration::from_millis(20)];
    let server = TestServer::start_with(config).await;
    // Some traffic, so that every labelled family has a sample.
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    let id = server.postpone_validation().await;
    // Its result delivered on the second attempt: gateway calls, and one that failed.
    gateway.with(|state| state.fail_next.push_back(500));
    server
        .app
        .resolver()
        .unwrap()
        .resolve(id, payhook::Decision::allow("checked"))
        .await
        .unwrap();
    gateway
        .until("the result", |s| s.results.contains_key(&id))
        .await;
    let answer = server.send(&request("GET", "/metrics", &[], None)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = String::from_utf8(answer.body).unwrap();
    assert_eq!(text.lines().last(), Some("# EOF"), "{text}");
    let families = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect();
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    let mut labels: std::collections::BTreeMap<String, BTreeSet<(String, String)>> =
        Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, rest)) = line.split_once('{') {
            let set = labels.entry(name.to_owned()).or_default();
            let inside = rest.split_once('}').map_or("", |(inside, _)| inside);
            set.extend(matchers(inside).into_iter().map(|(l, _, v)| (l, v)));
        }
    }
    Exposed {
        families,
        samples,
        labels,
    }
}

/// One matcher of a selector: (label, operator, value).
type Matcher = (String, String, String);

/// The `label="value"`, `label!="value"` (and `=~`, `!~`) pairs inside one `{…}`.
fn matchers(inside: &str) -> Vec<Matcher> {
    let mut found = Vec::new();
    let mut rest = inside;
    while let Some(quote) = rest.find('"') {
        let head = rest[..quote].trim_start_matches([',', ' ']);
        let op_at = head.find(['=', '!']).unwrap_or(head.len());
        let (label, op) = head.split_at(op_at);
        let tail = &rest[quote + 1..];
        let end = tail.find('"').unwrap_or(tail.len());
        found.push((
            label.trim().to_owned(),
            op.trim().to_owned(),
            tail[..end].to_owned(),
        ));
        rest = tail.get(end + 1..).unwrap_or("");
    }
    found
}

/// The queries (`expr:`) of a Prometheus rules file, one- or many-lined (`expr: |`): not
/// the descriptions, which may name a metric in prose.
fn exprs(rules: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        if rest.trim() != "|" {
            found.push(rest.trim().to_owned());
            continue;
        }
        let mut block = Vec::new();
        while let Some(next) = lines.next_if(|l| l.len() - l.trim_start().len() > indent) {
            block.push(next.trim());
        }
        found.push(block.join(" "));
    }
    found
}

/// Each `payhook_…{…}` selector in the queries of `text`: the metric's name and the
/// matchers inside its braces.
fn selectors(text: &str) -> Vec<(String, Vec<Matcher>)> {
    mentions(text)
        .into_iter()
        .filter_map(|(name, inside)| inside.map(|inside| (name, matchers(inside))))
        .collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[tokio::test]
async fn the_dashboard_the_alerts_and_the_table_name_only_exposed_metrics_and_all_of_them() {
    let exposed = exposed().await;
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("examples/monitoring/payhook-dashboard.json")).unwrap();
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|target| target["expr"].as_str().map(str::to_owned))
        .collect();
    for (file, text) in [
        (
            "examples/monitoring/payhook-dashboard.json",
            queries.join("\n"),
        ),
        (
            "examples/monitoring/payhook-alerts.yml",
            exprs(&read("examples/monitoring/payhook-alerts.yml")).join("\n"),
        ),
    ] {
        let named = names(&text);
        assert!(named.len() >= 8, "{file} queries metrics: {named:?}");
        for name in named {
            assert!(
                exposed.has_sample(&name),
                "{file} names `{name}`, which is no sample /metrics exposes (a counter is \
                 queried as `_total`, a histogram as `_bucket`, `_sum` or `_count`)"
            );
        }
        for (name, matchers) in selectors(&text) {
            for (label, op, value) in matchers {
                assert!(
                    exposed.matches(&name, &label, &op, &value),
                    "{file} selects `{name}{{{label}{op}\"{value}\"}}`, which matches no sample \
                     /metrics exposes"
                );
            }
        }
    }

    let table: String = read("src/server/metrics.rs")
        .lines()
        .filter(|l| l.starts_with("//! | `payhook_"))
        .collect::<Vec<_>>()
        .join("\n");
    // `payhook_outbox_delivered_total`, `_conflicts_total`, `_retries_total`: one row.
    let mut documented = names(&table);
    documented.extend([
        "payhook_outbox_conflicts_total".into(),
        "payhook_outbox_retries_total".into(),
    ]);
    for name in &documented {
        assert!(
            exposed.has(name),
            "the table documents `{name}`, which /metrics does not expose"
        );
    }
    for family in &exposed.families {
        let listed = documented.iter().any(|d| {
            d == family
                || d.strip_suffix("_total") == Some(family.as_str())
                || d.strip_suffix("_info") == Some(family.as_str())
        });
        assert!(
            listed,
            "/metrics exposes `{family}`, which the table does not document"
        );
    }
}

/// The value of the sample `name` (without labels) in `/metrics` of `addr`.
async fn sample(addr: std::net::SocketAddr, name: &str) -> f64 {
    let answer = exchange(addr, &request("GET", "/metrics", &[], None)).await;
    let text = String::from_utf8(answer.body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[tokio::test]
async fn each_backend_measures_its_commits() {
    // sled: the callback's batch.
    let server = TestServer::start().await;
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    assert!(sample(server.addr, "payhook_store_commit_batch_size_count").await >= 1.0);
    assert!(sample(server.addr, "payhook_store_commit_batch_size_sum").await >= 1.0);

    // PostgreSQL: one booking, one transaction.
    let Some(db) = support::postgres::database("commit_metrics").await else {
        return;
    };
    let store_config = db.store_config(std::time::Duration::from_secs(86_400));
    let store = payhook::store::ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap();
    let mut config = test_config();
    config.store = store_config;
    let app = payhook::App::builder(config)
        .shared_store(store.shared())
        .callback_receiver(TestMerchant::default())
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));
    let callback = post(
        CALLBACK_PATH,
        &[("Content-Type", "application/json")],
        CALLBACK.as_bytes(),
    );
    assert_eq!(exchange(addr, &callback).await.status, 200);
    assert_eq!(
        sample(addr, "payhook_store_commit_batch_size_count").await,
        1.0
    );
    assert_eq!(
        sample(addr, "payhook_store_commit_batch_size_sum").await,
        1.0
    );
    assert!(sample(addr, "payhook_store_commit_duration_seconds_sum").await > 0.0);
    db.drop_schema().await;
}
