//! `rebootd-lab bench`: benchmarks of the lab (being written).

/// Parse the arguments after `bench` and run.
pub async fn cli(_args: Vec<String>) -> Result<(), String> {
    Err("not yet implemented".into())
}
