//! Spawner for mariadb (filled by its driver's work).
