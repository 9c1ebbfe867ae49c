//! Bad input at scale for everything the facade parses: URLs of every
//! scheme it knows (through the facade's `Config` and each driver's URL
//! parser, which the facade re-exports), TOML configs, durations and
//! requirement lists. 10,000 generated cases per parser: random strings
//! and near-valid structured input with random hosts, ports, userinfo and
//! options.
//!
//! Nothing may panic; every error is a typed `Config` or `InvalidArgument`
//! error, or `Unsupported` for settings a driver documents as not going
//! together (`RedisConfig::validate`: `fair` or `layout=redisson` on
//! Redlock); a password (a random `pw<...>` marker) never appears in an error
//! message, an error's `Debug`, or a parsed config's `Debug`.
//!
//! Nothing here connects anywhere: the facade has no parse-only entry point
//! for network schemes (`distlock::backend::open` / `connect` connect), so URLs of
//! network schemes go to the drivers' parsers (`RedisConfig::from_url`,
//! `EtcdConfig::from_url`, `ZkConfig::from_url`, `SqlConfig::from_url`),
//! which never connect. Only `memory://` URLs and URLs without a known
//! scheme go through `distlock::backend::open`, which then opens nothing on the
//! network.

use distlock::lock_etcd::EtcdConfig;
use distlock::lock_redis::RedisConfig;
use distlock::lock_sql::SqlConfig;
use distlock::lock_zk::ZkConfig;
use distlock::{
    Config, ErrorKind, LockError, parse_duration, parse_requirements, supported_schemes,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const CASES: u32 = 10_000;

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    }
}

/// Random text (any characters, some URL and TOML punctuation), mostly
/// short. Cheaper to generate than `any::<String>()`'s regex.
fn any_text() -> impl Strategy<Value = String> {
    let c = prop_oneof![
        3 => any::<char>(),
        2 => proptest::char::range(' ', '~'),
        1 => proptest::sample::select(vec![':', '/', '@', '?', '=', '&', '%', '[', ']', '"', '\n', '\0']),
    ];
    proptest::collection::vec(c, 0..=60).prop_map(|chars| chars.into_iter().collect())
}

/// A password marker: `pw` and random letters and digits, sometimes with
/// percent-encoded separators (the URL stays well-formed).
fn password() -> impl Strategy<Value = String> {
    (
        "[A-Za-z0-9]{8,16}",
        prop_oneof![
            Just(""),
            Just("%40"),
            Just("%3A"),
            Just("%2F"),
            Just("%25"),
            Just("%3F")
        ],
    )
        .prop_map(|(body, tail)| format!("pw{body}{tail}"))
}

/// The marker as it must never appear: its literal letters (before any
/// encoded tail), which is also how a decoded password would start.
fn marker_of(password: &str) -> String {
    password.split('%').next().unwrap_or(password).to_owned()
}

fn scheme() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(vec![
            "redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster",
            "rediss+cluster", "redlock", "etcd", "etcds", "zk", "zookeeper", "postgres",
            "postgresql", "mysql", "mariadb", "sqlite", "memory",
        ])
        .prop_map(str::to_owned),
        1 => proptest::sample::select(vec!["REDIS", "Etcd", "http", "redis+", "sqlite3", "", "zk+tls"])
            .prop_map(str::to_owned),
        1 => "[a-z+]{0,8}",
    ]
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("127.0.0.1".to_owned()),
        Just("localhost".to_owned()),
        Just("[::1]".to_owned()),
        Just("[::1".to_owned()),
        Just("::1".to_owned()),
        Just(String::new()),
        "[a-z0-9.-]{1,12}",
        "[a-zA-Z0-9%._~:\\[\\]-]{0,16}",
    ]
}

fn port() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        any::<u16>().prop_map(|p| format!(":{p}")),
        any::<u32>().prop_map(|p| format!(":{p}")),
        Just(":".to_owned()),
        Just(":0".to_owned()),
        Just(":65536".to_owned()),
        "[:][a-z0-9+-]{0,6}",
    ]
}

