//! Fenced Redis writes: a value, a hash field and a counter, each changed
//! only under a token not below the last one accepted for the key. Needs a
//! redis-server:
//!
//!     REDIS_URL=redis://127.0.0.1:6379 cargo run -p lock-fence --example fenced_redis

use lock_fence::FencingToken;
use lock_fence::redis::RedisFence;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url)?;
    let fence = RedisFence::new(client.get_multiplexed_async_connection().await?);
    let t = FencingToken::new;

    fence.set("example:config", "v2", t(12)).await?;
    fence
        .hset("example:user:1", "email", "a@example.com", t(12))
        .await?;
    let visits = fence.incr_by("example:visits", 1, t(12)).await?;
    println!("written under token 12; visits = {visits}");

    // A holder that lost its lock writes with an older token.
    match fence.set("example:config", "v1", t(11)).await {
        Err(err) if err.is_stale() => println!("refused: {err}"),
        other => panic!("a stale token must not write: {other:?}"),
    }
    Ok(())
}
