//! The inbound-ingest service binary.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    inbound_ingest::run(inbound_ingest::Config::from_env()?).await
}
