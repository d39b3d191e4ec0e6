//! The sender service binary.
postmesh_shared::fast_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sender::start(sender::Config::from_env()?)
        .await?
        .until_signal()
        .await
}
