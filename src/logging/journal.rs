//! A journald layer whose `MESSAGE` reads on its own: `journalctl -u rebootd` (the short view
//! operators read) shows each message with the values of its fields that the text does not
//! already say, e.g. `cannot renew the waiter entry (error: connection refused)`. Every field
//! is also sent as a journal field of its own (`FROM=`, `TO=`, `WHY=`, ...), with the fields of
//! the spans around the event (`NODE=`, `GROUP=`, `HOLDER=`, `PHASE=`, `ACTION=`), for
//! `-o verbose`, `-o json` and filtering (`journalctl -u rebootd PHASE=draining`).
//!
//! The native protocol (systemd's `sd_journal_sendv`): one datagram to
//! `/run/systemd/journal/socket` per entry, `KEY=value\n` lines, or `KEY\n` + 64-bit
//! little-endian length + value + `\n` for a value with a newline.

use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// journald's socket for native messages.
pub const SOCKET: &str = "/run/systemd/journal/socket";
/// Longer values are cut (a datagram has to fit the socket's buffer).
const MAX_VALUE: usize = 32 * 1024;

/// Sends every event to journald.
pub struct JournalLayer {
    socket: UnixDatagram,
    identifier: String,
}

impl JournalLayer {
    /// Connect to journald's socket; an error when there is none.
    pub fn connect(identifier: &str) -> std::io::Result<JournalLayer> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(SOCKET)?;
        Ok(JournalLayer {
            socket,
            identifier: identifier.to_string(),
        })
    }
}

/// The fields of a span, kept in its extensions.
struct SpanFields(Vec<(String, String)>);

/// Collects `(name, value)` pairs, the message apart.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

impl Fields {
    fn put(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = Some(value);
        } else {
            self.fields.push((field.name().to_string(), value));
        }
    }
}

/// The message as the short view shows it: the text, then the values of the event's fields
/// that the text does not contain already, as `(name: value; name: value)`.
pub fn readable(message: &str, fields: &[(String, String)]) -> String {
    let missing: Vec<String> = fields
        .iter()
        .filter(|(_, v)| !v.is_empty() && !message.contains(v.as_str()))
        .map(|(k, v)| format!("{}: {v}", k.replace('_', " ")))
        .collect();
    match (message.is_empty(), missing.is_empty()) {
        (_, true) => message.to_string(),
        (true, false) => missing.join("; "),
        (false, false) => format!("{message} ({})", missing.join("; ")),
    }
}

/// A journal field name: upper case letters, digits and `_`, not starting with `_` or a digit.
pub fn field_name(name: &str) -> String {
    let upper: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    upper
        .trim_start_matches(|c: char| c == '_' || c.is_ascii_digit())
        .to_string()
}

fn put(buf: &mut Vec<u8>, key: &str, value: &str) {
    let mut end = value.len().min(MAX_VALUE);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let value = &value[..end];
    buf.extend_from_slice(key.as_bytes());
    if value.contains('\n') {
        buf.push(b'\n');
        buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        buf.push(b'=');
    }
    buf.extend_from_slice(value.as_bytes());
    buf.push(b'\n');
}

fn priority(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "3",
        Level::WARN => "4",
        Level::INFO => "5",
        Level::DEBUG => "6",
        Level::TRACE => "7",
    }
}

/// Fields journald sets or reads itself: an event field of the same name goes under `F_`.
fn reserved(key: &str) -> bool {
    matches!(
        key,
        "MESSAGE" | "PRIORITY" | "SYSLOG_IDENTIFIER" | "TARGET" | "CODE_FILE" | "CODE_LINE"
    ) || key.is_empty()
}

impl<S> Layer<S> for JournalLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields.fields));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            match ext.get_mut::<SpanFields>() {
                Some(SpanFields(known)) => known.extend(fields.fields),
                None => ext.insert(SpanFields(fields.fields)),
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut buf = Vec::with_capacity(512);
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(fields)) = span.extensions().get::<SpanFields>() {
                    for (k, v) in fields {
                        let key = field_name(k);
                        if !reserved(&key) {
                            put(&mut buf, &key, v);
                        }
                    }
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        for (k, v) in &fields.fields {
            let key = field_name(k);
            let key = if reserved(&key) {
                format!("F_{key}")
            } else {
                key
            };
            put(&mut buf, &key, v);
        }
        let meta = event.metadata();
        let message = readable(fields.message.as_deref().unwrap_or(""), &fields.fields);
        put(&mut buf, "MESSAGE", &message);
        put(&mut buf, "PRIORITY", priority(meta.level()));
        put(&mut buf, "SYSLOG_IDENTIFIER", &self.identifier);
        put(&mut buf, "TARGET", meta.target());
        if let Some(file) = meta.file() {
            put(&mut buf, "CODE_FILE", file);
        }
        if let Some(line) = meta.line() {
            let mut l = String::new();
            let _ = write!(l, "{line}");
            put(&mut buf, "CODE_LINE", &l);
        }
        // Nothing to do about a failure: logging must not stop the daemon.
        let _ = self.socket.send(&buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_message_gains_the_values_it_does_not_say() {
        assert_eq!(
            readable("cannot renew", &f(&[("error", "connection refused")])),
            "cannot renew (error: connection refused)"
        );
        assert_eq!(
            readable(
                "idle → reboot_needed: sentinel",
                &f(&[
                    ("from", "idle"),
                    ("to", "reboot_needed"),
                    ("why", "sentinel")
                ])
            ),
            "idle → reboot_needed: sentinel"
        );
        assert_eq!(
            readable("waiting", &f(&[("retry_at", "12:00"), ("x", "")])),
            "waiting (retry at: 12:00)"
        );
        assert_eq!(readable("", &f(&[("a", "b")])), "a: b");
    }

    #[test]
    fn field_names_are_what_journald_accepts() {
        assert_eq!(field_name("from"), "FROM");
        assert_eq!(field_name("log.target"), "LOG_TARGET");
        assert_eq!(field_name("_trusted"), "TRUSTED");
        assert_eq!(field_name("1x"), "X");
    }

    #[test]
    fn values_with_newlines_use_the_binary_form() {
        let mut buf = Vec::new();
        put(&mut buf, "A", "x");
        put(&mut buf, "B", "y\nz");
        let mut want = b"A=x\nB\n".to_vec();
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"y\nz\n");
        assert_eq!(buf, want);
    }
}
