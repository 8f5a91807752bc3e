//! The FIFO queue of the Lease semaphore's waiters: what a waiter Lease says, whether it is
//! live, a waiter's rank, and the waiter Lease's name for a node. Pure: no I/O.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;

/// Annotation of a waiter Lease: the waiting node's name. Not `spec.holderIdentity`: tools and
/// monitors (and the lab's chaos checker) read a Lease with a holder as a held lock.
pub const ANNOTATION_WAITER_NODE: &str = "rebootd.io/waiter-node";

/// What sits between the semaphore name and the node in a waiter Lease's name. Not digits, so
/// a waiter Lease is never read as a slot `<name>-<digits>`.
const WAITER_INFIX: &str = "-waiter-";

/// Longest object name Kubernetes accepts (a DNS subdomain).
const MAX_OBJECT_NAME: usize = 253;

/// One waiter, as its Lease says.
#[derive(Debug, Clone)]
pub(super) struct Waiter {
    pub name: String,
    /// `spec.acquireTime`: when it started waiting (its place in the queue).
    pub since: jiff::Timestamp,
    /// `renewTime` (else `acquireTime`) + `leaseDurationSeconds`.
    pub expires: jiff::Timestamp,
    pub lease: Lease,
}

impl Waiter {
    /// The waiter `lease` describes; a Lease without `acquireTime` waits since the beginning
    /// of time and, without `renewTime` and a duration, is dead.
    pub fn from_lease(lease: Lease) -> Waiter {
        let spec = lease.spec.clone().unwrap_or_default();
        let since = spec
            .acquire_time
            .map(|t| t.0)
            .unwrap_or(jiff::Timestamp::MIN);
        let renewed = spec.renew_time.map(|t| t.0).unwrap_or(since);
        let ttl =
            jiff::SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0).into());
        Waiter {
            name: lease.metadata.name.clone().unwrap_or_default(),
            since,
            expires: renewed.saturating_add(ttl).unwrap_or(jiff::Timestamp::MAX),
            lease,
        }
    }

    /// Live while `expires` + `slack` (clock skew between writers) is in the future.
    pub fn live(&self, now: jiff::Timestamp, slack: Duration) -> bool {
        self.deadline(slack) > now
    }

    /// When it stops being live.
    pub fn deadline(&self, slack: Duration) -> jiff::Timestamp {
        let slack = jiff::SignedDuration::try_from(slack).unwrap_or(jiff::SignedDuration::MAX);
        self.expires
            .saturating_add(slack)
            .unwrap_or(jiff::Timestamp::MAX)
    }
}

/// Where a waiter stands in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    /// Live waiters ahead.
    pub rank: usize,
    /// When the first live waiter ahead stops being live (the rank may drop then).
    pub next_expiry: Option<jiff::Timestamp>,
}

/// The position of the waiter `(since, name)` among `waiters` (itself excluded), ordered by
/// `(acquireTime, name)`; dead waiters do not count.
pub(super) fn position<'a>(
    waiters: impl IntoIterator<Item = &'a Waiter>,
    since: jiff::Timestamp,
    name: &str,
    now: jiff::Timestamp,
    slack: Duration,
) -> Position {
    let mut pos = Position {
        rank: 0,
        next_expiry: None,
    };
    for w in waiters {
        if w.name == name || (w.since, w.name.as_str()) >= (since, name) || !w.live(now, slack) {
            continue;
        }
        pos.rank += 1;
        let d = w.deadline(slack);
        pos.next_expiry = Some(pos.next_expiry.map_or(d, |e: jiff::Timestamp| e.min(d)));
    }
    pos
}

/// The waiter Lease name prefix of semaphore `semaphore`.
pub(super) fn prefix(semaphore: &str) -> String {
    format!("{semaphore}{WAITER_INFIX}")
}

/// The waiter Lease name of `node` in semaphore `semaphore`: `<semaphore>-waiter-<node>`, the
/// node escaped (to `[a-z0-9-]`, shortened, a hash appended) when it is not a valid name part,
/// is all digits, or is too long.
pub(super) fn waiter_name(semaphore: &str, node: &str) -> String {
    let prefix = prefix(semaphore);
    let room = MAX_OBJECT_NAME.saturating_sub(prefix.len());
    let as_is =
        is_dns_subdomain(node) && !node.bytes().all(|b| b.is_ascii_digit()) && node.len() <= room;
    if as_is {
        return format!("{prefix}{node}");
    }
    let hash = format!("h{:08x}", fnv1a(node.as_bytes()));
    let clean: String = node
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    let keep = room.saturating_sub(hash.len() + 1);
    let clean = clean.get(..keep.min(clean.len())).unwrap_or("");
    let clean = clean.trim_matches('-');
    if clean.is_empty() {
        format!("{prefix}{hash}")
    } else {
        format!("{prefix}{clean}-{hash}")
    }
}

/// Whether `s` is a DNS-1123 subdomain (what a node name is).
fn is_dns_subdomain(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.len() <= MAX_OBJECT_NAME
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && alnum(b[0])
                && alnum(b[b.len() - 1])
                && b.iter().all(|&c| alnum(c) || c == b'-')
        })
}

/// 32-bit FNV-1a: a hash that stays the same across builds (the name must not change when
/// rebootd is upgraded).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn ts(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn waiter(name: &str, since: i64, renewed: i64, ttl: i32) -> Waiter {
        let mut l = Lease::default();
        l.metadata.name = Some(name.into());
        l.spec = Some(LeaseSpec {
            acquire_time: Some(MicroTime(ts(since))),
            renew_time: Some(MicroTime(ts(renewed))),
            lease_duration_seconds: Some(ttl),
            ..LeaseSpec::default()
        });
        Waiter::from_lease(l)
    }

    #[test]
    fn rank_counts_live_waiters_ahead_in_order() {
        let slack = Duration::from_secs(1);
        let ws = [
            waiter("r-waiter-a", 0, 10, 30),
            waiter("r-waiter-b", 1, 1, 5), // dead at 6 + 1 (slack)
            waiter("r-waiter-c", 2, 10, 30),
            waiter("r-waiter-d", 2, 10, 30),
        ];
        let at = |now| position(&ws, ts(2), "r-waiter-d", ts(now), slack);
        assert_eq!(at(5).rank, 3);
        assert_eq!(at(5).next_expiry, Some(ts(7)));
        assert_eq!(at(7).rank, 2, "b is dead");
        assert_eq!(position(&ws, ts(0), "r-waiter-a", ts(5), slack).rank, 0);
        // A newcomer (no Lease yet) queues behind everyone.
        assert_eq!(position(&ws, ts(3), "r-waiter-z", ts(8), slack).rank, 3);
    }

    #[test]
    fn waiter_names_never_look_like_slots() {
        assert_eq!(waiter_name("reboot", "node-a"), "reboot-waiter-node-a");
        assert_eq!(
            waiter_name("reboot", "w1.example.com"),
            "reboot-waiter-w1.example.com"
        );
        let digits = waiter_name("reboot", "12");
        assert!(digits.starts_with("reboot-waiter-12-h"), "{digits}");
        let odd = waiter_name("reboot", "Node_A");
        assert!(odd.starts_with("reboot-waiter-node-a-h"), "{odd}");
        assert_ne!(odd, waiter_name("reboot", "node-a"));
        let long = waiter_name(&"s".repeat(63), &"n".repeat(253));
        assert!(
            long.len() <= MAX_OBJECT_NAME && is_dns_subdomain(&long),
            "{long}"
        );
        assert!(is_dns_subdomain(&waiter_name("reboot", "-.-")));
    }
}
