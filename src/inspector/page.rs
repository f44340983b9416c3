//! The inspector's page, rendered on the server: the page itself, and each of its panels as
//! a fragment the page fetches again to stay current. No external asset and no build step:
//! the style and the few lines of script are in the page.
//!
//! The script long-polls `deliveries?after=…` (answered as soon as a delivery is recorded)
//! and then fetches the panels; it also fetches them every second, so that deadlines count
//! down and the outbox's progress shows. Its actions post to the operating API with the
//! `X-Payhook-Inspector` header, which a cross-site form cannot send.

use chrono::{DateTime, SecondsFormat, Utc};
use std::fmt::Write as _;

use super::{DeliveryDetail, DeliveryFilter, DeliveryList};
use crate::gateway::SessionState;
use crate::postponed::{Delivery, PostponedPage, PostponedValidation};
use crate::server::ADMIN_PREFIX;
use crate::store::{FailingCallback, HeldCallback};

/// The header the page's actions carry.
pub(crate) const ACTION_HEADER: &str = "x-payhook-inspector";

/// The aggregator makes at most this many attempts at a callback (spec 2.7).
const MOST_ATTEMPTS: u32 = 17;

/// The service's state at a glance.
pub(crate) struct Health {
    /// `Some(true)` when the store stopped after a failed write.
    pub(crate) store_failed: Option<bool>,
    pub(crate) gateway: Option<SessionState>,
    /// Results waiting for delivery: `None` outside Awaitable mode, an error's text when the
    /// store could not be read (never shown as "none": an operator would read nothing waits).
    pub(crate) outbox_queued: Option<Result<usize, String>>,
    pub(crate) counters: Vec<(&'static str, u64)>,
    /// Deliveries the inspector keeps.
    pub(crate) kept: usize,
}

/// Escapes text for HTML content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// "in 4m 10s" or "5s ago".
fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (at - now).num_seconds();
    let span = |s: i64| match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    };
    if seconds >= 0 {
        format!("in {}", span(seconds))
    } else {
        format!("{} ago", span(-seconds))
    }
}

/// The page asking for the admin token (no token, or a wrong one). A `#token=…` fragment
/// (never sent to the server, so in no log) fills the form and leaves the address; the
/// operator presses **Open**.
/// The form posts to the login's absolute address, whichever address showed it
/// (`…/inspector`, `…/inspector/` or, after a wrong token, `…/inspector/login`).
pub(crate) fn login(problem: Option<&str>) -> String {
    let problem = problem.map_or_else(String::new, |p| format!("<p class=bad>{}</p>", escape(p)));
    let action = format!("{ADMIN_PREFIX}inspector/login");
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>payhook inspector</title>\
         <style>{STYLE}</style></head><body><h1>payhook inspector</h1>{problem}\
         <form method=post action={action} id=login-form><label>Admin token \
         <input type=password name=token id=token autofocus></label> \
         <button id=login>Open</button></form><script>{LOGIN_SCRIPT}</script></body></html>"
    )
}

/// Takes the token from a `#token=…` fragment into the form and removes it from the address
/// (the current history entry; a browser may have kept the link itself in its history):
/// when the page opens, and when only the fragment changes (a link pasted into the tab that
/// shows the form). It does not submit the form: another site's page could open this page
/// with wrong tokens in the fragment, again and again, and each submit — posted from this
/// page, so not cross-site — would spend one of the operator's guesses. The operator
/// presses **Open**.
const LOGIN_SCRIPT: &str = r#"
function take() {
  const given = location.hash.match(/^#token=(.+)$/);
  if (!given) return;
  history.replaceState(null, '', location.pathname);
  let token;
  try { token = decodeURIComponent(given[1]); } catch (e) {
    alert('The link\'s token is not well encoded: type the token instead.');
    return;
  }
  document.getElementById('token').value = token;
  document.getElementById('login').focus();
}
window.addEventListener('hashchange', take);
take();
"#;

/// The page's Content-Security-Policy: its two scripts and its style run by their hashes
/// (nothing else inline would: an injection that got past the escaping runs no script),
/// nothing is loaded from elsewhere, nobody frames it, forms post only to it.
pub(crate) fn content_security_policy() -> &'static str {
    static POLICY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let hash = |text: &str| {
            let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
            format!(
                "'sha256-{}'",
                crate::signature::Encoding::Base64.encode(digest.as_ref())
            )
        };
        format!(
            "default-src 'none'; script-src {} {}; style-src {}; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            hash(SCRIPT),
            hash(LOGIN_SCRIPT),
            hash(STYLE)
        )
    });
    &POLICY
}

