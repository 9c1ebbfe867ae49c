//! Nothing to build: lock-etcd's build dependencies exist only so that cargo
//! unpacks a vendored `protoc` for etcd-client's build script (see
//! `scripts/protoc` and `.cargo/config.toml` at the workspace root).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
