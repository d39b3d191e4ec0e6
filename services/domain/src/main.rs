//! The domain service binary.
postmesh_shared::fast_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    domain::run(domain::Config::from_env()?).await
}
