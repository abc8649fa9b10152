//! Serves a lighthouse over TCP for fault-tolerant replicas in other processes (Local SGD or
//! DiLoCo over `connect_tcp`; docs/fault-tolerance.md). Runs until killed.
//!
//! `cargo run --release -p afterburner-rendezvous --example lighthouse -- --replicas 3 \
//!   --bind 127.0.0.1:29510 [--timeout-s 60] [--join-timeout-s 600] [--min-replicas 1]`

use std::time::Duration;

use afterburner_rendezvous::{LighthouseServer, QuorumConfig};

const HELP: &str = "usage: lighthouse --replicas N [--bind ADDR (127.0.0.1:29510)] \
[--timeout-s S (60: a collective's wait for a late replica)] \
[--join-timeout-s S (600: a restarted replica's wait for a live state)] \
[--min-replicas N (1: fewer replicas present fail the run)]";

fn main() {
    if let Err(message) = serve(std::env::args().skip(1).collect()) {
        eprintln!("{message}");
        std::process::exit(2);
    }
}

fn serve(args: Vec<String>) -> Result<(), String> {
    let mut bind = "127.0.0.1:29510".to_string();
    let mut replicas = None;
    let (mut timeout, mut join_timeout, mut min_replicas) = (60.0, 600.0, 1);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{HELP}");
            return Ok(());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("'{flag}' needs a value\n{HELP}"))?;
        let number = |what: &str| -> Result<f64, String> {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("'{flag}': '{value}' is not {what}\n{HELP}"))
        };
        match flag.as_str() {
            "--bind" => bind = value.clone(),
            "--replicas" => replicas = Some(number("a positive count")? as usize),
            "--timeout-s" => timeout = number("a positive number of seconds")?,
            "--join-timeout-s" => join_timeout = number("a positive number of seconds")?,
            "--min-replicas" => min_replicas = number("a positive count")? as usize,
            other => return Err(format!("unknown option '{other}'\n{HELP}")),
        }
    }
    let replicas = replicas.ok_or_else(|| format!("--replicas is required\n{HELP}"))?;
    let config = QuorumConfig::new(replicas)
        .with_timeout(Duration::from_secs_f64(timeout))
        .with_join_timeout(Duration::from_secs_f64(join_timeout))
        .with_min_replicas(min_replicas);
    let server = LighthouseServer::bind(bind.as_str(), config).map_err(|e| e.to_string())?;
    println!(
        "lighthouse for {replicas} replicas on {} (Ctrl-C to stop)",
        server.address()
    );
    let mut members = Vec::new();
    loop {
        let now = server.lighthouse().members();
        if now != members {
            println!("members: {now:?}");
            members = now;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
