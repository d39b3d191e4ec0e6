//! The webhook-dispatcher service binary.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    webhook_dispatcher::run(webhook_dispatcher::Config::from_env()?).await
}
