//! The timer task: runs what the controllers scheduled for later (a pod becoming Ready, a
//! terminating pod going away) at its time, holding only a weak reference to the store.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::store::{Timer, TimerAction, WeakStore};

/// Run until the store is gone or the sender side closes.
pub async fn run(store: WeakStore, mut rx: mpsc::UnboundedReceiver<Timer>) {
    let mut heap: BinaryHeap<Reverse<(Instant, u64, TimerAction)>> = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let next = heap.peek().map(|Reverse((at, _, _))| *at);
        tokio::select! {
            t = rx.recv() => match t {
                Some(t) => {
                    seq += 1;
                    heap.push(Reverse((t.at, seq, t.action)));
                }
                None => return,
            },
            _ = sleep_until(next), if next.is_some() => {
                let now = Instant::now();
                let mut due = Vec::new();
                while let Some(Reverse((at, _, _))) = heap.peek() {
                    if *at > now {
                        break;
                    }
                    if let Some(Reverse((_, _, a))) = heap.pop() {
                        due.push(a);
                    }
                }
                let Some(store) = store.upgrade() else { return };
                store.write(|st| {
                    for a in &due {
                        st.fire(a);
                    }
                });
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
