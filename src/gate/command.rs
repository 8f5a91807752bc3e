//! A command gate: the program is run (no shell) with a time limit; exit status 0 = go, any
//! other status, a signal, a time-out or a program that cannot be started = wait, saying which
//! and the first line it wrote to stderr.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::Verdict;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandGate {
    /// Program and arguments.
    pub argv: Vec<String>,
    pub timeout: Duration,
}

impl CommandGate {
    pub async fn check(&self) -> Verdict {
        let Some((program, args)) = self.argv.split_first() else {
            return Verdict::Wait("an empty gate command".into());
        };
        let shown = self.argv.join(" ");
        let mut child = match tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => return Verdict::Wait(format!("gate command {shown:?} cannot start: {e}")),
        };
        let mut stderr = child.stderr.take();
        let run = async {
            let mut err = String::new();
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(64 * 1024).read_to_string(&mut err).await;
            }
            (child.wait().await, err)
        };
        match tokio::time::timeout(self.timeout, run).await {
            Err(_) => Verdict::Wait(format!(
                "gate command {shown:?} to finish (it ran past {})",
                humantime::format_duration(self.timeout)
            )),
            Ok((Err(e), _)) => Verdict::Wait(format!("gate command {shown:?}: {e}")),
            Ok((Ok(status), _)) if status.success() => Verdict::Go,
            Ok((Ok(status), err)) => {
                let line = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                let what = match status.code() {
                    Some(c) => format!("exit status {c}"),
                    None => "a signal".to_string(),
                };
                let mut out = format!("gate command {shown:?} to succeed (it ended with {what})");
                if !line.is_empty() {
                    out.push_str(&format!(": {}", line.trim()));
                }
                Verdict::Wait(out)
            }
        }
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
}