/// The whole page, with each panel rendered now. `operator`: whose session it is, when an
/// operator's own token opened it (`[admin.operators]`), and whether they may change
/// anything: shown, the page's changes are kept with that name without asking for one, and
/// a viewer's page shows no button that acts (the service refuses their changes anyway).
pub(crate) fn page(
    operator: Option<(&str, bool)>,
    deliveries: &str,
    failing: &str,
    held: &str,
    postponed: &str,
    outbox: &str,
    health: &str,
) -> String {
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>payhook inspector</title>\
         <style>{STYLE}</style></head><body{viewer}>\
         <h1>payhook inspector <button id=logout data-action=logout>Log out</button>{who}</h1>\
         <section id=health>{health}</section>\
         <section><h2>Deliveries</h2>\
         <form id=filter><input name=nonce placeholder=nonce> <input name=client placeholder=client> \
         <select name=outcome><option value=''>any outcome</option>{outcomes}</select></form>\
         <div id=deliveries>{deliveries}</div><pre id=detail hidden></pre></section>\
         <section><h2>Failing callbacks</h2><div id=failing>{failing}</div></section>\
         <section><h2>Held results</h2><div id=held>{held}</div></section>\
         <section><h2>Postponed validations</h2><div id=postponed>{postponed}</div></section>\
         <section><h2>Outbox</h2><div id=outbox>{outbox}</div></section>\
         <script>{SCRIPT}</script></body></html>",
        // One token shared by every operator: who decides is their word, typed once here.
        who = operator.map_or_else(
            || BY_FIELD.to_owned(),
            |(name, may_change)| format!(
                "<span id=operator data-name='{name}'>{name}{role}</span>",
                name = escape(name),
                role = if may_change {
                    ""
                } else {
                    " (may look, not change)"
                }
            )
        ),
        viewer = match operator {
            Some((_, false)) => " class=viewer",
            _ => "",
        },
        outcomes = super::OUTCOMES.iter().fold(String::new(), |mut out, o| {
            let _ = write!(out, "<option>{o}</option>");
            out
        }),
    )
}

/// The deliveries panel: newest first.
pub(crate) fn deliveries(list: &DeliveryList, filter: &DeliveryFilter) -> String {
    if list.deliveries.is_empty() {
        let what = if *filter == DeliveryFilter::default() {
            "No delivery yet."
        } else {
            "No delivery matches the filter."
        };
        return format!("<p class=empty>{what}</p>");
    }
    let mut out = String::from(
        "<table><thead><tr><th>#</th><th>time</th><th>endpoint</th><th>nonce</th><th>client</th>\
         <th>status</th><th>outcome</th><th>answer</th><th>ms</th><th>signature</th><th>attempt</th>\
         <th></th></tr></thead><tbody>",
    );
    for d in list.deliveries.iter().rev() {
        let _ = write!(
            out,
            "<tr class='delivery {outcome}' data-seq={seq}><td>{seq}</td><td title='{at}'>{clock}</td><td>{endpoint}</td>\
             <td class=nonce>{nonce}</td><td>{client}</td><td>{tx}</td><td class=outcome>{outcome}</td>\
             <td>{status} {message}</td><td>{ms:.1}</td><td>{signature}</td><td>{attempt}{dup}</td>\
             <td><button data-action=detail data-seq={seq}>request</button></td></tr>",
            seq = d.seq,
            at = time(d.at),
            clock = d.at.format("%H:%M:%S%.3f"),
            endpoint = escape(&d.endpoint),
            nonce = escape(d.nonce.as_deref().unwrap_or("")),
            client = escape(d.client.as_deref().unwrap_or("")),
            tx = d
                .transaction_status
                .map_or_else(String::new, |s| s.to_string()),
            outcome = escape(&d.outcome),
            status = d.status,
            message = escape(d.message.as_deref().unwrap_or("")),
            ms = d.latency_ms,
            signature = escape(&d.signature),
            attempt = d.attempt,
            dup = if d.duplicate { " (duplicate)" } else { "" },
        );
    }
    out.push_str("</tbody></table>");
    if let Some(missed) = list.missed {
        let _ = write!(out, "<p>{missed} older deliveries are no longer kept.</p>");
    }
    out
}

/// One delivery's request and answer, as plain text for the page's detail box.
pub(crate) fn detail(detail: &DeliveryDetail) -> String {
    let mut out = format!(
        "#{} {} {} → {}\n\n",
        detail.entry.seq, detail.entry.endpoint, detail.entry.request_id, detail.entry.status
    );
    for (name, value) in &detail.headers {
        let _ = writeln!(out, "{name}: {value}");
    }
    out.push('\n');
    out.push_str(&detail.body);
    if detail.body_truncated {
        out.push_str("\n[… cut]");
    }
    let _ = write!(out, "\n\nanswer: {}", detail.answer);
    escape(&out)
}

/// Failing callbacks the panel shows, the latest failures first: an incident can leave
/// hundreds of thousands, and the page fetches the panel every second, so the store reads
/// only these, through its index by time.
pub(crate) const FAILING_SHOWN: usize = 100;

