//! Which connections are served, and which are shed when clients hold slots without using
//! them.
//!
//! A connection costs a slot (`server.max_connections`) for as long as it is open, whatever it
//! does with it. A client that connects and sends slowly, or keeps an HTTP/2 connection open
//! with no stream (answering PINGs keeps it "alive"), would hold slots that a genuine callback
//! needs. Three rules keep slots for work:
//!
//! * **Idle connections close.** A connection with no request in progress for
//!   `server.idle_timeout` is closed, HTTP/2 included (HTTP/1 is also bound by
//!   `server.header_read_timeout` between requests).
//! * **When every slot is taken, the least active connection gives its slot up** to the new
//!   one, as nginx reuses idle keep-alive connections: among the connections whose handler
//!   is not running (idle, still sending headers, or still sending a body), the one furthest
//!   behind `server.min_body_rate` bytes per second since its current request (or idleness)
//!   began — the oldest of equals. A connection just accepted is behind by nothing, so a
//!   genuine client is not shed before it could send; one whose handler runs is never shed.
//!   If no connection is behind, the one whose current phase (its head, a body, idleness)
//!   began longest ago gives its place up, once that phase has lasted longer than
//!   `server.min_body_rate_grace`: connections trickling just above the rate would
//!   otherwise hold every place for their head and body timeouts. If there is none either,
//!   a new one waits in the listen backlog.
//! * **One address holds at most `server.max_connections_per_address`** (0: no limit), an
//!   IPv6 client's whole /64 counting as one address (one host is given a /64 to pick
//!   from, so an attacker has as many addresses as it likes within it). A
//!   new connection over it sheds that address's least active connection (the oldest of
//!   those whose handler is not running, when none is behind), or is closed at once when all
//!   of them are working. Behind a reverse proxy every connection comes from
//!   the proxy: raise the limit or set 0 there, and let the proxy do this job.
//!
//! A request body that arrives slower than `server.min_body_rate` after a grace period is
//! answered 408 by the body reader (`request.rs`), which marks its connection as receiving so
//! that the rules above can tell it from one whose handler runs.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::sync::Notify;

use super::metrics::{Metrics, ShedReason};

/// The limits of [`Connections`], from `[server]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max: usize,
    /// 0: no per-address limit.
    pub(crate) per_address: usize,
    pub(crate) idle_timeout: Duration,
    /// Bytes per second a connection is measured against when one must give its place up.
    pub(crate) pace: u64,
    /// How long one phase of a connection (its head, a body, idleness) may last before the
    /// connection gives its place up to a newcomer when the server is full, however well it
    /// keeps the pace (`server.min_body_rate_grace`).
    pub(crate) patience: Duration,
}

/// The open connections of one server.
pub(crate) struct Connections {
    limits: Limits,
    table: Mutex<Table>,
    /// Signalled when a connection leaves the table.
    freed: Notify,
    epoch: Instant,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: HashMap<u64, Arc<Activity>>,
    per_address: HashMap<IpAddr, usize>,
}

/// What one connection is doing, updated by its requests and read by the shedding rules.
#[derive(Debug)]
pub(crate) struct Activity {
    id: u64,
    address: IpAddr,
    /// Requests whose handler was entered and has not answered yet.
    in_flight: AtomicU32,
    /// Of those, the ones still reading their body.
    receiving: AtomicU32,
    /// Bytes read from the client so far (counted by the connection's stream).
    bytes: AtomicU64,
    /// When the current phase (idle, or a request in progress) began: ms since the epoch.
    phase_ms: AtomicU64,
    /// [`Self::bytes`] when the phase began.
    phase_bytes: AtomicU64,
    /// Tells the connection's task to close it.
    shed: Notify,
    /// The table's time origin.
    epoch: Instant,
}

/// How a new connection was received.
pub(crate) enum Admission {
    /// Serve it; dropping the [`Slot`] frees its place.
    Admitted(Slot),
    /// Every slot is held by a connection working or keeping the pace: wait for
    /// [`Connections::freed`] (or look again a little later).
    Full,
    /// Its address holds its limit of connections working or keeping the pace: close it.
    AddressFull,
}

