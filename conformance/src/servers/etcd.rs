//! Spawner for etcd (filled by its driver's work).
