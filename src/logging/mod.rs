//! Log output: to the journal (with structured fields) when stderr is connected to it, as
//! `JOURNAL_STREAM` says; otherwise plain text or JSON lines on stderr.

pub mod journal;

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Journal when stderr is the journal, text otherwise.
    Auto,
    Text,
    Json,
    Journal,
}

/// Whether stderr is the journal stream systemd set up (`JOURNAL_STREAM=dev:inode`).
fn stderr_is_journal() -> bool {
    let Ok(value) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(meta.dev()) && ino.parse::<u64>().ok() == Some(meta.ino())
}

fn text_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
}

/// Install the global subscriber. `RUST_LOG` overrides the level (default `info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let format = match format {
        LogFormat::Auto if stderr_is_journal() => LogFormat::Journal,
        LogFormat::Auto => LogFormat::Text,
        f => f,
    };
    match format {
        // Fields as plain journal fields (NODE=, GROUP=, HOLDER=, PHASE=, ...) and messages that
        // say their values (journal.rs).
        LogFormat::Journal => match journal::layer("rebootd") {
            Ok(layer) => registry.with(layer).init(),
            Err(_) => registry.with(text_layer()).init(),
        },
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .init(),
        _ => registry.with(text_layer()).init(),
    }
}