fn hosts() -> impl Strategy<Value = String> {
    proptest::collection::vec((host(), port()), 1..4).prop_map(|list| {
        list.into_iter()
            .map(|(h, p)| format!("{h}{p}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Option names every driver knows, plus strangers.
fn option_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(vec![
            "ttl", "prefix", "timeout", "operation_timeout", "op_timeout", "replicas",
            "wait_replicas", "wait_timeout", "recheck", "tls", "ca", "tls_ca", "insecure",
            "eviction", "connect_timeout", "session_timeout", "user", "cert", "key", "domain",
            "cacert", "root", "containers", "table", "pool_size", "busy_timeout",
            "create_table", "connections", "fair", "layout", "token_suffix",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z_]{0,10}",
    ]
}

fn option_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        proptest::sample::select(vec![
            "0",
            "1",
            "true",
            "false",
            "yes",
            "warn",
            "refuse",
            "10s",
            "250ms",
            "1m30s",
            "5",
            "-1s",
            "99999999999999999999h",
            "%",
            "%zz",
            "%C3%28",
            "/tmp/x.pem",
            "a{b}",
        ])
        .prop_map(str::to_owned),
        any::<u64>().prop_map(|n| n.to_string()),
        "[a-zA-Z0-9%./:{}_-]{0,12}",
    ]
}

/// A near-valid URL of a random scheme with userinfo carrying a password
/// marker (or none), and the marker to look for.
fn structured_url() -> impl Strategy<Value = (String, Option<String>)> {
    let userinfo = prop_oneof![
        Just((String::new(), None)),
        "[a-z]{1,6}".prop_map(|u| (format!("{u}@"), None)),
        ("[a-z]{0,6}", password()).prop_map(|(u, p)| (format!("{u}:{p}@"), Some(p))),
    ];
    let path = prop_oneof![
        Just(String::new()),
        Just("/".to_owned()),
        "/[a-z0-9]{1,8}",
        "/[0-9]{1,3}",
        "/[a-zA-Z0-9_/%.-]{0,20}",
        Just("//".to_owned()),
    ];
    let options = proptest::collection::vec((option_name(), option_value()), 0..4);
    // Options that carry a password of their own (etcd's `password`,
    // Redis' `sentinel_password`).
    let secret_option = prop_oneof![
        3 => Just(None),
        1 => (prop_oneof![Just("password"), Just("sentinel_password")], password())
            .prop_map(|(name, p)| Some((name.to_owned(), p))),
    ];
    (scheme(), userinfo, hosts(), path, options, secret_option).prop_map(
        |(scheme, (userinfo, mut marker), hosts, path, options, secret)| {
            let mut pairs: Vec<String> = options
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if let Some((name, p)) = secret {
                pairs.push(format!("{name}={p}"));
                marker = marker.or(Some(p));
            }
            let query = if pairs.is_empty() {
                String::new()
            } else {
                format!("?{}", pairs.join("&"))
            };
            (format!("{scheme}://{userinfo}{hosts}{path}{query}"), marker)
        },
    )
}

/// A near-valid Redis URL: a Redis scheme, hosts and a path that parse,
/// and the Redis driver's own options with values it may or may not take
/// (`connections` above its limit, a layout it does not know...), with a
/// password marker or none. Few of [`structured_url`]'s cases get past
/// the hosts and every option (30 in 10,000 reached the end of the Redis
/// options, none with `connections`).
fn redis_url() -> impl Strategy<Value = (String, Option<String>)> {
    let scheme = proptest::sample::select(distlock::lock_redis::DRIVER.schemes);
    let hosts = proptest::sample::select(vec![
        "127.0.0.1:6379",
        "localhost",
        "[::1]:7000",
        "a:7000,b:7001,c:7002",
    ]);
    let path = proptest::sample::select(vec!["", "/0", "/3", "/mymaster"]);
    // `connections` the most often (the option this branch was added
    // for), the other Redis options mostly with values they take: the
    // driver reads `connections` last, after every other option.
    let option = prop_oneof![
        2 => proptest::sample::select(vec!["0", "1", "2", "4", "64", "65", "two", "-1", ""])
            .prop_map(|n| format!("connections={n}")),
        2 => proptest::sample::select(vec![
            "fair=true", "fair=false", "fair=maybe", "layout=plain", "layout=redisson",
            "layout=native", "layout=x", "token_suffix=:t", "token_suffix=", "replicas=1",
            "wait_timeout=200ms", "wait_timeout=0s", "timeout=5s", "ttl=10s", "prefix=app:",
            "eviction=warn", "recheck=1s",
        ])
        .prop_map(str::to_owned),
        1 => (option_name(), option_value()).prop_map(|(k, v)| format!("{k}={v}")),
    ];
    let options = proptest::collection::vec(option, 0..4);
    (
        scheme,
        proptest::option::of(password()),
        hosts,
        path,
        options,
    )
        .prop_map(|(scheme, password, hosts, path, options)| {
            let userinfo = password
                .as_ref()
                .map_or(String::new(), |p| format!(":{p}@"));
            let query = if options.is_empty() {
                String::new()
            } else {
                format!("?{}", options.join("&"))
            };
            (
                format!("{scheme}://{userinfo}{hosts}{path}{query}"),
                password,
            )
        })
}

fn any_url() -> impl Strategy<Value = (String, Option<String>)> {
    prop_oneof![
        3 => structured_url(),
        1 => redis_url(),
        1 => any_text().prop_map(|s| (s, None)),
        1 => "[a-z+]{0,8}:(//)?[ -~]{0,30}".prop_map(|s| (s, None)),
        1 => Just(("sqlite::memory:".to_owned(), None)),
    ]
}

/// The facade's scheme rule: case-insensitive, as URL schemes are
/// (`sqlite::memory:` is sqlite).
fn scheme_of(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _)) => scheme.to_ascii_lowercase(),
        None if url.starts_with("sqlite:") => "sqlite".to_owned(),
        None => String::new(),
    }
}

