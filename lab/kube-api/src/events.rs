//! events.k8s.io/v1 Events are stored as core v1 Events, as on a real server: these convert
//! between the two shapes.

use serde_json::{Map, Value};

use crate::kind::Kind;

/// (core v1 field, events.k8s.io/v1 field)
const FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

fn rename(obj: &Value, to_v1: bool) -> Value {
    let Some(m) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        let renamed = FIELDS.iter().find_map(|(core, v1)| {
            if to_v1 && k == core {
                Some(*v1)
            } else if !to_v1 && k == v1 {
                Some(*core)
            } else {
                None
            }
        });
        out.insert(renamed.unwrap_or(k).to_string(), v.clone());
    }
    Value::Object(out)
}

/// A stored object as a client of `kind` sees it.
pub fn to_view(kind: Kind, stored: Value) -> Value {
    if kind != Kind::EventV1 {
        return stored;
    }
    let mut v = rename(&stored, true);
    v["apiVersion"] = Value::from(Kind::EventV1.api_version());
    v["kind"] = Value::from("Event");
    v
}

/// An object written through `kind` in storage form.
pub fn from_view(kind: Kind, view: Value) -> Value {
    if kind != Kind::EventV1 {
        return view;
    }
    let mut v = rename(&view, false);
    v["apiVersion"] = Value::from("v1");
    v["kind"] = Value::from("Event");
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e"}, "regarding": {"kind": "Node", "name": "n"},
            "note": "drain started", "reason": "Drain", "reportingController": "rebootd"});
        let core = from_view(Kind::EventV1, v1.clone());
        assert_eq!(core["involvedObject"]["name"], "n");
        assert_eq!(core["message"], "drain started");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(to_view(Kind::EventV1, core), v1);
    }
}
