//! The billing service binary.
postmesh_shared::fast_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    billing::start(billing::Config::from_env()?)
        .await?
        .until_signal()
        .await
}
