//! Logged-in users: before the reboot, a real rebootd process finds the people logged in
//! through the (lab's) logind sessions, has logind announce the reboot to them (a dry-run
//! scheduled reboot, whose wall messages logind sends), holds the slot for `users_warning`,
//! and withdraws the announcement when the reboot is called off.

mod common;

use common::*;
use rebootd::state::Phase;
use rebootd_lab::fake_logind::{FakeSession, Schedule};
use rebootd_lab::node::Node;

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

async fn with_people(name: &str, warning: &str) -> Node {
    let node = node(name, &format!("[reboot]\nusers_warning = \"{warning}\"\n")).await;
    node.logind
        .add_session(FakeSession::on_tty("3", "alice", "tty1"))
        .await
        .unwrap();
    node.logind
        .add_session(FakeSession {
            seat: "seat0".into(),
            ..FakeSession::on_tty("4", "bob", "")
        })
        .await
        .unwrap();
    // Not people: a background session and a user manager's session, without seat or tty.
    node.logind
        .add_session(FakeSession {
            class: "background".into(),
            ..FakeSession::on_tty("5", "cron", "")
        })
        .await
        .unwrap();
    node.logind
        .add_session(FakeSession {
            class: "manager".into(),
            ..FakeSession::on_tty("6", "alice", "")
        })
        .await
        .unwrap();
    node.wait_ready(WAIT).await.unwrap();
    node
}

#[tokio::test]
async fn logged_in_users_are_warned_through_logind_and_given_the_time() {
    let node = with_people("u1", "3s").await;
    let mut reboots = node.logind.subscribe();
    let schedule = node.logind.schedule();
    node.update_engine.set_status(NEED, "7.0").await.unwrap();
    let s = node
        .wait_state("the users' warning", WAIT, |s| s.users_warned.is_some())
        .await
        .unwrap();
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.slot_held, "the slot is held meanwhile");
    let warning = s.users_warned.clone().unwrap();
    let who: Vec<&str> = warning.sessions.iter().map(|x| x.user.as_str()).collect();
    assert_eq!(who, ["alice", "bob"], "only people on a tty or a seat");
    let waiting = s.waiting_for.clone().unwrap();
    assert!(waiting.contains("alice on tty1, bob on seat0"), "{waiting}");
    // logind was asked to announce the reboot for that time, as a dry run.
    let asked = schedule.borrow().clone();
    assert_eq!(
        asked.current,
        Some((
            "dry-reboot".to_string(),
            rebootd::users::usec(warning.until)
        )),
        "{asked:?}"
    );
    assert!(
        node.logind.reboot_calls().is_empty(),
        "no reboot before the time"
    );
    let (code, out, err) = rebootctl(&node, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("alice on tty1"), "{out}");

    let call = next_reboot(&node, &mut reboots, WAIT).await;
    let at = jiff::Timestamp::now();
    assert_eq!(call.flags, 1);
    assert!(
        at >= warning.until,
        "rebooted at {at}, before {}",
        warning.until
    );
    assert_eq!(schedule.borrow().asked.len(), 1, "announced once");
    assert_eq!(schedule.borrow().cancelled, 0);
}

#[tokio::test]
async fn a_cancel_during_the_warning_withdraws_the_announcement() {
    let node = with_people("u2", "1h").await;
    let mut schedule = node.logind.schedule();
    node.update_engine.set_status(NEED, "7.1").await.unwrap();
    node.wait_state("the users' warning", WAIT, |s| s.users_warned.is_some())
        .await
        .unwrap();
    let (code, out, err) = rebootctl(&node, &["cancel"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let waited = tokio::time::timeout(
        WAIT,
        schedule.wait_for(|s| s.cancelled == 1 && s.current.is_none()),
    )
    .await
    .map(|r| r.map(|s| s.clone()));
    let withdrawn: Schedule = match waited {
        Ok(Ok(s)) => s,
        _ => panic!(
            "not withdrawn: {:?}\n{}",
            *node.logind.schedule().borrow(),
            node.log()
        ),
    };
    assert_eq!(withdrawn.asked.len(), 1);
    let s = node
        .wait_state("the slot given back", WAIT, |s| {
            s.phase == Phase::Idle && !s.slot_held
        })
        .await
        .unwrap();
    assert_eq!(s.users_warned, None);
    assert!(node.logind.reboot_calls().is_empty());
}

#[tokio::test]
async fn no_warning_when_no_one_is_logged_in_or_it_is_off() {
    // A session, but the warning is off.
    let node = with_people("u3", "0s").await;
    let mut reboots = node.logind.subscribe();
    node.update_engine.set_status(NEED, "7.2").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    assert!(node.logind.schedule().borrow().asked.is_empty());
    assert_eq!(node.state().unwrap().users_warned, None);
    // No one logged in, the default warning of 5 minutes.
    let plain = common::node("u4", "").await;
    let mut reboots = plain.logind.subscribe();
    plain.wait_ready(WAIT).await.unwrap();
    plain.update_engine.set_status(NEED, "7.3").await.unwrap();
    next_reboot(&plain, &mut reboots, WAIT).await;
    assert!(plain.logind.schedule().borrow().asked.is_empty());
}
