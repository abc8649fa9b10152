//! The lighthouse's shared token: a replica presenting it is admitted, one presenting another
//! or none is refused with an error naming `AFTERBURNER_TOKEN`; a lighthouse without a token
//! admits any.

use std::time::Duration;

use afterburner_collectives::{
    LighthouseServer, ProcessGroup, QuorumConfig, connect_tcp, connect_tcp_with_token,
};
use burn::backend::Flex;

const WAIT: Duration = Duration::from_secs(5);

#[test]
fn only_replicas_with_the_token_are_admitted() {
    let server = LighthouseServer::bind_with_token(
        "127.0.0.1:0",
        QuorumConfig::new(3),
        Some("s3cret".into()),
    )
    .unwrap();
    let address = server.address();
    let device = Default::default();
    let admitted =
        connect_tcp_with_token::<Flex>(address, 0, &device, WAIT, Some("s3cret")).unwrap();
    assert_eq!(admitted.world_size(), 3);
    for presented in [Some("guess"), Some("s3cret!"), None] {
        let error = connect_tcp_with_token::<Flex>(address, 1, &device, WAIT, presented)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("AFTERBURNER_TOKEN"),
            "{presented:?}: {error}"
        );
    }
    let open = LighthouseServer::bind("127.0.0.1:0", QuorumConfig::new(1)).unwrap();
    connect_tcp::<Flex>(open.address(), 0, &device, WAIT).unwrap();
    connect_tcp_with_token::<Flex>(open.address(), 0, &device, WAIT, Some("any")).unwrap();
}
