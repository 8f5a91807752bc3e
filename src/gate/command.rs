//! A command gate: the program is run (no shell) with a time limit; exit status 0 = go, any
//! other status, a signal, a time-out or a program that cannot be started = wait, saying which
//! and the first line it wrote to stderr. How the program is run (its own process group, output
//! read and capped, killed with all it started) is [`crate::child`]'s.

use std::time::Duration;

use super::Verdict;
use crate::child::{self, RunError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandGate {
    /// Program and arguments.
    pub argv: Vec<String>,
    pub timeout: Duration,
}

impl CommandGate {
    pub async fn check(&self) -> Verdict {
        let shown = self.argv.join(" ");
        let out = match child::run(&self.argv, self.timeout).await {
            Ok(out) => out,
            Err(RunError::Empty) => return Verdict::Wait("an empty gate command".into()),
            Err(RunError::TimedOut(limit)) => {
                return Verdict::Wait(format!(
                    "gate command {shown:?} to finish (it ran past {})",
                    humantime::format_duration(limit)
                ))
            }
            Err(e @ RunError::Spawn(_)) => {
                return Verdict::Wait(format!("gate command {shown:?} {e}"))
            }
            Err(e @ RunError::Wait(_)) => {
                return Verdict::Wait(format!("gate command {shown:?}: {e}"))
            }
        };
        if out.status.success() {
            return Verdict::Go;
        }
        let what = match out.status.code() {
            Some(c) => format!("exit status {c}"),
            None => "a signal".to_string(),
        };
        let mut why = format!("gate command {shown:?} to succeed (it ended with {what})");
        let line = out.first_stderr_line();
        if !line.is_empty() {
            why.push_str(&format!(": {line}"));
        }
        Verdict::Wait(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(argv: &[&str]) -> CommandGate {
        CommandGate {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn exit_zero_goes_anything_else_waits_and_says_why() {
        assert_eq!(gate(&["true"]).check().await, Verdict::Go);
        let Verdict::Wait(why) = gate(&["sh", "-c", "echo backup running >&2; exit 3"])
            .check()
            .await
        else {
            panic!("exit 3 went");
        };
        assert!(
            why.contains("exit status 3") && why.contains("backup running"),
            "{why}"
        );
        let Verdict::Wait(why) = gate(&["/nonexistent/gate"]).check().await else {
            panic!("a missing program went");
        };
        assert!(why.contains("cannot start"), "{why}");
        let mut slow = gate(&["sleep", "5"]);
        slow.timeout = Duration::from_millis(200);
        let Verdict::Wait(why) = slow.check().await else {
            panic!("a hung program went");
        };
        assert!(why.contains("ran past"), "{why}");
    }

    #[tokio::test]
    async fn a_grandchild_holding_stderr_does_not_turn_a_go_into_a_time_out() {
        use crate::child::testing::*;
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let mut g = gate(&[]);
        g.argv = with_grandchild("exit 0", &pid_file);
        g.timeout = Duration::from_secs(20);
        assert_eq!(g.check().await, Verdict::Go);
        assert!(
            ended(pid_in(&pid_file), g.timeout).await,
            "the grandchild lives"
        );
    }

    #[tokio::test]
    async fn a_time_out_kills_what_the_command_started() {
        use crate::child::testing::*;
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let mut g = gate(&[]);
        g.argv = with_grandchild("exec sleep 300", &pid_file);
        g.timeout = Duration::from_secs(2);
        let Verdict::Wait(why) = g.check().await else {
            panic!("a hung program went");
        };
        assert!(why.contains("ran past 2s"), "{why}");
        let grandchild = pid_in(&pid_file);
        assert!(
            ended(grandchild, Duration::from_secs(20)).await,
            "the grandchild lives"
        );
    }

    #[tokio::test]
    async fn a_mebibyte_of_output_neither_blocks_nor_is_kept() {
        let mut g = gate(&[]);
        g.argv = crate::child::testing::mebibyte_each();
        g.timeout = Duration::from_secs(20);
        let Verdict::Wait(why) = g.check().await else {
            panic!("exit 3 went");
        };
        assert!(why.contains("exit status 3"), "{why}");
    }
}