/// The failing callbacks panel: the latest of them (latest first, up to [`FAILING_SHOWN`]),
/// and how many the store holds in all.
pub(crate) fn failing(latest: &[FailingCallback], count: usize, now: DateTime<Utc>) -> String {
    if latest.is_empty() {
        return "<p class=empty>No failing callback.</p>".into();
    }
    let failing = &latest[..latest.len().min(FAILING_SHOWN)];
    let left_out = count.saturating_sub(failing.len());
    let mut out = String::from(
        "<table><thead><tr><th>nonce</th><th>status</th><th>failures</th><th>last reason</th>\
         <th>first</th><th>last</th><th>next expected</th><th>reference</th><th></th></tr></thead><tbody>",
    );
    for f in failing {
        let next = next_expected(f, now);
        let _ = write!(
            out,
            "<tr class=failing><td>{nonce}</td><td>{status}</td><td>{failures}</td><td>{reason}</td>\
             <td>{first}</td><td>{last}</td><td>{next}</td><td>{reference}</td>\
             <td><button data-action=book data-reference='{reference}'>book now</button></td></tr>",
            nonce = escape(f.nonce.as_str()),
            status = f.status,
            failures = f.failures,
            reason = escape(&f.last_reason),
            first = time(f.first_failed),
            last = time(f.last_failed),
            next = escape(&next),
            reference = escape(&f.transaction_reference_id),
        );
    }
    out.push_str("</tbody></table>");
    if left_out > 0 {
        let _ = write!(
            out,
            "<p class=empty>{left_out} older ones are not shown; \
             payhook callbacks failing, or GET /payhook/admin/callbacks/failing a page at a time, \
             lists them all.</p>"
        );
    }
    out
}

/// The held results panel: the latest of them (latest first, up to [`FAILING_SHOWN`]), and
/// how many the store holds in all. Each row's button says a person resolved it in the
/// merchant's books (the page asks first: nothing is booked by it).
pub(crate) fn held(latest: &[HeldCallback], count: usize) -> String {
    if latest.is_empty() {
        return "<p class=empty>No held result waits for a person.</p>".into();
    }
    let held = &latest[..latest.len().min(FAILING_SHOWN)];
    let left_out = count.saturating_sub(held.len());
    let mut out = String::from(
        "<table><thead><tr><th>nonce</th><th>status</th><th>reason</th><th>held</th>\
         <th>client</th><th>amount</th><th>reference</th><th></th></tr></thead><tbody>",
    );
    for h in held {
        let _ = write!(
            out,
            "<tr class=unresolved><td>{nonce}</td><td>{status}</td><td>{reason}</td><td>{at}</td>\
             <td>{client}</td><td>{amount} {currency}</td><td>{reference}</td>\
             <td><button data-action=resolve data-nonce=\"{nonce}\" data-status={status}>resolved</button></td></tr>",
            nonce = escape(h.nonce.as_str()),
            status = h.status,
            reason = escape(&h.reason),
            at = time(h.held_at),
            client = escape(&h.client_id),
            amount = escape(&h.amount),
            currency = escape(&h.currency),
            reference = escape(&h.transaction_reference_id),
        );
    }
    out.push_str("</tbody></table>");
    if left_out > 0 {
        let _ = write!(
            out,
            "<p class=empty>{left_out} older ones are not shown; payhook callbacks held lists \
             up to 1,000.</p>"
        );
    }
    out
}

/// When the aggregator's next attempt may come. Its schedule is not published (spec 2.7):
/// estimated from the failures seen so far.
fn next_expected(failure: &FailingCallback, now: DateTime<Utc>) -> String {
    if failure.failures >= MOST_ATTEMPTS {
        return format!("none: {MOST_ATTEMPTS} attempts made, the aggregator gave up");
    }
    if failure.failures < 2 {
        return "unknown (one failure so far)".into();
    }
    let mean = (failure.last_failed - failure.first_failed)
        / i32::try_from(failure.failures - 1).unwrap_or(i32::MAX);
    format!("≈ {} (estimate)", relative(failure.last_failed + mean, now))
}

/// Validations waiting, for a decision or for delivery, that each panel shows: the first
/// ones by id. A review queue or an aggregator down for hours can leave thousands, and the
/// page fetches its panels every second.
pub(crate) const WAITING_SHOWN: usize = 100;

