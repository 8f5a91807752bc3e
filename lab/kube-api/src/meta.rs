//! Small helpers over JSON objects: metadata accessors, pod and node conditions, timestamps in
//! the API's format, uids and random name suffixes.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

/// `obj.metadata.<field>` as a string, or "".
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name")
}

pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace")
}

pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid")
}

pub fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion")
}

pub fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// A label value, if the label is present.
pub fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
}

/// The labels as a map (empty when absent).
pub fn labels(obj: &Value) -> Map<String, Value> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

pub fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
}

/// The controller owner reference (`controller: true`), if any.
pub fn controller_ref(obj: &Value) -> Option<&Value> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// Whether `obj` is controlled by the object with this uid.
pub fn controlled_by(obj: &Value, owner_uid: &str) -> bool {
    controller_ref(obj)
        .and_then(|r| r.get("uid"))
        .and_then(Value::as_str)
        == Some(owner_uid)
}

/// A controller owner reference pointing at `owner`.
pub fn owner_reference(api_version: &str, kind: &str, owner: &Value) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "name": name(owner),
        "uid": uid(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// Ensure `obj.metadata` is an object and return it.
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Some(map) = obj.as_object_mut() else {
        unreachable!("made an object above")
    };
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    match meta.as_object_mut() {
        Some(m) => m,
        None => unreachable!("made an object above"),
    }
}

/// Ensure `obj[key]` is an object and return it.
pub fn object_mut<'a>(obj: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Some(map) = obj.as_object_mut() else {
        unreachable!("made an object above")
    };
    let v = map.entry(key).or_insert_with(|| json!({}));
    if !v.is_object() {
        *v = json!({});
    }
    match v.as_object_mut() {
        Some(m) => m,
        None => unreachable!("made an object above"),
    }
}

/// The `status` of condition `type_` (`"True"`, `"False"`, ...), if present.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a str> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
}

/// Set (or add) condition `type_` with `status`, reason and message (omitted when empty, as
/// pod and node conditions do); the transition time changes only when the status does.
pub fn set_condition(obj: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
    set_condition_with(obj, type_, status, reason, message, false);
}

/// [`set_condition`] for `metav1.Condition`, whose reason and message are always present.
pub fn set_meta_condition(obj: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
    set_condition_with(obj, type_, status, reason, message, true);
}

fn set_condition_with(
    obj: &mut Value,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    keep_empty: bool,
) {
    let now = now_rfc3339();
    let st = object_mut(obj, "status");
    let conds = st.entry("conditions").or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let Some(list) = conds.as_array_mut() else {
        return;
    };
    let existing = list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_));
    match existing {
        Some(c) => {
            let changed = c.get("status").and_then(Value::as_str) != Some(status);
            c["status"] = json!(status);
            set_or_remove(c, "reason", reason, keep_empty);
            set_or_remove(c, "message", message, keep_empty);
            if changed {
                c["lastTransitionTime"] = json!(now);
            }
            if c.get("lastHeartbeatTime").is_some() {
                c["lastHeartbeatTime"] = json!(now);
            }
        }
        None => {
            let mut c = json!({
                "type": type_,
                "status": status,
                "lastTransitionTime": now,
            });
            set_or_remove(&mut c, "reason", reason, keep_empty);
            set_or_remove(&mut c, "message", message, keep_empty);
            list.push(c);
        }
    }
}

fn set_or_remove(c: &mut Value, key: &str, v: &str, keep_empty: bool) {
    if let Some(m) = c.as_object_mut() {
        if v.is_empty() && !keep_empty {
            m.remove(key);
        } else {
            m.insert(key.to_string(), json!(v));
        }
    }
}

/// Whether a pod or node has condition Ready=True.
pub fn is_ready(obj: &Value) -> bool {
    condition(obj, "Ready") == Some("True")
}

/// `status.phase` of a pod, or "".
pub fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Succeeded or Failed.
pub fn is_terminal(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

/// `spec.nodeName` of a pod, or "".
pub fn node_name(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Now, as the API writes `Time` (seconds, UTC).
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// A time as the API writes `Time`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// 64 random bits (not cryptographic; unique enough for names and uids).
pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_nanos(),
    );
    h.finish()
}

/// A uid in the UUID v4 text form.
pub fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        (a >> 32) as u32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Five characters from the alphabet the real server uses for `generateName`.
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    let mut s = String::with_capacity(5);
    for _ in 0..5 {
        s.push(ALPHABET[(r % ALPHABET.len() as u64) as usize] as char);
        r /= ALPHABET.len() as u64;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_time() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn uids_differ_and_look_right() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_eq!(name_suffix().len(), 5);
    }

    #[test]
    fn conditions() {
        let mut pod = json!({});
        assert!(!is_ready(&pod));
        set_condition(&mut pod, "Ready", "True", "", "");
        assert!(is_ready(&pod));
        set_condition(&mut pod, "Ready", "False", "x", "y");
        assert!(!is_ready(&pod));
        assert_eq!(
            pod["status"]["conditions"].as_array().map(Vec::len),
            Some(1)
        );
    }
}
