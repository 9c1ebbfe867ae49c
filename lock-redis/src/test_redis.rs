//! The unit tests' Redis: a server the test starts, a plain connection to
//! it, and deliberately broken script variants (the script modules' tests
//! run their Lua, real and broken, against it).

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;

use crate::connection::Conn;
use crate::keys::LuaScript;

/// A fresh `redis-server`; `None` (a printed skip, a failure under CI)
/// when it is not installed.
pub(crate) async fn server() -> Option<RedisServer> {
    RedisServer::start().await.or_skip()
}

/// [`server`] and a plain multiplexed connection to it.
pub(crate) async fn server_and_conn() -> Option<(RedisServer, Conn)> {
    let server = server().await?;
    let conn = plain_conn(server.port()).await;
    Some((server, conn))
}

/// A plain multiplexed connection to the server on `port`.
pub(crate) async fn plain_conn(port: u16) -> Conn {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    Conn::Server(client.get_multiplexed_async_connection().await.unwrap())
}

/// `script` with `from` replaced by `to`: a deliberately broken variant
/// (the replacement must apply, or the test proves nothing).
pub(crate) fn broken(script: &str, from: &str, to: &str) -> LuaScript {
    assert!(script.contains(from), "{from}");
    LuaScript::new(Box::leak(script.replace(from, to).into_boxed_str()))
}