/// The postponed validations waiting for a decision, with Approve and Deny: a first page of
/// them, read with [`WAITING_SHOWN`] a page, and whether more wait.
pub(crate) fn postponed(first: &PostponedPage, now: DateTime<Utc>) -> String {
    let pending: Vec<_> = first
        .validations
        .iter()
        .filter(|r| r.result.is_none())
        .collect();
    if pending.is_empty() {
        return "<p class=empty>No validation waits for a decision.</p>".into();
    }
    let mut out = String::from(
        "<table><thead><tr><th>validation</th><th>nonce</th><th>client</th><th>amount</th>\
         <th>received</th><th>deadline</th><th>decision</th></tr></thead><tbody>",
    );
    for r in pending {
        let payment = &r.request.payment_data;
        let _ = write!(
            out,
            "<tr class=pending data-id={id}><td>{id}</td><td>{nonce}</td><td>{client}</td>\
             <td>{amount} {currency}</td><td>{received}</td><td>{deadline}</td>\
             <td><input class=description data-id={id} placeholder=description> \
             <button data-action=approve data-id={id} data-nonce=\"{nonce}\">Approve</button> \
             <button data-action=deny data-id={id} data-nonce=\"{nonce}\">Deny</button></td></tr>",
            id = r.validation_id,
            nonce = escape(r.request.nonce()),
            client = escape(&r.request.merchant_data.client_id),
            amount = payment.amount,
            currency = escape(&payment.currency),
            received = time(r.received),
            deadline = match (r.repeat_of, r.deadline) {
                // A repeat under a new id is decided with the validation it repeats.
                (Some(original), _) => format!("that of {original}"),
                (None, deadline) =>
                    deadline.map_or_else(|| "none".to_owned(), |d| relative(d, now)),
            },
        );
    }
    out.push_str("</tbody></table>");
    if first.next.is_some() {
        let _ = write!(
            out,
            "<p class=empty>The first {WAITING_SHOWN} waiting are shown, by id; \
             <code>payhook validations list --pending</code> (GET \
             /payhook/admin/validations?state=pending, a page at a time) lists them all.</p>"
        );
    }
    out
}

/// Delivered or refused results the outbox panel shows, the latest ones.
pub(crate) const SETTLED_SHOWN: usize = 100;

/// What the outbox panel leaves out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeftOut {
    /// Results waiting for delivery after the first [`WAITING_SHOWN`].
    pub(crate) queued: bool,
    /// Delivered or refused results older than the latest [`SETTLED_SHOWN`].
    pub(crate) settled: bool,
}

/// What the outbox panel shows, and what it leaves out: the `queued` page (the first
/// [`WAITING_SHOWN`] waiting for delivery), and of `settled` (the latest first, read with
/// one more than is shown) the first [`SETTLED_SHOWN`]; by id. The two are read one after
/// the other: a result delivered in between is in both, and shown once, delivered.
pub(crate) fn outbox_records(
    queued: PostponedPage,
    mut settled: Vec<PostponedValidation>,
) -> (Vec<PostponedValidation>, LeftOut) {
    let left_out = LeftOut {
        queued: queued.next.is_some(),
        settled: settled.len() > SETTLED_SHOWN,
    };
    settled.truncate(SETTLED_SHOWN);
    let mut shown = queued.validations;
    shown.append(&mut settled);
    shown.sort_by_key(|v| (v.validation_id, !v.is_final()));
    shown.dedup_by_key(|v| v.validation_id);
    (shown, left_out)
}

/// The decided validations and their delivery to the aggregator, with Retry now, and what is
/// left out.
pub(crate) fn outbox(
    records: &[PostponedValidation],
    left_out: LeftOut,
    now: DateTime<Utc>,
) -> String {
    let decided: Vec<_> = records
        .iter()
        .filter_map(|r| Some((r, r.result.as_ref()?)))
        .collect();
    if decided.is_empty() {
        return "<p class=empty>No decided validation.</p>".into();
    }
    let mut out = String::from(
        "<table><thead><tr><th>validation</th><th>decision</th><th>state</th><th>attempts</th>\
         <th>next / when</th><th>last error</th><th></th></tr></thead><tbody>",
    );
    for (record, result) in decided.into_iter().rev() {
        let (state, attempts, when, error, retry) = match &result.delivery {
            Delivery::Queued {
                attempts,
                next_attempt,
                last_error,
            } => (
                "queued",
                *attempts,
                relative(*next_attempt, now),
                last_error.clone().unwrap_or_default(),
                Some("Retry now"),
            ),
            Delivery::Delivered { attempts, at } => {
                ("delivered", *attempts, time(*at), String::new(), None)
            }
            // Refused (403): sent again only when an operator judges the refusal not the
            // aggregator's (a firewall, a missing role).
            Delivery::Conflict {
                attempts,
                message,
                at,
            } => (
                "conflict",
                *attempts,
                time(*at),
                message.clone(),
                Some("Send again"),
            ),
        };
        let retry = retry.map_or_else(String::new, |label| {
            format!(
                "<button data-action=retry data-id={}>{label}</button>",
                record.validation_id
            )
        });
        let _ = write!(
            out,
            "<tr class='outbox {state}' data-id={id}><td>{id}</td><td>{decision} {description}</td>\
             <td class=state>{state}</td><td>{attempts}</td><td>{when}</td><td>{error}</td><td>{retry}</td></tr>",
            id = record.validation_id,
            decision = if result.success { "approved" } else { "denied" },
            description = escape(&result.description),
            error = escape(&error),
        );
    }
    out.push_str("</tbody></table>");
    if left_out.queued {
        let _ = write!(
            out,
            "<p class=empty>The first {WAITING_SHOWN} waiting for delivery are shown, by id; \
             GET /payhook/admin/validations?state=queued (a page at a time) lists them all.</p>"
        );
    }
    if left_out.settled {
        let _ = write!(
            out,
            "<p class=empty>The latest {SETTLED_SHOWN} delivered or refused are shown; \
             GET /payhook/admin/validations?state=delivered (or conflict, a page at a time) \
             lists them all.</p>"
        );
    }
    out
}

