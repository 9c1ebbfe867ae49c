//! The etcd driver of the distlock family. Not implemented yet: this crate
//! exports nothing until its driver lands.
