//! `--zones K`: node `i` of the trial is in zone `z<i mod K>` (on etcd its `lock.zone`, on
//! Leases its Node's `topology.kubernetes.io/zone` label), and every rebootd runs with
//! `lock.max_per_zone` (`--max-per-zone`, default 1). The invariant: never more than
//! `max_per_zone` holders, and never more than `max_per_zone` nodes down, in one zone, as the
//! outside watchers saw them.

use std::collections::BTreeMap;

use super::check::{down_at_once, Observed, Timeline};
use super::{Backend, ChaosOptions};

/// The zones of a trial's nodes and the cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zoning {
    /// Node name → zone.
    pub of: BTreeMap<String, String>,
    pub max_per_zone: u64,
}

/// The zone of node `i` of `k` zones.
pub fn zone_of(i: usize, k: usize) -> String {
    format!("z{}", i % k.max(1))
}

/// The zoning of a trial's nodes (`names`, in order), when `--zones` is on.
pub fn zoning(opts: &ChaosOptions, names: &[String]) -> Option<Zoning> {
    (opts.zones > 0).then(|| Zoning {
        of: names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), zone_of(i, opts.zones)))
            .collect(),
        max_per_zone: opts.max_per_zone,
    })
}

/// Node `i`'s configuration `config` with the zone keys in its `[lock]` table.
pub fn configure(opts: &ChaosOptions, i: usize, config: String) -> String {
    if opts.zones == 0 {
        return config;
    }
    let mut keys = format!("max_per_zone = {}\n", opts.max_per_zone);
    if opts.backend != Backend::Kubernetes {
        keys.push_str(&format!("zone = {:?}\n", zone_of(i, opts.zones)));
    }
    config.replacen("[lock]\n", &format!("[lock]\n{keys}"), 1)
}

/// Where a timeline put more than the cap in one zone: the first such moment, described.
fn over(t: &Timeline, z: &Zoning, what: &str) -> Option<String> {
    t.iter().find_map(|(at, set)| {
        let mut per: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for n in set {
            if let Some(zone) = z.of.get(n) {
                per.entry(zone).or_default().push(n);
            }
        }
        per.into_iter()
            .find(|(_, ns)| ns.len() as u64 > z.max_per_zone)
            .map(|(zone, ns)| {
                format!(
                    "{} {what} in zone {zone} at once (max_per_zone {}): {:.2}s {ns:?}",
                    ns.len(),
                    z.max_per_zone,
                    at.as_secs_f64()
                )
            })
    })
}

/// The zone invariant's violations (none without `--zones`).
pub fn violations(o: &Observed) -> Vec<String> {
    let Some(z) = &o.zoning else {
        return Vec::new();
    };
    [
        over(&o.holders, z, "holders"),
        over(&down_at_once(o), z, "nodes down"),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_spread_round_the_zones_and_configured() {
        assert_eq!(
            (0..5).map(|i| zone_of(i, 2)).collect::<Vec<_>>(),
            ["z0", "z1", "z0", "z1", "z0"]
        );
        let mut opts = ChaosOptions::new("/bin/true");
        let config = "[lock]\nbackend = \"etcd\"\n".to_owned();
        assert_eq!(configure(&opts, 1, config.clone()), config);
        opts.zones = 3;
        assert_eq!(
            configure(&opts, 4, config.clone()),
            "[lock]\nmax_per_zone = 1\nzone = \"z1\"\nbackend = \"etcd\"\n"
        );
        opts.backend = Backend::Kubernetes;
        assert!(!configure(&opts, 4, config).contains("\nzone ="));
    }

    /// Two holders of one zone at once break it; two of different zones do not; nodes down
    /// count too.
    #[test]
    fn more_than_the_cap_in_a_zone_is_reported() {
        let mut o = super::super::check::tests::clean();
        assert!(violations(&o).is_empty(), "no zones, no check");
        let of = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(n, z)| (n.to_string(), z.to_string()))
                .collect()
        };
        // a and b hold together (and are down together) in the clean history.
        o.zoning = Some(Zoning {
            of: of(&[("a", "z0"), ("b", "z1"), ("c", "z0")]),
            max_per_zone: 1,
        });
        assert!(violations(&o).is_empty(), "{:?}", violations(&o));
        o.zoning = Some(Zoning {
            of: of(&[("a", "z0"), ("b", "z0"), ("c", "z1")]),
            max_per_zone: 1,
        });
        let v = violations(&o);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(
            v[0].starts_with("2 holders in zone z0 at once (max_per_zone 1): 1.10s"),
            "{v:?}"
        );
        assert!(v[1].starts_with("2 nodes down in zone z0 at once"), "{v:?}");
    }
}
