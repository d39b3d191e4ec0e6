//! The webhook-dispatcher service binary.
postmesh_shared::fast_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    webhook_dispatcher::start(webhook_dispatcher::Config::from_env()?)
        .await?
        .until_signal()
        .await
}
