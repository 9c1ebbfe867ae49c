//! What `distlock-compare` needs of each backend beyond its driver, kept
//! out of the product crates: the **raw floors** (the minimal grant and
//! release written by hand on one bare connection, which benchmarks divide
//! by), the permit floors, and the URL option of a driver's fair mode.
//!
//! One entry per driver in [`for_driver`]; a new backend adds a module with
//! its floor and one arm there (see CONTRIBUTING.md).

use std::future::Future;
use std::pin::Pin;

use conformance::floor::RawFloor;
use lock_core::LockError;

/// A boxed, sendable future (what a floor's connect returns).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Connects a driver's raw floor for a URL: `Ok(None)` when this URL's
/// form has none (a Cluster or Sentinel URL, say).
pub type FloorFn =
    for<'a> fn(&'a str) -> BoxFuture<'a, Result<Option<Box<dyn RawFloor>>, LockError>>;

/// Declares a [`FloorFn`] named `$name` that opens a floor with
/// `$connect(url).await` (an `async fn(&str) -> Result<F, LockError>` whose
/// `F` implements [`RawFloor`]), for every URL of the driver.
macro_rules! floor_fn {
    ($vis:vis fn $name:ident = $connect:path) => {
        $vis fn $name(
            url: &str,
        ) -> $crate::BoxFuture<
            '_,
            ::std::result::Result<
                ::std::option::Option<::std::boxed::Box<dyn ::conformance::floor::RawFloor>>,
                ::lock_core::LockError,
            >,
        > {
            ::std::boxed::Box::pin(async move {
                let floor = $connect(url).await?;
                Ok(Some(::std::boxed::Box::new(floor)
                    as ::std::boxed::Box<dyn ::conformance::floor::RawFloor>))
            })
        }
    };
}
pub(crate) use floor_fn;

pub mod crate_alone;
pub mod etcd;
pub mod file;
pub mod nats;
pub mod redis;
pub mod sql;
pub mod zk;

/// A driver's benchmark hooks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Floors {
    /// The mutex floor, when the driver has one.
    pub floor: Option<FloorFn>,
    /// The floor for one permit of a semaphore of 4, when it has one.
    pub permit_floor: Option<FloorFn>,
    /// The URL option (`name=value`) that turns on the driver's fair
    /// (FIFO) mode, for a driver whose default waiting is not in arrival
    /// order, so that benchmarks show fair and unfair side by side.
    pub fair_option: Option<&'static str>,
}

/// The hooks of the driver named `driver` (`Driver::name`); none for a
/// driver without floors (memory).
pub fn for_driver(driver: &str) -> Floors {
    match driver {
        "redis" => Floors {
            floor: Some(redis::floor),
            permit_floor: Some(redis::permit_floor),
            // FIFO mutexes on one server, Sentinel and Cluster.
            fair_option: Some("fair=true"),
        },
        "etcd" => Floors {
            floor: Some(etcd::floor),
            permit_floor: Some(etcd::permit_floor),
            fair_option: None,
        },
        "file" => Floors {
            floor: Some(file::floor),
            ..Floors::default()
        },
        "nats" => Floors {
            floor: Some(nats::floor),
            ..Floors::default()
        },
        "zk" => Floors {
            floor: Some(zk::floor),
            permit_floor: Some(zk::permit_floor),
            fair_option: None,
        },
        "sql" => Floors {
            floor: Some(sql::floor),
            permit_floor: Some(sql::permit_floor),
            // FIFO mutex waiting in row mode (session mode refuses it at
            // connect).
            fair_option: Some("fair=true"),
        },
        _ => Floors::default(),
    }
}
