//! Spawner for postgres (filled by its driver's work).