/// A connection's place in the table; leaving it (drop) frees the place.
pub(crate) struct Slot {
    connections: Arc<Connections>,
    pub(crate) activity: Arc<Activity>,
}

impl Connections {
    pub(crate) fn new(limits: Limits, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            limits,
            table: Mutex::new(Table::default()),
            freed: Notify::new(),
            epoch: Instant::now(),
            metrics,
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place for a connection from `address`, shedding a less active one when the
    /// server or the address is full.
    pub(crate) fn admit(self: &Arc<Self>, address: IpAddr) -> Admission {
        self.admit_at(address, self.now_ms())
    }

    fn admit_at(self: &Arc<Self>, address: IpAddr, now: u64) -> Admission {
        let address = network_of(address);
        let pace = self.limits.pace;
        let mut table = self.table();
        let limit = self.limits.per_address;
        if limit > 0 && table.per_address.get(&address).copied().unwrap_or(0) >= limit {
            // Among one address's own connections, even one that is not behind gives its
            // place up (the oldest first): a newcomer from an address whose connections are
            // all new would otherwise never get one.
            match table.furthest_behind(now, pace, Some(address), i128::MIN) {
                Some(victim) => self.shed(&mut table, &victim, ShedReason::AddressLimit),
                None => {
                    self.metrics.count_shed(ShedReason::AddressLimit);
                    return Admission::AddressFull;
                }
            }
        }
        if table.open.len() >= self.limits.max {
            // Behind the pace first; else the one whose phase has lasted longest, once past
            // the patience: connections trickling just above the pace would otherwise hold
            // every place for their whole head and body timeouts, while a genuine client,
            // whose head and body take milliseconds, waited in the listen backlog.
            let patience = u64::try_from(self.limits.patience.as_millis()).unwrap_or(u64::MAX);
            let victim = table
                .furthest_behind(now, pace, None, 0)
                .or_else(|| table.longest_in_phase(now, patience));
            match victim {
                Some(victim) => self.shed(&mut table, &victim, ShedReason::LeastActive),
                None => return Admission::Full,
            }
        }
        table.next_id += 1;
        let activity = Arc::new(Activity {
            id: table.next_id,
            address,
            in_flight: AtomicU32::new(0),
            receiving: AtomicU32::new(0),
            bytes: AtomicU64::new(0),
            phase_ms: AtomicU64::new(now),
            phase_bytes: AtomicU64::new(0),
            shed: Notify::new(),
            epoch: self.epoch,
        });
        table.open.insert(activity.id, Arc::clone(&activity));
        *table.per_address.entry(address).or_default() += 1;
        self.metrics.connection_opened();
        Admission::Admitted(Slot {
            connections: Arc::clone(self),
            activity,
        })
    }

    /// Completes when a connection has left the table since the last call.
    pub(crate) async fn freed(&self) {
        self.freed.notified().await;
    }

    /// Closes the connections idle for `idle_timeout`; returns how many.
    pub(crate) fn close_idle(&self) -> usize {
        let now = self.now_ms();
        let idle_ms = u64::try_from(self.limits.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        let mut table = self.table();
        let idle: Vec<Arc<Activity>> = table
            .open
            .values()
            .filter(|a| {
                a.in_flight.load(Ordering::Acquire) == 0
                    && now.saturating_sub(a.phase_ms.load(Ordering::Acquire)) >= idle_ms
            })
            .cloned()
            .collect();
        for activity in &idle {
            self.shed(&mut table, activity, ShedReason::Idle);
        }
        idle.len()
    }

    /// How often [`Self::close_idle`] should run: often enough that an idle connection is
    /// closed within a tenth of the timeout after it, and at most four times a second.
    pub(crate) fn idle_check_interval(&self) -> Duration {
        (self.limits.idle_timeout / 10).max(Duration::from_millis(250))
    }

    /// Takes `victim` out of the table (its place is free at once) and tells its task to close it.
    fn shed(&self, table: &mut Table, victim: &Arc<Activity>, reason: ShedReason) {
        if table.remove(victim) {
            tracing::debug!(address = %victim.address, ?reason, "connection shed");
            self.metrics.count_shed(reason);
            self.metrics.connection_closed();
            victim.shed.notify_one();
        }
    }
}

impl Table {
    /// Removes `activity`; `false` when it was gone already.
    fn remove(&mut self, activity: &Activity) -> bool {
        if self.open.remove(&activity.id).is_none() {
            return false;
        }
        if let Some(count) = self.per_address.get_mut(&activity.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_address.remove(&activity.address);
            }
        }
        true
    }

    /// The connection not working whose current phase began earliest, more than
    /// `patience_ms` before `now_ms`.
    fn longest_in_phase(&self, now_ms: u64, patience_ms: u64) -> Option<Arc<Activity>> {
        self.open
            .values()
            .filter(|a| !a.working())
            .map(|a| (a.phase_ms.load(Ordering::Acquire), a))
            .filter(|(began, _)| now_ms.saturating_sub(*began) > patience_ms)
            .min_by_key(|(began, a)| (*began, a.id))
            .map(|(_, a)| Arc::clone(a))
    }

    /// The connection (of `address`, if given) whose handler is not running and that is
    /// furthest behind `pace` bytes per second in its current phase (idle, or a request
    /// arriving), by more than `beyond` bytes; the oldest of equals. A connection just
    /// accepted is behind by nothing yet, so it is never taken before one that has been
    /// silent for a while.
    fn furthest_behind(
        &self,
        now_ms: u64,
        pace: u64,
        address: Option<IpAddr>,
        beyond: i128,
    ) -> Option<Arc<Activity>> {
        self.open
            .values()
            .filter(|a| address.is_none_or(|address| a.address == address))
            .filter(|a| !a.working())
            .map(|a| (a.behind(now_ms, pace), std::cmp::Reverse(a.id), a))
            .filter(|(behind, _, _)| *behind > beyond)
            .max_by(|x, y| x.0.cmp(&y.0).then(x.1.cmp(&y.1)))
            .map(|(_, _, a)| Arc::clone(a))
    }
}

impl Activity {
    /// A handler runs (a request past its body): never shed.
    fn working(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > self.receiving.load(Ordering::Acquire)
    }

