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
//! IPv6 addresses count by their /64 (one host is given a /64 to pick from); at most
//! [`ADDRESSES_KEPT`] addresses are kept, those whose allowance is whole are forgotten, and
//! beyond them new addresses share one allowance.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong tokens an address may present at once.
const BURST: u32 = 10;

/// How long an address's allowance takes to grow back by one guess.
const INTERVAL: Duration = Duration::from_secs(6);

/// Addresses kept one by one; past them, new addresses share one allowance.
const ADDRESSES_KEPT: usize = 4096;

/// Whom a guess is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Guesser {
    V4([u8; 4]),
    /// The /64 of an IPv6 address.
    V6([u8; 8]),
    /// A caller whose address is not known.
    Unknown,
    /// Every address past [`ADDRESSES_KEPT`].
    Overflow,
}

impl Guesser {
    fn of(client: Option<IpAddr>) -> Self {
        match client.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(ip)) => Self::V4(ip.octets()),
            Some(IpAddr::V6(ip)) => Self::V6(prefix_64(ip)),
            None => Self::Unknown,
        }
    }
}

fn prefix_64(ip: Ipv6Addr) -> [u8; 8] {
    let mut prefix = [0; 8];
    prefix.copy_from_slice(&ip.octets()[..8]);
    prefix
}

/// The guesses of the operating API's token, by address.
#[derive(Debug, Default)]
pub(super) struct Guesses {
    /// When each address's allowance is whole again.
    whole_at: Mutex<HashMap<Guesser, Instant>>,
}

/// A guess taken out of its address's allowance: [`Guess::right`] gives it back.
#[must_use = "a right token gives its guess back"]
pub(super) struct Guess<'a> {
    guesses: &'a Guesses,
    guesser: Guesser,
}

impl Guess<'_> {
    /// The token was right: the guess does not count.
    pub(super) fn right(self) {
        let mut whole_at = self.guesses.whole_at();
        if let Some(at) = whole_at.get_mut(&self.guesser) {
            *at = at.checked_sub(INTERVAL).unwrap_or(*at);
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
        let mut whole_at = self.whole_at();
        let mut guesser = Guesser::of(client);
        if !whole_at.contains_key(&guesser) && whole_at.len() >= ADDRESSES_KEPT {
            whole_at.retain(|_, at| *at > now);
            if whole_at.len() >= ADDRESSES_KEPT {
                guesser = Guesser::Overflow;
            }
        }
        let at = whole_at.entry(guesser).or_insert(now);
        let spent = at.saturating_duration_since(now);
        let allowed = INTERVAL * (BURST - 1);
        if spent > allowed {
            return Err(spent - allowed);
        }
        *at = (*at).max(now) + INTERVAL;
        if spent + INTERVAL > allowed {
            tracing::warn!(
                client = ?client,
                guesses = BURST,
                "admin: wrong tokens from this address; its next credentials are refused (429) \
                 until its allowance grows back, one guess per {}s",
                INTERVAL.as_secs()
            );
        }
        Ok(Guess {
            guesses: self,
            guesser,
        })
    }

    fn whole_at(&self) -> std::sync::MutexGuard<'_, HashMap<Guesser, Instant>> {
        self.whole_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
            if let Err(wait) = guesses.guess(client, now) {
                return (passed, wait);
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

    #[test]
    fn past_the_addresses_kept_new_ones_share_an_allowance_until_old_ones_are_whole() {
        let guesses = Guesses::default();
        let now = Instant::now();
        for n in 0..ADDRESSES_KEPT as u32 {
            let client = Some(IpAddr::from(n.to_be_bytes()));
            drop(guesses.guess(client, now).unwrap());
        }
        let (a, b) = (ip("198.51.100.1"), ip("198.51.100.2"));
        assert_eq!(guess_wrong_until_refused(&guesses, a, now).0, BURST);
        assert!(
            guesses.guess(b, now).is_err(),
            "shares the overflow's allowance"
        );
        // Once the addresses kept are whole again they are forgotten, and a new one counts
        // on its own.
        let later = now + INTERVAL;
        assert_eq!(guess_wrong_until_refused(&guesses, b, later).0, BURST);
        assert_eq!(guesses.whole_at().len(), 2);
    }
}