/// Who parsed: the facade's own `Config` / `open`, or a driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parser {
    Facade,
    Redis,
    Etcd,
    Zk,
    Sql,
}

fn check_error(
    err: &LockError,
    _parser: Parser,
    what: &str,
    marker: Option<&str>,
) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(
            err.kind(),
            ErrorKind::Config | ErrorKind::InvalidArgument | ErrorKind::Unsupported
        ),
        "{what}: untyped error {:?}: {err}",
        err.kind()
    );
    if let Some(marker) = marker {
        let text = err.to_string();
        let debug = format!("{err:?}");
        prop_assert!(
            !text.contains(marker),
            "{what}: password in the message: {text}"
        );
        prop_assert!(
            !debug.contains(marker),
            "{what}: password in the Debug output: {debug}"
        );
    }
    Ok(())
}

fn check_debug(
    debug: &str,
    _parser: Parser,
    what: &str,
    marker: Option<&str>,
) -> Result<(), TestCaseError> {
    if let Some(marker) = marker {
        prop_assert!(
            !debug.contains(marker),
            "{what}: password in the config's Debug: {debug}"
        );
    }
    Ok(())
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

/// Parses `url` the way the facade would pick its driver, without
/// connecting to anything.
fn parse_without_connecting(
    rt: &tokio::runtime::Runtime,
    url: &str,
    marker: Option<&str>,
) -> Result<(), TestCaseError> {
    let what = format!("{url:?}");
    match Config::from_url(url) {
        Ok(config) => check_debug(&format!("{config:?}"), Parser::Facade, &what, marker)?,
        Err(err) => check_error(&err, Parser::Facade, &what, marker)?,
    }
    let scheme = scheme_of(url.trim());
    macro_rules! driver {
        ($parser:expr, $parse:expr) => {
            match $parse {
                Ok(config) => check_debug(&format!("{config:?}"), $parser, &what, marker)?,
                Err(err) => check_error(&err, $parser, &what, marker)?,
            }
        };
    }
    match scheme.as_str() {
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" | "redlock" => driver!(Parser::Redis, RedisConfig::from_url(url.trim())),
        "etcd" | "etcds" => driver!(Parser::Etcd, EtcdConfig::from_url(url.trim())),
        "zk" | "zookeeper" => driver!(Parser::Zk, ZkConfig::from_url(url.trim())),
        "postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite" => {
            driver!(Parser::Sql, SqlConfig::from_url(url.trim()))
        }
        // In-process drivers: opening reaches no network either.
        "file" | "slowmem" => match rt.block_on(distlock::backend::open(url)) {
            Ok(backend) => prop_assert!(
                ["file", "slowmem"].contains(&backend.name()),
                "{} opened {}",
                what,
                backend.name()
            ),
            Err(err) => check_error(&err, Parser::Facade, &what, marker)?,
        },
        other => {
            // memory://, or no scheme the facade knows: `open` reaches no
            // network (memory is in-process; anything else is refused).
            assert!(
                other == "memory" || !supported_schemes().contains(&other),
                "{other}"
            );
            match rt.block_on(distlock::backend::open(url)) {
                Ok(backend) => prop_assert_eq!(backend.name(), "memory", "{}", what),
                Err(err) => check_error(&err, Parser::Facade, &what, marker)?,
            }
        }
    }
    Ok(())
}

/// A TOML basic string: `"`, `\\` and control characters escaped.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_text() -> impl Strategy<Value = (String, Option<String>)> {
    let duration = prop_oneof![
        Just("\"10s\"".to_owned()),
        Just("\"250ms\"".to_owned()),
        Just("\"soon\"".to_owned()),
        Just("10".to_owned()),
        Just("\"-1s\"".to_owned()),
        "\"[0-9a-z.]{0,8}\"",
    ];
    let require = proptest::collection::vec(
        prop_oneof![
            proptest::sample::select(vec![
                "fencing",
                "fencing-survives-failover",
                "linearizable",
                "fifo",
                "notify",
                "",
                " fencing ",
                "magic",
            ])
            .prop_map(str::to_owned),
            "[a-z-]{0,10}",
        ],
        0..4,
    )
    .prop_map(|names| {
        format!(
            "[{}]",
            names
                .iter()
                .map(|n| toml_string(n))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    let phase = prop_oneof![Just("old"), Just("dual"), Just("new"), Just("sideways")];
    let structured = (
        structured_url(),
        structured_url(),
        proptest::option::of(duration.clone()),
        proptest::option::of(duration),
        proptest::option::of(require),
        phase,
        0u8..6,
    )
        .prop_map(
            |((url, m1), (other, m2), ttl, wait, require, phase, shape)| {
                let mut text = String::new();
                match shape {
                    0 | 1 => text.push_str(&format!("url = {}\n", toml_string(&url))),
                    2 => {}
                    3 => {
                        text.push_str(&format!("url = {}\ncolour = \"blue\"\n", toml_string(&url)))
                    }
                    _ => {}
                }
                if let Some(ttl) = ttl {
                    text.push_str(&format!("ttl = {ttl}\n"));
                }
                if let Some(wait) = wait {
                    text.push_str(&format!("wait = {wait}\n"));
                }
                if let Some(require) = require {
                    text.push_str(&format!("require = {require}\n"));
                }
                if shape >= 4 || shape == 1 {
                    text.push_str(&format!(
                        "[migration]\nold = {}\nnew = {}\nphase = {}\n",
                        toml_string(&url),
                        toml_string(&other),
                        toml_string(phase)
                    ));
                }
                (text, m1.or(m2))
            },
        );
    prop_oneof![
        3 => structured,
        1 => any_text().prop_map(|s| (s, None)),
        1 => "[a-z =\"\\[\\]\n.:/0-9]{0,60}".prop_map(|s| (s, None)),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn urls_of_every_scheme_parse_or_refuse_with_a_typed_error((url, marker) in any_url()) {
        let marker = marker.as_deref().map(marker_of);
        parse_without_connecting(runtime(), &url, marker.as_deref())?;
    }

    #[test]
    fn toml_configs_parse_or_refuse_with_a_config_error((text, marker) in toml_text()) {
        let marker = marker.as_deref().map(marker_of);
        let what = format!("{text:?}");
        match Config::from_toml_str(&text) {
            Ok(config) => {
                check_debug(&format!("{config:?}"), Parser::Facade, &what, marker.as_deref())?;
                prop_assert!(config.migration.is_some() || !config.url.is_empty());
            }
            Err(err) => {
                check_error(&err, Parser::Facade, &what, marker.as_deref())?;
                prop_assert_eq!(err.kind(), ErrorKind::Config, "{}: {}", what, err);
            }
        }
    }

    #[test]
    fn durations_parse_or_refuse_with_a_config_error(
        text in prop_oneof![any_text(), "[0-9.]{0,6}(us|µs|ms|s|m|min|h|x|)([0-9]{0,3}[a-z]{0,2}){0,3}"]
    ) {
        match parse_duration(&text) {
            // One syntax everywhere: the facade's parser is lock-core's.
            Ok(d) => prop_assert_eq!(Some(d), lock_core::parse_duration(&text)),
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::Config, "{:?}: {}", text, err);
                prop_assert_eq!(lock_core::parse_duration(&text), None);
            }
        }
    }

    #[test]
    fn requirement_lists_parse_or_refuse_with_a_config_error(text in prop_oneof!["[a-z, -]{0,40}", any_text()]) {
        if let Err(err) = parse_requirements(text.split(',')) {
            prop_assert_eq!(err.kind(), ErrorKind::Config, "{:?}: {}", text, err);
        }
    }
}