    /// How many bytes the client is behind `pace` bytes per second in the current phase
    /// (negative: ahead).
    fn behind(&self, now_ms: u64, pace: u64) -> i128 {
        let bytes = self
            .bytes
            .load(Ordering::Relaxed)
            .saturating_sub(self.phase_bytes.load(Ordering::Acquire));
        let elapsed_ms = now_ms.saturating_sub(self.phase_ms.load(Ordering::Acquire));
        i128::from(elapsed_ms) * i128::from(pace) / 1000 - i128::from(bytes)
    }

    /// Counts bytes read from the client.
    pub(crate) fn read(&self, bytes: usize) {
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Completes when the connection is to be closed.
    pub(crate) async fn shed(&self) {
        self.shed.notified().await;
    }
}

impl Activity {
    fn begin_phase(&self) {
        let now_ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.phase_bytes
            .store(self.bytes.load(Ordering::Relaxed), Ordering::Release);
        self.phase_ms.store(now_ms, Ordering::Release);
    }

    /// A request entered its handler: the connection is busy until the guard drops.
    pub(crate) fn request(self: &Arc<Self>) -> RequestGuard {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.begin_phase();
        }
        RequestGuard(Arc::clone(self))
    }

    /// The request is reading its body until the guard drops.
    pub(crate) fn receiving(self: &Arc<Self>) -> ReceivingGuard {
        self.receiving.fetch_add(1, Ordering::AcqRel);
        ReceivingGuard(Arc::clone(self))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let connections = &self.connections;
        let mut table = connections.table();
        if table.remove(&self.activity) {
            connections.metrics.connection_closed();
        }
        drop(table);
        connections.freed.notify_one();
    }
}

/// A request in progress on a connection (see [`Activity::request`]).
pub(crate) struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.begin_phase();
        }
    }
}

