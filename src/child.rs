//! Running an outside program (a sentinel command, a gate command): the one place rebootd
//! starts a child process.
//!
//! - The program runs in a process group of its own, and that whole group is killed when the
//!   run ends (time-out, the caller gone, or the program exited and left something behind): a
//!   shell's background jobs never outlive their command.
//! - Its stdout and stderr are read while it runs, the first [`KEPT`] bytes of each kept and
//!   the rest read and thrown away, so a program that writes a lot neither blocks on a full pipe
//!   nor fills rebootd's memory.
//! - The program's exit decides. A grandchild that keeps a pipe open does not hold the run up:
//!   once the program exited, what is left in the pipes is read for at most [`AFTER_EXIT`].

use std::io;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The bytes of each stream kept: enough for any message; more is read and discarded.
pub const KEPT: usize = 64 * 1024;

/// After the program exited: how long what it wrote before is read on (a grandchild may hold
/// the pipes open for ever). The pipes hold what was written before the exit, so reading it
/// takes no time; this only bounds waiting on writers that are not the program.
pub const AFTER_EXIT: Duration = Duration::from_millis(100);

/// The characters of stderr's first line a message quotes.
pub const LINE_KEPT: usize = 500;

/// A run that ended with the program's exit.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    /// The first [`KEPT`] bytes of stdout.
    pub stdout: Vec<u8>,
    /// The first [`KEPT`] bytes of stderr.
    pub stderr: Vec<u8>,
}

impl Output {
    /// The first non-blank line of stderr, trimmed, its first [`LINE_KEPT`] characters ("" when
    /// none): a message, not a dump.
    pub fn first_stderr_line(&self) -> String {
        String::from_utf8_lossy(&self.stderr)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("")
            .chars()
            .take(LINE_KEPT)
            .collect()
    }
}

