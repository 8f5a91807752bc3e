//! `rebootd-lab chaos`: chaos trials over a lab fleet (being written).

/// Parse the arguments after `chaos` and run.
pub async fn cli(_args: Vec<String>) -> Result<(), String> {
    Err("not yet implemented".into())
}
