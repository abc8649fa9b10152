//! The end of a fault-tolerant run, over TCP: once a member says the run ended at a step, a
//! replica waiting to join is told so (not left waiting for a state no live replica will
//! send), and so is one that connects later; the launcher reads the step back.

use std::time::Duration;

use afterburner_rendezvous::{LighthouseServer, Session};
use afterburner_rendezvous::{Op, QuorumConfig, RendezvousError, connect};

const WAIT: Duration = Duration::from_secs(5);

#[test]
fn a_joiner_is_told_the_run_ended_instead_of_waiting() {
    let server = LighthouseServer::bind("127.0.0.1:0", QuorumConfig::new(2)).unwrap();
    let address = server.address();
    let live = connect(address, 0, WAIT, None, None).unwrap();
    let gone = connect(address, 1, WAIT, None, None).unwrap();
    gone.coordinator.leave(&gone.session, "the test");
    // Collective 0 starts the run: a replica that connects from now on joins it.
    let reply = live
        .coordinator
        .collective(&live.session, 0, Op::Sum, Some(vec![1.0]))
        .unwrap();
    assert_eq!(reply.members, vec![0]);
    let joiner = connect(address, 1, WAIT, None, None).unwrap();
    assert!(joiner.session.joining);
    let waiting = std::thread::spawn(move || joiner.coordinator.receive_state(&joiner.session));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(server.lighthouse().joiners(), vec![1]);
    live.coordinator.end_run(&live.session, 12).unwrap();
    let told = waiting.join().unwrap().unwrap_err();
    assert_eq!(told, RendezvousError::RunEnded { rank: 1, step: 12 });
    assert!(
        told.to_string().contains("after it ended at step 12"),
        "{told}"
    );
    assert_eq!(server.lighthouse().ended_at(), Some(12));
    // The live replica leaves; a replica that connects after that is told the same at once.
    live.coordinator.leave(&live.session, "finished");
    let late = connect(address, 1, WAIT, None, None).unwrap();
    let session: Session = late.session;
    assert_eq!(
        late.coordinator.receive_state(&session).unwrap_err(),
        RendezvousError::RunEnded { rank: 1, step: 12 }
    );
}
