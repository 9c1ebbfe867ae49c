//! Spawner for zookeeper (filled by its driver's work).
