//! Compiles the `.proto` contracts with the pure-Rust protox compiler (no system protoc).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = [root.join("postmesh/v1/postmesh.proto")];
    let fds = protox::compile(&files, [&root])?;
    // `bytes` fields become `Bytes`, so bodies move without copies.
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    Ok(())
}
