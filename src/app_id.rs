//! 128-bit ids as systemd writes them, and the application-specific machine id of
//! `sd_id128_get_machine_app_specific(3)`: HMAC-SHA256 keyed with the machine id over the
//! application id, the first 16 bytes of it, made a version 4 UUID. Zincati sends that id, with
//! its own application id, to FleetLock servers instead of the machine id itself, and
//! poseidon/fleetlock maps it back to a Kubernetes Node the same way; rebootd's `fleetlock`
//! backend does the same so a node keeps its slot when it moves from Zincati to rebootd.

/// Zincati's application id (coreos/zincati `src/identity/mod.rs`).
pub const ZINCATI_APP_ID: &str = "de35106b6ec24688b63afddaa156679b";

/// A 128-bit id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id128(pub [u8; 16]);

/// A text that is not a 128-bit id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{0:?} is not a 128-bit id (32 hex digits or a UUID)")]
    NotAnId(String),
}

impl Id128 {
    /// Read 32 hexadecimal digits, or the 36-character UUID form with dashes (any case).
    pub fn parse(text: &str) -> Result<Id128, IdError> {
        let t = text.trim();
        let hex: String = if t.len() == 36 {
            let dashes = [8, 13, 18, 23];
            if !dashes.iter().all(|&i| t.as_bytes()[i] == b'-') {
                return Err(IdError::NotAnId(t.to_string()));
            }
            t.chars().filter(|&c| c != '-').collect()
        } else {
            t.to_string()
        };
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(IdError::NotAnId(t.to_string()));
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| IdError::NotAnId(t.to_string()))?;
        }
        Ok(Id128(out))
    }

    /// 32 lower-case hexadecimal digits, as `/etc/machine-id` and Zincati write it.
    pub fn to_hex(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// This id made specific to the application `app` (`sd_id128_get_app_specific`).
    pub fn app_specific(self, app: Id128) -> Id128 {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.0);
        let tag = ring::hmac::sign(&key, &app.0);
        let mut id = [0u8; 16];
        id.copy_from_slice(&tag.as_ref()[..16]);
        // A random (version 4, variant 1) UUID, as systemd makes it.
        id[6] = (id[6] & 0x0f) | 0x40;
        id[8] = (id[8] & 0x3f) | 0x80;
        Id128(id)
    }
}

/// The id Zincati sends to a FleetLock server for the machine with this machine id.
pub fn zincati_node_id(machine_id: &str) -> Result<String, IdError> {
    let app = Id128::parse(ZINCATI_APP_ID)?;
    Ok(Id128::parse(machine_id)?.app_specific(app).to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms_and_refuses_others() {
        let a = Id128::parse("DE35106B6EC24688B63AFDDAA156679B").unwrap();
        let b = Id128::parse("de35106b-6ec2-4688-b63a-fddaa156679b").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_hex(), ZINCATI_APP_ID);
        assert!(Id128::parse("de35106b6ec24688b63afddaa156679").is_err());
        assert!(Id128::parse("de35106b_6ec2_4688_b63a_fddaa156679b").is_err());
        assert!(Id128::parse("ze35106b6ec24688b63afddaa156679b").is_err());
    }

    /// The value Zincati's own test fixture (`src/identity/mod.rs`, `compute_node_uuid`) would
    /// not pin; this one was read from `systemd-id128 machine-id --app-specific=...` on a host
    /// whose machine id is 3d1219c7c4c5404aaa1f6d2a48adfda4. The integration test
    /// `tests/fleetlock_id.rs` asks systemd-id128 itself for other ids.
    #[test]
    fn matches_systemd_for_a_known_machine() {
        assert_eq!(
            zincati_node_id("3d1219c7c4c5404aaa1f6d2a48adfda4").unwrap(),
            "975228d46dc94622b9bbe16671e2b58d"
        );
    }
}
