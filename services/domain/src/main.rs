//! The domain service binary.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    domain::run(domain::Config::from_env()?).await
}
