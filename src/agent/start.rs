//! The start of a cycle: the process starting, in the boot it knows or in a new one, and a
//! trigger saying the host needs a reboot.

use super::enter;
use crate::need::Need;
use crate::state::{Phase, State};
use jiff::Timestamp;

/// The process started in the boot `boot_id`. A new boot ends the reboot this cycle was for,
/// whoever asked for it. So does a soft reboot, which keeps the boot id: systemd's
/// `SoftRebootsCount` (`soft_reboots`) is higher than the count on record from before the
/// call. Otherwise the same boot means a reboot asked for did not happen.
pub(super) fn started(
    s: &mut State,
    boot_id: String,
    soft_reboots: Option<u64>,
    now: Timestamp,
) -> String {
    if s.boot_id == boot_id {
        let before = s.reboot.as_ref().and_then(|r| r.soft_reboots);
        return match (before, soft_reboots) {
            (Some(before), Some(after)) if after > before => new_boot(
                s,
                &format!(
                    "soft reboot: SoftRebootsCount {before} -> {after}, boot id {boot_id} kept"
                ),
                &boot_id,
                now,
            ),
            _ => same_boot(s, &boot_id),
        };
    }
    let previous = std::mem::replace(&mut s.boot_id, boot_id.clone());
    new_boot(
        s,
        &format!("boot id {previous} -> {boot_id}"),
        &boot_id,
        now,
    )
}

/// A restart in the boot on record: carry on, asking again for a reboot that was on record.
fn same_boot(s: &mut State, boot_id: &str) -> String {
    match s.reboot.take() {
        // The host is still up in the boot the reboot was asked in: it did not happen (or was
        // never asked for, if the crash came first). Waiting out the timeout would hold the
        // slot for nothing; check the window and the blockers again and ask again now (a second
        // request joins a pending one).
        Some(r) => {
            s.failed_attempts += 1;
            let why = format!(
                "restarted in the same boot {boot_id}; the reboot requested at {} had not happened; asking again (failed attempts: {})",
                r.requested_at, s.failed_attempts
            );
            s.last_error = Some(why.clone());
            why
        }
        None => format!("restarted in the same boot {boot_id}; resuming"),
    }
}

/// The reboot happened at `now`: the need, the request and the attempts behind it are done.
fn need_met(s: &mut State, now: Timestamp) {
    s.reason = None;
    s.reboot = None;
    s.retry_at = None;
    s.failed_attempts = 0;
    s.last_error = None;
    s.last_reboot = Some(now);
}

/// A start in a new boot (or after a soft reboot; `seen` says how it shows): the host
/// rebooted. Before the reboot, the cycle ends: through the post-boot checks when a slot or
/// rebootd's cordon is held or the reboot was ours, else idle.
fn new_boot(s: &mut State, seen: &str, boot_id: &str, now: Timestamp) -> String {
    match s.phase {
        Phase::Idle => return format!("new boot {boot_id}"),
        // Backing out of an attempt (a lost slot, a closed window) when the host went down:
        // logind had accepted a reboot before. The need kept for the next attempt is met by
        // this boot (a trigger that still says so starts a new cycle): the back-out finishes,
        // then idle.
        Phase::Uncordoning | Phase::Releasing if s.reason.is_some() => {
            need_met(s, now);
            return format!(
                "new boot {boot_id} while backing out of a reboot ({seen}): the need is met; finishing the back-out, then idle"
            );
        }
        Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing => {
            return format!("new boot {boot_id} during post-boot checks; resuming");
        }
        _ => {}
    }
    // Ours: a request is on record, or one was made in this rebooting episode and may still
    // have been pending in logind when it was put aside (a restart in the same boot, a timeout)
    // to be asked again.
    let ours = s.phase == Phase::Rebooting && (s.reboot.is_some() || s.failed_attempts > 0);
    let why = if ours {
        format!("rebooted: {seen}")
    } else {
        format!(
            "the host rebooted outside rebootd's control in phase {} \
             ({seen})",
            s.phase
        )
    };
    need_met(s, now);
    if ours {
        s.reboots += 1;
    }
    let post_boot = s.slot_held || s.cordoned_by_us || ours;
    let next = if post_boot {
        Phase::WaitingForHealthy
    } else {
        Phase::Idle
    };
    enter(s, next, now);
    why
}

/// A trigger says the host needs a reboot: the first reason is kept for the cycle, and an idle
/// node starts one.
pub(super) fn reboot_needed(s: &mut State, reason: Need, now: Timestamp) -> String {
    if s.reason.is_none() {
        s.reason = Some(reason.clone());
    }
    if s.phase == Phase::Idle {
        enter(s, Phase::RebootNeeded, now);
        format!("reboot needed: {reason}")
    } else {
        format!("already in phase {}; noted: {reason}", s.phase)
    }
}
