//! rebootd: a reboot coordinator for fleets of Linux hosts.
//!
//! The daemon learns that its host needs a reboot, waits for a maintenance window, takes a slot
//! in a fleet-wide counting semaphore, optionally drains its Kubernetes node, reboots through
//! logind and, after boot, checks health and gives the slot back. See `README.md` and, for how
//! it works inside, `docs/design-notes.md`.

pub mod agent;
pub mod app_id;
pub mod backoff;
pub mod check;
pub mod child;
pub mod clients;
pub mod config;
pub mod control;
pub mod coordinator;
pub mod drain;
pub mod fleet;
pub mod gate;
pub mod http;
pub mod import;
pub mod inhibitor;
pub mod kube_client;
pub mod lock;
pub mod logging;
pub mod metrics;
pub mod migrate;
pub mod need;
pub mod notify;
pub mod notify_webhook;
pub mod reboot;
pub mod reboot_method;
pub mod runtime;
pub mod secrets;
pub mod state;
pub mod status;
pub mod systemd;
pub mod text;
pub mod trigger;
pub mod users;
pub mod window;
pub mod window_calendar;