/// A request reading its body (see [`Activity::receiving`]).
pub(crate) struct ReceivingGuard(Arc<Activity>);

impl Drop for ReceivingGuard {
    fn drop(&mut self) {
        self.0.receiving.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The address a connection counts against: an IPv6 address's /64 (its network prefix,
/// the rest zero); the IPv4 address an IPv6 one carries (IPv4-mapped, or NAT64's
/// well-known `64:ff9b::/96`, where IPv4 clients share one prefix); any other as it is.
pub(crate) fn network_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => {
            let [a, b, c, d, e, f, ..] = v6.segments();
            if let Some(v4) = v6.to_ipv4_mapped() {
                IpAddr::V4(v4)
            } else if [a, b, c, d, e, f] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [.., w, x, y, z] = v6.octets();
                IpAddr::V4(std::net::Ipv4Addr::new(w, x, y, z))
            } else {
                IpAddr::V6(std::net::Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
            }
        }
        v4 @ IpAddr::V4(_) => v4,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn connections(max: usize, per_address: usize) -> Arc<Connections> {
        Connections::new(
            Limits {
                max,
                per_address,
                idle_timeout: Duration::from_secs(60),
                pace: 240,
                patience: Duration::from_secs(5),
            },
            Arc::default(),
        )
    }

    fn admitted(admission: Admission) -> Slot {
        match admission {
            Admission::Admitted(slot) => slot,
            Admission::Full => panic!("full"),
            Admission::AddressFull => panic!("address full"),
        }
    }

    fn open(table: &Connections, slot: &Slot) -> bool {
        table.table().open.contains_key(&slot.activity.id)
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    // Times are ms since the table's epoch, given explicitly (`admit_at`); requests mark
    // their phase on the real clock, which is near 0 here.

    #[test]
    fn a_full_server_sheds_the_connection_furthest_behind_and_never_a_working_one() {
        let table = connections(3, 0);
        let working = admitted(table.admit_at(A, 1_000));
        let _busy = working.activity.request();
        let chatty = admitted(table.admit_at(A, 1_000));
        chatty.activity.read(10_000);
        let silent = admitted(table.admit_at(A, 1_000));

        // One second later the silent one is 240 bytes behind, the chatty one ahead.
        let newcomer = admitted(table.admit_at(B, 2_000));
        assert_eq!(table.table().open.len(), 3);
        assert!(!open(&table, &silent) && open(&table, &chatty) && open(&table, &working));
        assert!(
            futures_now(silent.activity.shed()),
            "the shed connection's task is told to close it"
        );

        // Just accepted, the newcomer is behind by nothing: the next one waits rather than
        // take its place before it could send.
        assert!(matches!(table.admit_at(B, 2_000), Admission::Full));

        // A body being received slowly is no shield.
        let _receiving = newcomer.activity.request();
        let _guard = newcomer.activity.receiving();
        let third = admitted(table.admit_at(B, 60_000));
        assert!(!open(&table, &newcomer) && open(&table, &third));

        // The chatty one fell behind too in the meantime; once it works, only the newest
        // is left, and it is behind by nothing: the next one waits.
        let _busy2 = chatty.activity.request();
        assert!(matches!(table.admit_at(B, 60_000), Admission::Full));
    }

    /// Connections that keep ahead of the pace (a body trickling in just fast enough) hold
    /// their places only for the patience: past it, the one whose phase began first gives
    /// its place up to a newcomer, never a working one.
    #[test]
    fn a_full_server_sheds_the_connection_longest_in_its_phase_past_the_patience() {
        let table = connections(3, 0);
        let working = admitted(table.admit_at(A, 0));
        let _busy = working.activity.request();
        let first = admitted(table.admit_at(A, 0));
        let second = admitted(table.admit_at(A, 1_000));
        for slot in [&first, &second] {
            slot.activity.read(1_000_000);
        }
        // Within the patience (5 s): nobody gives way.
        assert!(matches!(table.admit_at(B, 4_000), Admission::Full));
        // Past it, the first (its phase began at 0), though far ahead of the pace.
        let newcomer = admitted(table.admit_at(B, 5_500));
        assert!(!open(&table, &first) && open(&table, &second) && open(&table, &working));
        newcomer.activity.read(1_000_000);
        // The second's phase is past the patience too; the newcomer's is not.
        let next = admitted(table.admit_at(B, 6_500));
        assert!(!open(&table, &second) && open(&table, &newcomer) && open(&table, &next));
        assert!(matches!(table.admit_at(B, 6_500), Admission::Full));
    }

    #[test]
    fn an_ipv6_clients_addresses_within_its_64_count_as_one() {
        let table = connections(10, 2);
        let in_64 =
            |last: u16| IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, last));
        let elsewhere = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 1));
        let first = admitted(table.admit_at(in_64(1), 0));
        let second = admitted(table.admit_at(in_64(2), 0));
        let other = admitted(table.admit_at(elsewhere, 0));
        // A third address of the same /64 is over its limit: it sheds the oldest of them.
        let third = admitted(table.admit_at(in_64(3), 1_000));
        assert!(!open(&table, &first) && open(&table, &second) && open(&table, &third));
        assert!(open(&table, &other));
        // An IPv4-mapped address is its IPv4 address, and so is a NAT64 one.
        let mapped = "::ffff:127.0.0.1".parse().unwrap();
        let _a = admitted(table.admit_at(mapped, 0));
        assert_eq!(table.table().per_address[&A], 1);
        let nat64 = "64:ff9b::7f00:1".parse().unwrap();
        let _b = admitted(table.admit_at(nat64, 0));
        assert_eq!(table.table().per_address[&A], 2);
    }

    #[test]
    fn an_address_at_its_limit_sheds_its_own_connections_only() {
        let table = connections(10, 2);
        let other = admitted(table.admit_at(B, 0));
        let first = admitted(table.admit_at(A, 0));
        let second = admitted(table.admit_at(A, 0));
        let third = admitted(table.admit_at(A, 1_000));
        assert!(!open(&table, &first) && open(&table, &second) && open(&table, &other));
        assert_eq!(table.table().per_address[&A], 2);

        // Connections of the address that are not behind yet still give their place up,
        // the oldest first, rather than the newcomer being turned away.
        let fourth = admitted(table.admit_at(A, 1_000));
        assert!(!open(&table, &second) && open(&table, &third) && open(&table, &fourth));

        let _working3 = third.activity.request();
        let _working4 = fourth.activity.request();
        assert!(matches!(table.admit_at(A, 5_000), Admission::AddressFull));
        assert!(matches!(table.admit_at(B, 5_000), Admission::Admitted(_)));
    }

    #[test]
    fn idle_connections_close_after_the_timeout_and_busy_ones_do_not() {
        let table = Connections::new(
            Limits {
                max: 10,
                per_address: 0,
                idle_timeout: Duration::ZERO,
                pace: 240,
                patience: Duration::from_secs(5),
            },
            Arc::default(),
        );
        let idle = admitted(table.admit(A));
        let busy = admitted(table.admit(A));
        let _request = busy.activity.request();
        assert_eq!(table.close_idle(), 1);
        assert!(!open(&table, &idle) && open(&table, &busy));
        drop(idle);
        assert_eq!(
            table.table().open.len(),
            1,
            "a shed slot is not freed twice"
        );
    }

    /// Whether `future` is ready at once.
    fn futures_now(future: impl std::future::Future<Output = ()>) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::pin::pin!(future).poll(&mut cx).is_ready()
    }
}
