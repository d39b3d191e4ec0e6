//! The strict fake of Stripe's API from the tests, as a process of its own for a stack run
//! outside the tests (`make api-check`): prints its base URL, then serves until stopped.

use postmesh_tests::fake_stripe::FakeStripe;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let fake = FakeStripe::start().await;
    println!("{}", fake.config().api_base);
    tokio::signal::ctrl_c().await?;
    Ok(())
}