/// A run that did not end with the program's exit.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("an empty command")]
    Empty,
    #[error("cannot start: {0}")]
    Spawn(#[source] io::Error),
    #[error("ran past {}; killed", humantime::format_duration(*.0))]
    TimedOut(Duration),
    #[error("cannot wait for it: {0}")]
    Wait(#[source] io::Error),
}

/// Run `argv` (no shell) with stdin closed, for at most `limit`.
pub async fn run(argv: &[String], limit: Duration) -> Result<Output, RunError> {
    let (program, args) = argv.split_first().ok_or(RunError::Empty)?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(RunError::Spawn)?;
    // Killed on every way out, this function's future dropped included.
    let _group = Group(child.id());
    let mut out = Stream::new(child.stdout.take());
    let mut err = Stream::new(child.stderr.take());
    let run = async {
        let exited = tokio::select! {
            status = child.wait() => Some(status),
            () = read_both(&mut out, &mut err) => None,
        };
        let status = match exited {
            Some(status) => status,
            // Both pipes closed: only the exit is left to wait for.
            None => child.wait().await,
        };
        // Exited: take what it wrote, without waiting on a grandchild that holds the pipes.
        let _ = tokio::time::timeout(AFTER_EXIT, read_both(&mut out, &mut err)).await;
        status
    };
    let ended = tokio::time::timeout(limit, run).await;
    match ended {
        Err(_) => Err(RunError::TimedOut(limit)),
        Ok(Err(e)) => Err(RunError::Wait(e)),
        Ok(Ok(status)) => Ok(Output {
            status,
            stdout: out.kept,
            stderr: err.kept,
        }),
    }
}

/// The program's process group (its id is the program's pid); killed when dropped. The group
/// outlives the program while any member lives, so its id is not reused meanwhile.
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        let Some(pgid) = self.0.and_then(|id| i32::try_from(id).ok()) else {
            return;
        };
        let Some(pgid) = rustix::process::Pid::from_raw(pgid) else {
            return;
        };
        // ESRCH: nothing of it is left, the usual case.
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

/// One of the program's output pipes and what was kept of it.
struct Stream<R> {
    pipe: Option<R>,
    kept: Vec<u8>,
}

impl<R: AsyncRead + Unpin> Stream<R> {
    fn new(pipe: Option<R>) -> Self {
        Stream {
            pipe,
            kept: Vec::new(),
        }
    }

    /// Read until the pipe is closed (or fails), keeping the first [`KEPT`] bytes. Cancel-safe:
    /// a read cut short loses nothing, and a later call goes on where this one stopped.
    async fn read_to_end(&mut self) {
        let mut chunk = [0u8; 8 * 1024];
        while let Some(pipe) = self.pipe.as_mut() {
            match pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => self.pipe = None,
                Ok(n) => {
                    let room = KEPT.saturating_sub(self.kept.len());
                    self.kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
        }
    }
}

async fn read_both<A, B>(a: &mut Stream<A>, b: &mut Stream<B>)
where
    A: AsyncRead + Unpin,
    B: AsyncRead + Unpin,
{
    tokio::join!(a.read_to_end(), b.read_to_end());
}

/// For tests of the commands' callers: what became of a process a command started.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::Duration;

    /// Whether the process `pid` has ended (or ends within `within`): its pidfd is readable
    /// once it has (a zombie included), and it cannot be opened once it is reaped.
    pub async fn ended(pid: i32, within: Duration) -> bool {
        let pid = rustix::process::Pid::from_raw(pid).expect("a positive pid");
        let fd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::SRCH) => return true,
            Err(e) => panic!("pidfd_open({pid:?}): {e}"),
        };
        // Deprecated for fds that may be closed under it (I/O safety); this one it owns.
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::new(fd).expect("a pidfd in the reactor");
        tokio::time::timeout(within, fd.readable()).await.is_ok()
    }

    /// A shell command line that starts a grandchild (`sleep 300`) holding the command's
    /// stdout and stderr, writes the grandchild's pid to the file named by `$0`, then runs
    /// `then`.
    pub fn with_grandchild(then: &str, pid_file: &std::path::Path) -> Vec<String> {
        vec![
            "sh".into(),
            "-c".into(),
            format!("sleep 300 & echo $! > \"$0\"; {then}"),
            pid_file.display().to_string(),
        ]
    }

    /// The pid written to `path`.
    pub fn pid_in(path: &std::path::Path) -> i32 {
        let text = std::fs::read_to_string(path).expect("the command wrote its grandchild's pid");
        text.trim().parse().expect("a pid")
    }

    /// A command that writes 1 MiB to stdout and to stderr, then exits 3.
    pub fn mebibyte_each() -> Vec<String> {
        vec![
            "sh".into(),
            "-c".into(),
            "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; exit 3".into(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    const LONG: Duration = Duration::from_secs(20);

    #[tokio::test]
    async fn the_exit_decides_not_a_grandchild_holding_the_pipes() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let out = run(&with_grandchild("echo done >&2; exit 0", &pid_file), LONG)
            .await
            .expect("the command's exit ends the run");
        assert!(out.status.success());
        assert_eq!(out.first_stderr_line(), "done");
        // What it left behind is killed with its group.
        assert!(ended(pid_in(&pid_file), LONG).await, "the grandchild lives");
    }

    #[tokio::test]
    async fn a_time_out_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let limit = Duration::from_secs(2);
        let err = run(&with_grandchild("exec sleep 300", &pid_file), limit)
            .await
            .expect_err("it never exits");
        assert!(matches!(err, RunError::TimedOut(l) if l == limit), "{err}");
        assert!(ended(pid_in(&pid_file), LONG).await, "the grandchild lives");
    }

    #[tokio::test]
    async fn a_mebibyte_on_each_stream_is_read_and_capped() {
        let out = run(&mebibyte_each(), LONG).await.expect("it exits");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!((out.stdout.len(), out.stderr.len()), (KEPT, KEPT));
    }

    #[tokio::test]
    async fn an_empty_or_missing_program_is_said() {
        assert!(matches!(run(&[], LONG).await, Err(RunError::Empty)));
        let missing = run(&["/nonexistent/program".into()], LONG).await;
        assert!(matches!(missing, Err(RunError::Spawn(_))), "{missing:?}");
    }
}
