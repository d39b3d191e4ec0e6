//! Compiles the `.proto` contracts with the pure-Rust protox compiler (no system protoc).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = [root.join("postmesh/v1/postmesh.proto")];
    let fds = protox::compile(&files, [&root])?;
    // `bytes` fields become `Bytes`, so bodies move without copies.
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    // Relative to this package: a build cache shared by two checkouts (a clean clone for CI
    // and a working copy) then watches each checkout's own file.
    println!("cargo:rerun-if-changed=../proto/postmesh/v1/postmesh.proto");
    Ok(())
}
