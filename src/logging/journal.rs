//! The journal: `tracing-journald` speaks journald's native protocol; [`Readable`] makes each
//! `MESSAGE` read on its own. `journalctl -u rebootd` (the short view operators read) shows only
//! `MESSAGE`, so each message carries the values of its fields that the text does not already
//! say, e.g. `cannot renew the waiter entry (error: connection refused)`. Every field is also
//! sent as a journal field of its own (`FROM=`, `TO=`, `WHY=`, ...), with the fields of the
//! spans around the event (`NODE=`, `GROUP=`, `HOLDER=`, `PHASE=`, `ACTION=`), for
//! `-o verbose`, `-o json` and filtering (`journalctl -u rebootd PHASE=draining`).
//! tracing-journald also adds `SPAN_NAME=`, `SPAN_TARGET=`, `SPAN_CODE_FILE=` and
//! `SPAN_CODE_LINE=` for each enclosing span.

use tracing::field::{Field, Value, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The journal layer: tracing-journald under `identifier`, fields under their own names (no
/// `F_` prefix), messages made [`readable`].
pub fn layer(identifier: &str) -> std::io::Result<Readable<tracing_journald::Layer>> {
    let journald = tracing_journald::layer()?
        .with_syslog_identifier(identifier.to_string())
        .with_field_prefix(None);
    Ok(Readable(journald))
}

/// Hands `L` each event with its message made [`readable`]; spans pass through unchanged.
pub struct Readable<L>(pub L);

/// Collects `(field, value)` pairs as journald would write them, the message apart.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Vec<(Field, String)>,
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
            self.fields.push((field.clone(), value));
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

/// Fields tracing-journald or journald set themselves. An event field of the same name (e.g.
/// the lock's `target`) is said in `MESSAGE` only, so that `TARGET=` stays the module.
fn reserved(name: &str) -> bool {
    let key = field_name(name);
    key.is_empty()
        || key.starts_with("SPAN_")
        || matches!(
            key.as_str(),
            "MESSAGE" | "PRIORITY" | "SYSLOG_IDENTIFIER" | "TARGET" | "CODE_FILE" | "CODE_LINE"
        )
}

/// Call `emit` with `event` rebuilt from the same callsite: its message made [`readable`],
/// fields with [`reserved`] names left out. An event without a message field goes as it is.
fn with_readable_message(event: &Event<'_>, emit: impl FnOnce(&Event<'_>)) {
    let meta = event.metadata();
    let names = meta.fields();
    let Some(message_field) = names.field("message") else {
        return emit(event);
    };
    let mut seen = Fields::default();
    event.record(&mut seen);
    let pairs: Vec<(String, String)> = seen
        .fields
        .iter()
        .map(|(f, v)| (f.name().to_string(), v.clone()))
        .collect();
    let message = readable(seen.message.as_deref().unwrap_or(""), &pairs);
    // One value per field of the callsite, in its order: what `value_set_all` asks.
    let values: Vec<Option<&dyn Value>> = names
        .iter()
        .map(|field| {
            if field == message_field {
                return Some(&message as &dyn Value);
            }
            if reserved(field.name()) {
                return None;
            }
            seen.fields
                .iter()
                .find(|(f, _)| *f == field)
                .map(|(_, v)| v as &dyn Value)
        })
        .collect();
    let set = names.value_set_all(&values);
    let rebuilt = if event.is_contextual() {
        Event::new(meta, &set)
    } else {
        Event::new_child_of(event.parent().cloned(), meta, &set)
    };
    emit(&rebuilt);
}

impl<S, L> Layer<S> for Readable<L>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    L: Layer<S>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.0.on_new_span(attrs, id, ctx);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.0.on_record(id, values, ctx);
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        self.0.on_follows_from(span, follows, ctx);
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.0.on_enter(id, ctx);
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.0.on_exit(id, ctx);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.0.on_close(id, ctx);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        with_readable_message(event, |e| self.0.on_event(e, ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

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

    /// What an event looked like to the layer under [`Readable`].
    #[derive(Debug, Default, Clone, PartialEq)]
    struct Seen {
        message: Option<String>,
        fields: Vec<(String, String)>,
        spans: Vec<String>,
    }

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<Seen>>>);

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            let spans = ctx
                .event_scope(event)
                .map(|s| s.from_root().map(|s| s.name().to_string()).collect())
                .unwrap_or_default();
            self.0.lock().unwrap().push(Seen {
                message: fields.message,
                fields: fields
                    .fields
                    .iter()
                    .map(|(f, v)| (f.name().to_string(), v.clone()))
                    .collect(),
                spans,
            });
        }
    }

    fn seen(log: impl FnOnce()) -> Vec<Seen> {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(Readable(capture.clone()));
        tracing::subscriber::with_default(subscriber, log);
        let seen = capture.0.lock().unwrap().clone();
        seen
    }

    #[test]
    fn the_layer_below_gets_the_readable_message_and_every_field() {
        let got = seen(|| {
            let span = tracing::info_span!("agent", node = "n1");
            let _in = span.enter();
            tracing::warn!(error = %"connection refused", attempt = 3, "cannot renew");
        });
        assert_eq!(
            got,
            [Seen {
                message: Some("cannot renew (error: connection refused; attempt: 3)".into()),
                fields: f(&[("error", "connection refused"), ("attempt", "3")]),
                spans: vec!["agent".into()],
            }]
        );
    }

    #[test]
    fn a_field_named_like_journalds_own_is_said_in_the_message_only() {
        let got = seen(|| tracing::debug!(target = "etcd group default", "lost a race"));
        assert_eq!(
            got,
            [Seen {
                message: Some("lost a race (target: etcd group default)".into()),
                fields: vec![],
                spans: vec![],
            }]
        );
    }

    #[test]
    fn an_explicit_parent_is_kept() {
        let got = seen(|| {
            let parent = tracing::info_span!("action", phase = "draining");
            tracing::info!(parent: &parent, "evicting");
            tracing::info!(parent: None, "alone");
        });
        assert_eq!(got[0].spans, ["action"]);
        assert_eq!(got[0].message.as_deref(), Some("evicting"));
        assert!(got[1].spans.is_empty(), "{got:?}");
    }
}
