//! The billing service binary.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    billing::run(billing::Config::from_env()?).await
}
