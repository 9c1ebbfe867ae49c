//! A config that requires read-write locks or semaphores is refused at
//! connect by a backend without them, and accepted by one with them.

use distlock::{Config, ErrorKind, MigrationPhase, Requirements};

#[tokio::test]
async fn shared_lock_requirements_are_checked_at_connect() {
    let wants = Requirements::none().shared_locks().semaphores();
    let memory = Config::from_url("memory://").unwrap().require(wants);
    let client = distlock::connect_config(&memory).await.unwrap();
    let guard = client.semaphore("pool", 2).acquire().await.unwrap();
    guard.release().await.unwrap();
    // A migration serves the mutex only: refused, naming both.
    let migration = Config::migration("memory://a", "memory://b", MigrationPhase::Dual)
        .unwrap()
        .require(wants);
    let err = distlock::connect_config(&migration).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.message().contains("read-write locks"), "{err}");
    assert!(err.message().contains("semaphores"), "{err}");
    // And from the config file's spelling.
    let text = "url = \"memory://\"\nrequire = [\"shared-locks\", \"semaphores\"]\n";
    let config = Config::from_toml_str(text).unwrap();
    assert!(config.requirements.shared_locks && config.requirements.semaphores);
}
