//! Log capture for tests that run rebootd's library in-process: a tracing layer that sends each
//! rebootd event as one line, and a receiver that awaits a line with given words.

use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

/// How long [`Logs::expect`] waits for a line.
const LOG_WAIT: Duration = Duration::from_secs(20);

/// A tracing layer that forwards rebootd's events as `LEVEL field=value ...` lines.
pub struct Capture(UnboundedSender<String>);

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(line) = event_line(event) {
            let _ = self.0.send(line);
        }
    }
}

/// A rebootd event as one `LEVEL field=value ...` line; `None` for other crates' events.
pub fn event_line(event: &tracing::Event<'_>) -> Option<String> {
    if !event.metadata().target().starts_with("rebootd") {
        return None;
    }
    struct V(String);
    impl tracing::field::Visit for V {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={:?} ", f.name(), v));
        }
    }
    let mut v = V(format!("{} ", event.metadata().level()));
    event.record(&mut v);
    Some(v.0)
}

/// Capture rebootd's events on this thread until the guard is dropped (with a current-thread
/// runtime: every task of the test), also written to the test's output at INFO and above; and
/// the [`Logs`] that receives them.
pub fn capture_on_this_thread() -> (tracing::subscriber::DefaultGuard, Logs) {
    let (capture, logs) = capture();
    let subscriber = tracing_subscriber::registry().with(capture).with(
        tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
    );
    (tracing::subscriber::set_default(subscriber), logs)
}

/// The lines a [`Capture`] sent.
pub struct Logs(UnboundedReceiver<String>);

/// A connected pair.
pub fn capture() -> (Capture, Logs) {
    let (tx, rx) = unbounded_channel();
    (Capture(tx), Logs(rx))
}

impl Logs {
    /// Wait for a log line containing all of `needles`.
    pub async fn expect(&mut self, needles: &[&str]) -> String {
        let found = tokio::time::timeout(LOG_WAIT, async {
            while let Some(line) = self.0.recv().await {
                if needles.iter().all(|n| line.contains(n)) {
                    return line;
                }
            }
            panic!("log channel closed")
        })
        .await;
        found.unwrap_or_else(|_| panic!("no log line with {needles:?} within {LOG_WAIT:?}"))
    }
}
