//! The sender service binary.
postmesh_shared::fast_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sender::run(sender::Config::from_env()?).await
}
