//! The restart policy settled at the rendezvous, over TCP: the first worker's declaration
//! settles an open policy, a launcher on another node reads it back, a worker whose strategy
//! needs the other policy is refused naming both, and a given policy refuses a misfit.

use std::time::Duration;

use afterburner_rendezvous::{
    Declaration, Launched, LighthouseServer, RestartPolicy, ask_restart_policy, connect,
};

const WAIT: Duration = Duration::from_secs(5);

fn declaring(strategy: &str, policy: RestartPolicy) -> Declaration {
    Declaration {
        strategy: strategy.into(),
        policy,
    }
}

#[test]
fn the_first_worker_settles_the_policy_and_a_launcher_reads_it_back() {
    let config = Launched::quorum_config(3, None, WAIT);
    let server =
        LighthouseServer::bind_with_token("127.0.0.1:0", config, Some("k".into())).unwrap();
    let address = server.address();
    assert_eq!(ask_restart_policy(address, WAIT, Some("k")).unwrap(), None);
    let diloco = declaring("diloco", RestartPolicy::Replica);
    let _first = connect(address, 0, WAIT, Some("k"), Some(&diloco)).unwrap();
    let settled = ask_restart_policy(address, WAIT, Some("k"))
        .unwrap()
        .unwrap();
    assert_eq!(settled.policy, RestartPolicy::Replica);
    assert_eq!(settled.by, "rank 0's strategy diloco");
    assert_eq!(server.lighthouse().restart_policy(), Some(settled));
    // A worker that declares nothing (a lighthouse client of one's own) is admitted.
    let _plain = connect(address, 2, WAIT, Some("k"), None).unwrap();
    let ddp = declaring("ddp", RestartPolicy::All);
    let error = connect(address, 1, WAIT, Some("k"), Some(&ddp))
        .err()
        .expect("a worker running ddp under replica is refused")
        .to_string();
    assert!(
        error.contains("rank 1 runs strategy ddp") && error.contains("rank 0's strategy diloco"),
        "{error}"
    );
    let error = ask_restart_policy(address, WAIT, Some("wrong"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("AFTERBURNER_TOKEN"), "{error}");
}

#[test]
fn a_given_policy_refuses_a_worker_whose_strategy_needs_the_other() {
    let config = Launched::quorum_config(2, RestartPolicy::All, WAIT);
    let server = LighthouseServer::bind("127.0.0.1:0", config).unwrap();
    let settled = ask_restart_policy(server.address(), WAIT, None)
        .unwrap()
        .unwrap();
    assert_eq!(settled.policy, RestartPolicy::All);
    assert!(settled.by.contains("--restart-policy"), "{}", settled.by);
    let diloco = declaring("diloco", RestartPolicy::Replica);
    let error = connect(server.address(), 0, WAIT, None, Some(&diloco))
        .err()
        .expect("diloco under a given `all` is refused")
        .to_string();
    assert!(
        error.contains("diloco") && error.contains("--restart-policy replica"),
        "{error}"
    );
    let ddp = declaring("ddp", RestartPolicy::All);
    connect(server.address(), 0, WAIT, None, Some(&ddp)).unwrap();
}
