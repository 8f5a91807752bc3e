//! The `rebootd-lab kube-api` command: start the stand-in, seed nodes and objects, write the
//! kubeconfig, and serve until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};
use serde_json::Value;

use crate::error::Error;
use crate::kind::Kind;
use crate::objects::NodeBuilder;
use crate::server::{KubeApi, KubeApiHandle, Options};

/// Arguments of `rebootd-lab kube-api`.
#[derive(Debug, Clone, Args)]
pub struct CliArgs {
    /// Address to listen on (plain HTTP); port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Where to write the kubeconfig pointing at the server.
    #[arg(long, default_value = "kubeconfig")]
    pub kubeconfig: PathBuf,
    /// The user (bearer token) written in the kubeconfig.
    #[arg(long, default_value = "lab")]
    pub user: String,
    /// Real time = simulated time x this (grace periods, pod readiness).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Simulated seconds from a pod landing on a Ready node to the pod being Ready.
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub pod_ready_delay: f64,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub bookmark_interval: f64,
    /// Add a Ready node with this name (repeatable).
    #[arg(long = "node", value_name = "NAME")]
    pub nodes: Vec<String>,
    /// Load objects from a JSON file: one object, an array, or a `List` (repeatable).
    #[arg(long = "objects", value_name = "FILE")]
    pub objects: Vec<PathBuf>,
}

#[derive(Debug, Parser)]
#[command(
    name = "rebootd-lab kube-api",
    about = "In-memory Kubernetes API stand-in"
)]
struct Cli {
    #[command(flatten)]
    args: CliArgs,
}

fn secs(name: &str, s: f64) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| Error::Usage(format!("--{name}: {s} is not a duration")))
}

/// Parse `args` (the arguments after `kube-api`, without a program name) and [`run`].
pub async fn serve_cli(args: Vec<String>) -> Result<(), Error> {
    let argv = std::iter::once("rebootd-lab kube-api".to_string()).chain(args);
    let cli = Cli::try_parse_from(argv).map_err(|e| Error::Usage(e.to_string()))?;
    run(cli.args).await
}

/// Start the stand-in, seed it, write the kubeconfig and serve until Ctrl-C.
pub async fn run(args: CliArgs) -> Result<(), Error> {
    let handle = start(&args).await?;
    println!(
        "kube API stand-in at {} (kubeconfig {})",
        handle.base_url(),
        args.kubeconfig.display()
    );
    tokio::signal::ctrl_c().await?;
    handle.shutdown().await;
    Ok(())
}

/// Everything [`run`] does before waiting.
pub async fn start(args: &CliArgs) -> Result<KubeApiHandle, Error> {
    let handle = KubeApi::start(Options {
        listen: args.listen,
        time_scale: args.time_scale,
        pod_ready_delay: secs("pod-ready-delay", args.pod_ready_delay)?,
        bookmark_interval: secs("bookmark-interval", args.bookmark_interval)?,
        admission: None,
    })
    .await?;
    for n in &args.nodes {
        handle.cluster().add(&NodeBuilder::new(n))?;
    }
    for path in &args.objects {
        for obj in load_objects(path)? {
            let kind = kind_of(&obj).ok_or_else(|| Error::Objects {
                path: path.clone(),
                message: format!(
                    "unsupported apiVersion/kind {}/{}",
                    obj["apiVersion"], obj["kind"]
                ),
            })?;
            handle.cluster().create(kind, obj)?;
        }
    }
    handle.write_kubeconfig_for(&args.kubeconfig, &args.user)?;
    Ok(handle)
}

fn load_objects(path: &PathBuf) -> Result<Vec<Value>, Error> {
    let err = |message: String| Error::Objects {
        path: path.clone(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    Ok(match v {
        Value::Array(items) => items,
        v if v.get("kind").and_then(Value::as_str) == Some("List") => v
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        v => vec![v],
    })
}

fn kind_of(obj: &Value) -> Option<Kind> {
    let av = obj.get("apiVersion").and_then(Value::as_str)?;
    let k = obj.get("kind").and_then(Value::as_str)?;
    Kind::ALL
        .into_iter()
        .find(|kind| kind.api_version() == av && kind.kind_name() == k)
}
