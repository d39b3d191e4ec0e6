//! The gateway binary. `api-gateway` serves; `api-gateway create-key ...` makes an API key
//! (see `create_key`); `api-gateway bootstrap` makes every service's database role and
//! database (see `bootstrap`).

use anyhow::bail;

postmesh_shared::fast_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => {
            api_gateway::start(api_gateway::Config::from_env()?)
                .await?
                .until_signal()
                .await
        }
        Some("create-key") => {
            let command = api_gateway::create_key::CreateKey::parse(&args[1..])?;
            let common = postmesh_shared::Common::from_env(api_gateway::SERVICE)?;
            command.run(&common).await
        }
        Some("bootstrap") => api_gateway::bootstrap::run().await,
        Some(other) => {
            bail!("unknown command {other}; use no argument to serve, create-key or bootstrap")
        }
    }
}