/// The health panel.
pub(crate) fn health(health: &Health, now: DateTime<Utc>) -> String {
    let store = match health.store_failed {
        None => "<span>none</span>".to_owned(),
        Some(false) => "<span class=good>serving</span>".to_owned(),
        Some(true) => {
            "<span class=bad>stopped after a failed write: restart the service</span>".to_owned()
        }
    };
    let gateway = match health.gateway {
        None => "not configured".to_owned(),
        Some(SessionState::None) => "no session yet (the next call logs in)".to_owned(),
        Some(SessionState::Renewing) => "logging in or refreshing".to_owned(),
        Some(SessionState::Held { access_expires, .. }) if access_expires > now => {
            format!(
                "session valid, access token expires {}",
                relative(access_expires, now)
            )
        }
        Some(SessionState::Held { .. }) => "session expired (the next call renews it)".to_owned(),
    };
    let outbox = match &health.outbox_queued {
        None => "none (not in Awaitable mode)".to_owned(),
        Some(Ok(queued)) => queued.to_string(),
        Some(Err(error)) => format!(
            "<span class=bad>unknown: the store could not be read: {}</span>",
            escape(error)
        ),
    };
    let mut out = format!(
        "<dl><dt>store</dt><dd id=store-state>{store}</dd><dt>gateway</dt><dd>{gateway}</dd>\
         <dt>outbox queued</dt><dd>{outbox}</dd><dt>kept deliveries</dt><dd>{}</dd>",
        health.kept
    );
    for (name, value) in &health.counters {
        let _ = write!(out, "<dt>{name}</dt><dd>{value}</dd>");
    }
    out.push_str("</dl>");
    out
}

