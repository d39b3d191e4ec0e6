//! The domain service binary.
postmesh_shared::fast_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    domain::start(domain::Config::from_env()?)
        .await?
        .until_signal()
        .await
}
