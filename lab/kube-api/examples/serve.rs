//! Run the stand-in by hand: `cargo run -p rebootd-lab-kube --example serve -- --node a --kubeconfig /tmp/kc`
//! (the same arguments as `rebootd-lab kube-api`).

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = rebootd_lab_kube::serve_cli(args).await {
        eprintln!("{e}");
        std::process::exit(2);
    }
}
