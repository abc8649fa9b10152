//! The `auto` restart policy: read from the program's strategy.

use std::ffi::OsString;
use std::path::Path;

use afterburner_rendezvous::RestartPolicy;

/// The strategies whose replicas are independent, so that one is restarted alone.
const REPLICA_STRATEGIES: &[&str] = &["local-sgd", "local_sgd", "localsgd", "diloco"];

/// The policy for a program started with `args`: `replica` when its `--strategy` (or the
/// `strategy = "..."` line of its `--config FILE`) names Local SGD or DiLoCo, else `all`.
pub fn policy_for(args: &[OsString]) -> RestartPolicy {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let strategy = option(&args, "--strategy").or_else(|| {
        option(&args, "--config").and_then(|file| strategy_in_config(Path::new(&file)))
    });
    match strategy {
        Some(name) if REPLICA_STRATEGIES.contains(&name.to_ascii_lowercase().as_str()) => {
            RestartPolicy::Replica
        }
        _ => RestartPolicy::All,
    }
}

/// The value of `--name VALUE` or `--name=VALUE` (the last one given).
fn option(args: &[String], name: &str) -> Option<String> {
    let mut found = None;
    for (i, arg) in args.iter().enumerate() {
        if arg == name {
            found = args.get(i + 1).cloned();
        } else if let Some(value) = arg.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            found = Some(value.to_string());
        }
    }
    found
}

/// The top-level `strategy = "..."` of a TOML file, or `"strategy": "..."` of a JSON one.
fn strategy_in_config(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        let line = line.trim().trim_start_matches('"');
        let rest = line
            .strip_prefix("strategy")?
            .trim_start_matches('"')
            .trim_start();
        let value = rest.strip_prefix(['=', ':'])?.trim();
        let value = value.trim_end_matches(',').trim().trim_matches('"');
        (!value.is_empty() && !value.starts_with('{')).then(|| value.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn the_strategy_picks_the_policy() {
        assert_eq!(
            policy_for(&args("--strategy diloco")),
            RestartPolicy::Replica
        );
        assert_eq!(
            policy_for(&args("--strategy=local-sgd --bf16")),
            RestartPolicy::Replica
        );
        assert_eq!(policy_for(&args("--strategy ddp")), RestartPolicy::All);
        assert_eq!(policy_for(&args("--max-steps 5")), RestartPolicy::All);
    }

    #[test]
    fn a_config_files_strategy_counts() {
        let dir = std::env::temp_dir().join(format!("ab-launch-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let toml = dir.join("run.toml");
        std::fs::write(
            &toml,
            "max_steps = 5\nstrategy = \"diloco\"\n[diloco]\nsync_every = 7\n",
        )
        .unwrap();
        let json = dir.join("run.json");
        std::fs::write(
            &json,
            "{\n  \"strategy\": \"ddp\",\n  \"max_steps\": 5\n}\n",
        )
        .unwrap();
        let given = |file: &Path| vec![OsString::from("--config"), file.as_os_str().to_owned()];
        assert_eq!(policy_for(&given(&toml)), RestartPolicy::Replica);
        assert_eq!(policy_for(&given(&json)), RestartPolicy::All);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
