//! The gateway binary. `api-gateway` serves; `api-gateway create-key --email E --credits N
//! [--role admin]` creates an API key and prints it alone on the last line.

use anyhow::{bail, Context};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => api_gateway::run(api_gateway::Config::from_env()?).await,
        Some("create-key") => {
            let (mut email, mut credits, mut role) = (None, 0i64, api_gateway::keys::Role::Member);
            let mut it = args[1..].iter();
            while let Some(flag) = it.next() {
                let value = it.next().with_context(|| format!("{flag} needs a value"))?;
                match flag.as_str() {
                    "--email" => email = Some(value.clone()),
                    "--credits" => {
                        credits = value.parse().context("--credits must be a whole number")?
                    }
                    "--role" => {
                        role = api_gateway::keys::Role::parse(value)
                            .context("--role must be member or admin")?
                    }
                    other => bail!("unknown option {other}"),
                }
            }
            let email = email
                .context("usage: api-gateway create-key --email E [--credits N] [--role admin]")?;
            let common = postmesh_shared::Common::from_env(api_gateway::SERVICE)?;
            let key = api_gateway::create_key(&common, &email, role, credits).await?;
            eprintln!(
                "created an API key ({}) for {email} with {credits} credits",
                role.as_str()
            );
            println!("{key}");
            Ok(())
        }
        Some(other) => bail!("unknown command {other}; use no argument to serve, or create-key"),
    }
}
