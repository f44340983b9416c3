//! Guesses of the operating API's token, counted per client address: a caller that presents
//! a wrong token (a bearer, or the inspector's login form) more than [`BURST`] times gets
//! 429 with `Retry-After` for every credential it presents next, the right one included,
//! until its allowance grows back — one guess per [`INTERVAL`]. The token is then checked
//! at most ten times a minute from one address, however fast it is guessed.
//!
//! Each address holds one instant (the generic cell rate algorithm): the time at which its
//! allowance is whole again, moved on by [`INTERVAL`] for each guess. A guess is taken out
//! of the allowance before its token is compared and given back when it was right, so that
//! guesses sent at once cannot all pass before the first is counted; and a caller out of
//! guesses is refused without its token being compared, so that a refusal says nothing of
//! whether it was right.
//!
//! IPv6 addresses count by their /64 (one host is given a /64 to pick from). At most
//! [`ADDRESSES_KEPT`] addresses are kept one by one, those whose allowance is whole
//! forgotten first; past them, new addresses share one allowance per IPv4 /24 or IPv6 /48
//! (at most [`NETWORKS_KEPT`] of them, then one for all): many addresses guessing at once
//! spend their own network's allowance, not an operator's elsewhere.
//!
//! Counted in memory, per process: a restart starts every address afresh, and each
//! instance behind a load balancer counts on its own. An inspector session is not a guess:
//! a browser holding one is not refused.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong tokens an address may present at once.
const BURST: u32 = 10;

/// How long an address's allowance takes to grow back by one guess.
const INTERVAL: Duration = Duration::from_secs(6);

/// Addresses kept one by one.
const ADDRESSES_KEPT: usize = 4096;

/// Networks kept, past [`ADDRESSES_KEPT`]; past them, one allowance for all.
const NETWORKS_KEPT: usize = 1024;

/// Whom a guess is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Guesser {
    V4([u8; 4]),
    /// The /64 of an IPv6 address.
    V6([u8; 8]),
    /// An IPv4 /24, for its addresses past [`ADDRESSES_KEPT`].
    Network4([u8; 3]),
    /// An IPv6 /48, for its addresses past [`ADDRESSES_KEPT`].
    Network6([u8; 6]),
    /// Every address past [`ADDRESSES_KEPT`] and [`NETWORKS_KEPT`], and a caller whose
    /// address is not known.
    Everyone,
}

impl Guesser {
    fn of(client: Option<IpAddr>) -> Self {
        match client.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(ip)) => Self::V4(ip.octets()),
            Some(IpAddr::V6(ip)) => Self::V6(first(&ip.octets())),
            // Not known (a server of one's own that does not give it; the operating API
            // refuses such a caller first): counted with everyone past the networks.
            None => Self::Everyone,
        }
    }

    /// The network this address shares an allowance with once no more are kept one by one.
    fn network(self) -> Self {
        match self {
            Self::V4(octets) => Self::Network4(first(&octets)),
            Self::V6(prefix) => Self::Network6(first(&prefix)),
            _ => Self::Everyone,
        }
    }

    fn is_network(self) -> bool {
        matches!(self, Self::Network4(_) | Self::Network6(_))
    }
}

/// The first `N` bytes of `bytes` (which has at least as many).
fn first<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut prefix = [0; N];
    prefix.copy_from_slice(&bytes[..N]);
    prefix
}

/// One address's (or network's) allowance.
#[derive(Debug, Clone, Copy)]
struct Allowance {
    /// When it is whole again.
    whole_at: Instant,
    /// Running out was logged, since it was last whole.
    warned: bool,
}

/// The guesses of the operating API's token, by address.
#[derive(Debug, Default)]
pub(super) struct Guesses {
    allowances: Mutex<HashMap<Guesser, Allowance>>,
}

/// A guess taken out of its address's allowance: [`Guess::right`] gives it back,
/// [`Guess::wrong`] keeps it.
#[must_use = "a right token gives its guess back"]
pub(super) struct Guess<'a> {
    guesses: &'a Guesses,
    guesser: Guesser,
    client: Option<IpAddr>,
    /// This guess spent the allowance: the next is refused.
    last: bool,
}

