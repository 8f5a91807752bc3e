//! The FIFO queue of the Lease semaphore's waiters: what a waiter Lease says (its place) and
//! the waiter Lease's name for a node. Whether a waiter is alive is the lock core's business
//! (its Lease's `resourceVersion` changes with each renewal). Pure: no I/O.

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
    pub lease: Lease,
}

impl Waiter {
    /// The waiter `lease` describes; a Lease without `acquireTime` waits since the beginning
    /// of time.
    pub fn from_lease(lease: Lease) -> Waiter {
        Waiter {
            name: lease.metadata.name.clone().unwrap_or_default(),
            since: since(&lease),
            lease,
        }
    }
}

/// When the waiter of waiter Lease `lease` started waiting (`acquireTime`; without one, the
/// beginning of time).
pub(super) fn since(lease: &Lease) -> jiff::Timestamp {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .map(|t| t.0)
        .unwrap_or(jiff::Timestamp::MIN)
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