/// Where an operator of the shared token names themselves, once for what they decide and
/// resolve on the page (remembered in their browser): kept with each decision as their word.
const BY_FIELD: &str = "<label id=by-label>your name <input id=by maxlength=64 \
                        autocomplete=name placeholder='kept with what you decide'></label>";

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222}\
h1{font-size:20px}h2{font-size:16px;margin-top:1.5em}table{border-collapse:collapse;width:100%}\
th,td{border-bottom:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}\
th{background:#f4f4f4}.refused td.outcome,.failed td.outcome,.bad{color:#b00}\
.booked td.outcome,.allowed td.outcome,.good,.delivered td.state{color:#070}\
.empty{color:#777}dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}\
dt{color:#555}dd{margin:0}pre{background:#f8f8f8;padding:8px;white-space:pre-wrap}\
section#health{background:#fafafa;padding:4px 12px}.held td.outcome{color:#a50}#logout{float:right;font-size:13px}\
#by-label{float:right;font-size:13px;font-weight:normal;margin-right:1em}\
.viewer button[data-action]:not([data-action=detail]):not([data-action=logout]),.viewer input.description{display:none}";

const SCRIPT: &str = r#"
const base = location.pathname.replace(/inspector\/?$/, '');
let last = 0;
function filterQuery() {
  return new URLSearchParams(new FormData(document.getElementById('filter'))).toString();
}
// Panels whose buttons act on money: not rebuilt while the pointer is over them, so that a
// row decided elsewhere (or by a deadline) cannot move another validation's button under a
// click; rebuilt as the pointer leaves.
const acting = ['failing', 'held', 'postponed', 'outbox'];
function held(box) {
  return acting.includes(box.id) && box.matches(':hover');
}
// Only the service's own fragments are written into the page as HTML: it marks them (a
// proxy's error or login page answered in their place is not).
function fragment(answer) {
  return answer.ok && answer.headers.get('x-payhook-inspector') === 'fragment';
}
async function panel(name) {
  const query = name === 'deliveries' ? '?' + filterQuery() : '';
  const answer = await fetch(base + 'inspector/' + name + query, {credentials: 'same-origin'});
  if (answer.status === 401) { location.reload(); return; }
  if (!fragment(answer)) return;
  const html = await answer.text();
  const box = document.getElementById(name);
  if (held(box)) return;
  // A description being typed survives the refresh, and keeps the focus.
  const typed = new Map();
  box.querySelectorAll('input.description').forEach(i => typed.set(i.dataset.id, i.value));
  const active = document.activeElement;
  const focused = box.contains(active) && active.matches('input.description') ? active.dataset.id : null;
  box.innerHTML = html;
  box.querySelectorAll('input.description').forEach(i => {
    if (typed.has(i.dataset.id)) i.value = typed.get(i.dataset.id);
    if (i.dataset.id === focused) { i.focus(); i.setSelectionRange(i.value.length, i.value.length); }
  });
}
function panels() {
  return Promise.all(['health', 'failing', 'held', 'postponed', 'outbox'].map(panel));
}
async function follow() {
  for (;;) {
    try {
      const answer = await fetch(base + 'deliveries?limit=1&wait=25&after=' + last);
      if (!answer.ok) throw new Error(answer.status);
      const list = await answer.json();
      if (list.last !== last) { last = list.last; await panel('deliveries'); await panels(); }
    } catch (e) {
      await new Promise(r => setTimeout(r, 2000));
    }
  }
}
// What an action whose answer was lost tells the operator: a dropped connection, a proxy's
// 502 or 504 (payhook sends neither), or a success that could not be read. The service may
// have acted; acting again is safe (a booking is made once, a decision recorded once).
function unknown(url, why) {
  const booking = url === 'reconcile';
  return 'Outcome unknown (' + why + '): the service may have '
    + (booking ? 'booked it; press book now again to see (it books nothing twice), and do not book it by hand meanwhile.'
               : 'acted on it; the panels show what it holds.');
}
async function act(url, body, button) {
  // The row acted on takes no second click while its panel waits to be rebuilt.
  const row = button.closest('tr');
  const buttons = row ? [...row.querySelectorAll('button')] : [button];
  buttons.forEach(b => b.disabled = true);
  const told = message => { buttons.forEach(b => b.disabled = false); alert(message); };
  let answer;
  try {
    answer = await fetch(base + url, {method: 'POST', credentials: 'same-origin',
      headers: {'content-type': 'application/json', 'x-payhook-inspector': '1'},
      body: JSON.stringify(body || {})});
  } catch (e) {
    told(unknown(url, 'no answer: ' + e.message));
    return panels();
  }
  if (answer.status === 502 || answer.status === 504) {
    told(unknown(url, answer.status + ' from a proxy'));
  } else if (!answer.ok) {
    told((await answer.json().catch(() => ({}))).message || answer.status);
  } else if (url.startsWith('validations/')) {
    // Decided the same way before (elsewhere, or by its deadline): nothing was recorded, and
    // the description typed here is not the one the aggregator gets.
    const said = await answer.json().catch(() => ({}));
    if (said.message === 'unchanged') {
      // Decided: its buttons stay off until the panel is rebuilt without it.
      alert('Validation ' + url.slice('validations/'.length) + ' was already decided so '
        + '(elsewhere, or by its deadline): unchanged. The aggregator gets the description '
        + 'recorded then, not the one typed here.');
    }
  } else if (url === 'reconcile') {
    // Answered 200 whatever became of each transaction: what was not booked now is told.
    const outcomes = await answer.json().catch(() => null);
    if (!Array.isArray(outcomes)) {
      told(unknown(url, 'the answer could not be read'));
    } else {
      const untold = outcomes.filter(o => o.outcome !== 'booked');
      if (untold.length) {
        told(untold.map(o => o.referenceId + ': ' + o.outcome.replace('_', ' ')
          + (o.status != null ? ' (status ' + o.status + ')' : '')
          + (o.message ? ' \u2014 ' + o.message : '')).join('\n'));
      }
    }
  }
  return panels();
}
// Who acts, kept with what they do: a session opened with an operator's own token is that
// operator's (the service keeps their name, and the page has no field for it); one token
// shared by every operator leaves it to their word, typed in the header's field and
// remembered in this browser where it may be.
const byField = document.getElementById('by');
function remember(by) {
  try {
    if (by.trim()) localStorage.setItem('payhook.by', by.trim());
    else localStorage.removeItem('payhook.by');
  } catch (e) { /* storage refused: typed again next time */ }
}
if (byField) {
  try { byField.value = localStorage.getItem('payhook.by') || ''; } catch (e) { /* none */ }
  byField.addEventListener('input', () => remember(byField.value));
  byField.addEventListener('change', () => remember(byField.value));
}
// The name the header's field holds, for a decision: none (undefined) on an operator's own
// page, or where none was typed.
function named() {
  return (byField && byField.value.trim()) || undefined;
}
// The name for a resolution, asked first with the field's as the answer offered (nothing
// typed is lost to a Cancel): '' on an operator's own page. Null when the operator cancels.
function who(what, keptWith) {
  if (!byField) return '';
  const by = prompt(what + ' Your name, kept with ' + keptWith + ' (empty: none):', byField.value);
  if (by === null) return null;
  byField.value = by.trim();
  remember(by);
  return by;
}
document.addEventListener('click', async (event) => {
  const button = event.target.closest('button[data-action]');
  if (!button || button.disabled) return;
  const id = button.dataset.id;
  const description = () => (document.querySelector('input.description[data-id="' + id + '"]') || {}).value || '';
  switch (button.dataset.action) {
    // With the nonce shown beside the button: a row redrawn under the pointer is refused.
    // Kept with the operator's name when an operator's own token opened the page (the
    // service knows it); with the shared token, with the name in the header's field.
    case 'approve': return act('validations/' + id, {success: true, description: description(), nonce: button.dataset.nonce, by: named()}, button);
    case 'deny': return act('validations/' + id, {success: false, description: description(), nonce: button.dataset.nonce, by: named()}, button);
    case 'retry': return act('outbox/' + id + '/retry', null, button);
    case 'logout': {
      const answer = await fetch(base + 'inspector/logout', {method: 'POST',
        credentials: 'same-origin', headers: {'x-payhook-inspector': '1'}});
      if (!answer.ok) {
        return alert('Not logged out: ' + ((await answer.json().catch(() => ({}))).message
          || answer.status));
      }
      return location.reload();
    }
    case 'book': return act('reconcile', {referenceIds: [button.dataset.reference]}, button);
    case 'resolve': {
      const pair = {nonce: button.dataset.nonce, status: Number(button.dataset.status)};
      const by = who('Resolve the held result of nonce ' + pair.nonce + ' (status '
        + pair.status + ').', 'your note');
      if (by === null) return;
      // Nothing is booked by it: a person's word, with what they did, kept with the result.
      const note = prompt('Nothing is booked: say what was done in the merchant\'s books.');
      if (note === null || !note.trim()) return;
      return act('callbacks/held/resolve', {...pair, note, by: by.trim() || undefined}, button);
    }
    case 'detail': {
      const box = document.getElementById('detail');
      // Only the service's own fragment is written as HTML; anything else, as text.
      const answer = await fetch(base + 'inspector/delivery/' + button.dataset.seq).catch(e => e);
      if (!(answer instanceof Error) && fragment(answer)) {
        box.innerHTML = await answer.text();
      } else {
        const why = answer instanceof Error ? answer.message
          : answer.ok ? answer.status + ', not the service\'s answer'
          : ((await answer.json().catch(() => ({}))).message || answer.status);
        box.textContent = 'Not shown: ' + why;
      }
      box.hidden = false;
    }
  }
});
document.getElementById('filter').addEventListener('input', () => panel('deliveries'));
acting.forEach(name => document.getElementById(name).addEventListener('mouseleave', () => panel(name)));
setInterval(panels, 1000);
follow();
"#;

#[cfg(test)]
mod tests {
    use super::failing as failing_panel;
    use super::*;

    fn delivered(id: i64) -> PostponedValidation {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let mut record = PostponedValidation::pending_for_tests(id);
        record.resolve(true, "ok".into(), None, now);
        if let Some(result) = &mut record.result {
            result.delivery = Delivery::Delivered {
                attempts: 1,
                at: now,
            };
        }
        record
    }

    #[test]
    fn the_health_panel_says_the_outbox_is_unknown_when_the_store_could_not_be_read() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let with = |outbox_queued| {
            health(
                &Health {
                    store_failed: Some(false),
                    gateway: None,
                    outbox_queued,
                    counters: Vec::new(),
                    kept: 0,
                },
                now,
            )
        };
        let unread = with(Some(Err("store failed: <disk> gone".to_owned())));
        assert!(
            unread.contains(
                "<dt>outbox queued</dt><dd><span class=bad>unknown: the store could not be read: \
                 store failed: &lt;disk&gt; gone</span></dd>"
            ),
            "{unread}"
        );
        assert!(with(Some(Ok(3))).contains("<dt>outbox queued</dt><dd>3</dd>"));
        assert!(with(None).contains("<dt>outbox queued</dt><dd>none (not in Awaitable mode)</dd>"));
    }

    #[test]
    fn the_failing_panel_shows_the_latest_and_says_how_many_are_left_out() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let failing: Vec<FailingCallback> = (0..FAILING_SHOWN + 3)
            .map(|n| FailingCallback {
                nonce: format!("n-{n}").into(),
                status: 4,
                failures: 1,
                first_failed: now,
                last_failed: now,
                last_reason: "handler failed".into(),
                transaction_reference_id: format!("ref-{n}"),
                client_id: "c".into(),
                amount: "10".into(),
                currency: "EUR".into(),
            })
            .collect();
        let panel = failing_panel(&failing[..FAILING_SHOWN], failing.len(), now);
        assert_eq!(panel.matches("<tr class=failing>").count(), FAILING_SHOWN);
        assert!(
            panel.contains("<td>n-0</td>"),
            "the first (latest) is shown"
        );
        assert!(!panel.contains(&format!("<td>n-{FAILING_SHOWN}</td>")));
        assert!(panel.contains("3 older ones are not shown"), "{panel}");
        let few = failing_panel(&failing[..2], 2, now);
        assert_eq!(few.matches("<tr class=failing>").count(), 2);
        assert!(!few.contains("not shown"));
    }

    #[test]
    fn the_held_panel_shows_the_latest_escaped_and_says_how_many_are_left_out() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let held: Vec<HeldCallback> = (0..FAILING_SHOWN + 2)
            .map(|n| HeldCallback {
                nonce: format!("n-{n}\"<b>").into(),
                status: -2,
                reason: "<script>".into(),
                held_at: now,
                transaction_reference_id: format!("ref-{n}"),
                client_id: "c".into(),
                amount: "10".into(),
                currency: "EUR".into(),
                resolved_at: None,
                resolution: String::new(),
                resolved_by: None,
            })
            .collect();
        let panel = super::held(&held[..FAILING_SHOWN], held.len());
        assert_eq!(
            panel.matches("<tr class=unresolved>").count(),
            FAILING_SHOWN
        );
        assert!(panel.contains("2 older ones are not shown"), "{panel}");
        assert!(
            !panel.contains("<script>") && !panel.contains("<b>"),
            "{panel}"
        );
        assert!(
            panel.contains("data-nonce=\"n-0&quot;&lt;b&gt;\" data-status=-2>resolved"),
            "{panel}"
        );
        assert!(super::held(&[], 0).contains("No held result"));
    }

    #[test]
    fn a_pending_repeat_is_shown_as_decided_with_the_validation_it_repeats() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let mut original = PostponedValidation::pending_for_tests(7);
        original.deadline = Some(now + chrono::TimeDelta::minutes(5));
        let mut request = original.request.clone();
        request.validation_id = 8.into();
        let repeat = original.repeated_by(request, now).unwrap();
        let panel = postponed(
            &PostponedPage {
                validations: vec![original, repeat],
                next: None,
            },
            now,
        );
        assert_eq!(panel.matches("<tr class=pending").count(), 2);
        assert!(panel.contains("<td>that of 7</td>"), "{panel}");
        assert!(panel.contains("<td>in 5m"), "{panel}");
    }

    #[test]
    fn a_result_delivered_between_the_two_reads_is_shown_once_delivered() {
        let mut queued = delivered(7);
        if let Some(result) = &mut queued.result {
            result.delivery = Delivery::Queued {
                attempts: 0,
                next_attempt: DateTime::<Utc>::UNIX_EPOCH,
                last_error: None,
            };
        }
        let first = PostponedPage {
            validations: vec![queued, delivered(9)],
            next: None,
        };
        let (shown, left_out) = outbox_records(first, vec![delivered(7)]);
        let ids: Vec<i64> = shown.iter().map(|v| v.validation_id.get()).collect();
        assert_eq!(ids, [7, 9]);
        assert!(shown[0].is_final(), "shown delivered");
        assert_eq!(left_out, LeftOut::default());
        let settled = (0..=SETTLED_SHOWN as i64).rev().map(delivered).collect();
        let (shown, left_out) = outbox_records(PostponedPage::default(), settled);
        assert_eq!(shown.len(), SETTLED_SHOWN);
        assert_eq!(shown[0].validation_id.get(), 1, "the oldest left out");
        assert!(left_out.settled && !left_out.queued);
    }

    #[test]
    fn the_waiting_panels_say_when_more_wait_than_they_show() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let whole = PostponedPage {
            validations: vec![PostponedValidation::pending_for_tests(7)],
            next: None,
        };
        let all = postponed(&whole, now);
        assert_eq!(all.matches("<tr class=pending").count(), 1);
        assert!(!all.contains("are shown"), "{all}");
        let first = PostponedPage {
            next: Some(7.into()),
            ..whole
        };
        let cut = postponed(&first, now);
        assert!(
            cut.contains(&format!("The first {WAITING_SHOWN} waiting are shown")),
            "{cut}"
        );
        let queued = LeftOut {
            queued: true,
            settled: false,
        };
        let cut = outbox(&[delivered(1)], queued, now);
        assert!(
            cut.contains(&format!(
                "The first {WAITING_SHOWN} waiting for delivery are shown"
            )),
            "{cut}"
        );
        assert!(!cut.contains("delivered or refused are shown"), "{cut}");
    }

    #[test]
    fn the_outbox_panel_says_when_older_settled_results_are_left_out() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let records = [delivered(1), delivered(2)];
        let all = outbox(&records, LeftOut::default(), now);
        assert_eq!(all.matches("<tr class='outbox delivered'").count(), 2);
        assert!(!all.contains("are shown"), "{all}");
        let settled = LeftOut {
            queued: false,
            settled: true,
        };
        let cut = outbox(&records, settled, now);
        assert!(!cut.contains("waiting for delivery are shown"), "{cut}");
        assert!(
            cut.contains(&format!(
                "The latest {SETTLED_SHOWN} delivered or refused are shown"
            )),
            "{cut}"
        );
        assert!(
            cut.find("data-id=2").unwrap() < cut.find("data-id=1").unwrap(),
            "the latest first: {cut}"
        );
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
    }

    #[test]
    fn relative_times_read_naturally() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        assert_eq!(
            relative(now + chrono::TimeDelta::seconds(250), now),
            "in 4m 10s"
        );
        assert_eq!(relative(now - chrono::TimeDelta::seconds(5), now), "5s ago");
        assert_eq!(
            relative(now + chrono::TimeDelta::seconds(7300), now),
            "in 2h 1m"
        );
    }
}