impl Guess<'_> {
    /// The token was right: the guess does not count.
    pub(super) fn right(self) {
        let mut allowances = self.guesses.allowances();
        if let Some(allowance) = allowances.get_mut(&self.guesser) {
            let at = allowance.whole_at;
            allowance.whole_at = at.checked_sub(INTERVAL).unwrap_or(at);
        }
    }

    /// The token was wrong: the guess counts; the address running out is logged, once
    /// until its allowance is whole again.
    pub(super) fn wrong(self) {
        if !self.last {
            return;
        }
        let mut allowances = self.guesses.allowances();
        let Some(allowance) = allowances.get_mut(&self.guesser) else {
            return;
        };
        if !allowance.warned {
            allowance.warned = true;
            drop(allowances);
            tracing::warn!(
                client = ?self.client,
                counted_as = ?self.guesser,
                "admin: wrong tokens from this address; its credentials are refused (429) \
                 until its allowance grows back, one guess per {}s",
                INTERVAL.as_secs()
            );
        }
    }
}

impl Guesses {
    /// Takes a guess of the token by `client` out of its allowance, `now`; or how long until
    /// it may guess again.
    pub(super) fn guess(
        &self,
        client: Option<IpAddr>,
        now: Instant,
    ) -> Result<Guess<'_>, Duration> {
        let mut allowances = self.allowances();
        let guesser = kept_as(&mut allowances, Guesser::of(client), now);
        let allowance = allowances.entry(guesser).or_insert(Allowance {
            whole_at: now,
            warned: false,
        });
        if allowance.whole_at <= now {
            allowance.warned = false;
        }
        let spent = allowance.whole_at.saturating_duration_since(now);
        let allowed = INTERVAL * (BURST - 1);
        if spent > allowed {
            return Err(spent - allowed);
        }
        allowance.whole_at = allowance.whole_at.max(now) + INTERVAL;
        Ok(Guess {
            guesses: self,
            guesser,
            client,
            last: spent + INTERVAL > allowed,
        })
    }

    fn allowances(&self) -> std::sync::MutexGuard<'_, HashMap<Guesser, Allowance>> {
        self.allowances
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whom `guesser`'s guess counts against in `allowances`: itself while addresses are kept
/// one by one (those whole again forgotten first), then its network, then everyone.
fn kept_as(
    allowances: &mut HashMap<Guesser, Allowance>,
    guesser: Guesser,
    now: Instant,
) -> Guesser {
    if allowances.contains_key(&guesser) {
        return guesser;
    }
    let counted = |allowances: &HashMap<Guesser, Allowance>| {
        let networks = allowances.keys().filter(|g| g.is_network()).count();
        (allowances.len() - networks, networks)
    };
    if counted(allowances).0 >= ADDRESSES_KEPT {
        allowances.retain(|_, allowance| allowance.whole_at > now);
    }
    let (addresses, networks) = counted(allowances);
    if addresses < ADDRESSES_KEPT {
        return guesser;
    }
    let network = guesser.network();
    if allowances.contains_key(&network) || (network.is_network() && networks < NETWORKS_KEPT) {
        network
    } else {
        Guesser::Everyone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Option<IpAddr> {
        text.parse().ok()
    }

    /// Wrong guesses by `client` at `now` until one is refused: how many passed, and the
    /// wait the refusal named.
    fn guess_wrong_until_refused(
        guesses: &Guesses,
        client: Option<IpAddr>,
        now: Instant,
    ) -> (u32, Duration) {
        for passed in 0..100 {
            match guesses.guess(client, now) {
                Ok(guess) => guess.wrong(),
                Err(wait) => return (passed, wait),
            }
        }
        panic!("never refused");
    }

    #[test]
    fn ten_wrong_tokens_at_once_pass_and_the_next_waits_for_the_allowance_to_grow() {
        let guesses = Guesses::default();
        let now = Instant::now();
        let client = ip("192.0.2.7");
        assert_eq!(
            guess_wrong_until_refused(&guesses, client, now),
            (BURST, INTERVAL)
        );
        let later = now + INTERVAL / 2;
        assert_eq!(guesses.guess(client, later).err(), Some(INTERVAL / 2));
        // One guess grows back per interval, not the whole allowance.
        let later = now + INTERVAL;
        assert_eq!(
            guess_wrong_until_refused(&guesses, client, later),
            (1, INTERVAL)
        );
        let whole = now + INTERVAL * (2 * BURST);
        assert_eq!(guess_wrong_until_refused(&guesses, client, whole).0, BURST);
    }

    #[test]
    fn a_right_token_gives_its_guess_back_and_others_count_apart() {
        let guesses = Guesses::default();
        let now = Instant::now();
        let client = ip("192.0.2.7");
        for _ in 0..3 * BURST {
            guesses.guess(client, now).unwrap().right();
        }
        assert_eq!(guess_wrong_until_refused(&guesses, client, now).0, BURST);
        // Out of guesses, even the right token is refused: a refusal tells nothing.
        assert!(guesses.guess(client, now).is_err());
        assert_eq!(
            guess_wrong_until_refused(&guesses, ip("192.0.2.8"), now).0,
            BURST
        );
        assert_eq!(guess_wrong_until_refused(&guesses, None, now).0, BURST);
    }

    #[test]
    fn an_ipv6_host_counts_by_its_64_and_a_mapped_ipv4_as_itself() {
        let guesses = Guesses::default();
        let now = Instant::now();
        assert_eq!(
            guess_wrong_until_refused(&guesses, ip("2001:db8:1:2::1"), now).0,
            BURST
        );
        assert!(guesses.guess(ip("2001:db8:1:2:ffff::9"), now).is_err());
        assert_eq!(
            guess_wrong_until_refused(&guesses, ip("2001:db8:1:3::1"), now).0,
            BURST
        );
        assert_eq!(
            guess_wrong_until_refused(&guesses, ip("192.0.2.9"), now).0,
            BURST
        );
        assert!(guesses.guess(ip("::ffff:192.0.2.9"), now).is_err());
    }

    /// Past the addresses kept one by one, a new address shares its network's allowance:
    /// an attacker's many addresses do not spend an operator's elsewhere.
    #[test]
    fn past_the_addresses_kept_new_ones_share_their_networks_until_old_ones_are_whole() {
        let guesses = Guesses::default();
        let now = Instant::now();
        for n in 0..ADDRESSES_KEPT as u32 {
            let client = Some(IpAddr::from((0x0a00_0000 + n).to_be_bytes()));
            guesses.guess(client, now).unwrap().wrong();
        }
        let (a, b) = (ip("198.51.100.1"), ip("198.51.100.2"));
        assert_eq!(guess_wrong_until_refused(&guesses, a, now).0, BURST);
        assert!(guesses.guess(b, now).is_err(), "shares its /24's allowance");
        let elsewhere = ip("203.0.113.9");
        assert_eq!(guess_wrong_until_refused(&guesses, elsewhere, now).0, BURST);
        // Once the addresses kept are whole again they are forgotten, and a new one counts
        // on its own.
        let later = now + INTERVAL;
        assert_eq!(guess_wrong_until_refused(&guesses, b, later).0, BURST);
        assert_eq!(guesses.allowances().len(), 3, "two networks and b");
    }

    #[test]
    fn past_the_networks_kept_everyone_else_shares_one_allowance() {
        let guesses = Guesses::default();
        let now = Instant::now();
        for n in 0..(ADDRESSES_KEPT + NETWORKS_KEPT) as u32 {
            let client = Some(IpAddr::from((0x0a00_0000 + (n << 8)).to_be_bytes()));
            guesses.guess(client, now).unwrap().wrong();
        }
        let last = ip("198.51.100.1");
        assert_eq!(guess_wrong_until_refused(&guesses, last, now).0, BURST);
        assert!(guesses.guess(ip("203.0.113.9"), now).is_err());
        assert_eq!(
            guesses.allowances().len(),
            ADDRESSES_KEPT + NETWORKS_KEPT + 1
        );
    }
}
