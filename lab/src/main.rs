//! `rebootd-lab`: run the lab demo and the stand-ins from the command line.

fn main() {
    eprintln!("rebootd-lab: not yet implemented");
    std::process::exit(2);
}
