//! The locksmith semaphore document: `SemaphoreDoc::parse` never panics; what it accepts is
//! consistent and survives a `to_json` round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rebootd::lock::document::SemaphoreDoc;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = SemaphoreDoc::parse(data) else {
        return;
    };
    assert_eq!(
        doc.semaphore + doc.holders.len() as i64,
        doc.max as i64,
        "accepted an inconsistent document"
    );
    let json = doc.to_json();
    let again = SemaphoreDoc::parse(json.as_bytes()).expect("to_json output parses");
    assert_eq!(doc, again, "round trip changed the document: {json}");
    assert_eq!(again.to_json(), json, "to_json is not stable");
});
