//! The sender service binary.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sender::run(sender::Config::from_env()?).await
}
