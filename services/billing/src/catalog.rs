//! The catalog: credit packs and plans, loaded at start from the catalog file
//! (`BILLING_CATALOG_FILE`) into billing's database, and `GET /billing/catalog`.

use std::collections::HashSet;
use std::path::Path;

use anyhow::Context;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use postmesh_shared::{ApiError, Success};

use crate::AppState;

/// What a pack buys.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum PackKind {
    /// Credits on the key's balance.
    Credits,
    /// Money on the key's usage balance (nano-USD).
    Usage,
}

/// A catalog entry that can be bought (spec §2 Pack).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Pack {
    pub id: String,
    pub name: String,
    pub credits: i64,
    /// Minor currency units.
    pub amount: i64,
    pub currency: String,
    pub kind: PackKind,
}

/// A plan as the catalog file declares it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    pub id: String,
    pub name: String,
    pub mailboxes: i64,
    pub custom_domains: i64,
    pub monthly_emails: i64,
    pub stripe_price_id: String,
}

/// A plan as the API shows it (spec §2 Plan).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Plan {
    pub id: String,
    pub name: String,
    pub mailboxes: i64,
    pub custom_domains: i64,
    pub monthly_emails: i64,
    pub available: bool,
}

/// Limits of a workspace without a plan.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeLimits {
    pub mailboxes: i64,
    pub custom_domains: i64,
}

/// The catalog file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogFile {
    pub packs: Vec<Pack>,
    pub plans: Vec<PlanSpec>,
    pub free: FreeLimits,
}

/// A pack or plan id: 1-40 chars (spec §8).
pub fn check_id(what: &str, id: &str) -> Result<(), ApiError> {
    if (1..=40).contains(&id.chars().count()) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!("{what} must be 1-40 chars")))
    }
}

impl CatalogFile {
    /// Reads and checks the catalog file at `path`.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the catalog file {}", path.display()))?;
        let catalog: Self = serde_json::from_str(&text)
            .with_context(|| format!("parsing the catalog file {}", path.display()))?;
        catalog
            .check()
            .with_context(|| format!("checking the catalog file {}", path.display()))?;
        Ok(catalog)
    }

    fn check(&self) -> anyhow::Result<()> {
        let mut ids = HashSet::new();
        for p in &self.packs {
            check_id("pack id", &p.id)?;
            anyhow::ensure!(ids.insert(&p.id), "pack {} listed twice", p.id);
            anyhow::ensure!(p.amount > 0, "pack {}: amount must be positive", p.id);
            anyhow::ensure!(
                p.currency.len() == 3 && p.currency.bytes().all(|b| b.is_ascii_lowercase()),
                "pack {}: currency must be a lowercase ISO code such as usd",
                p.id
            );
            match p.kind {
                PackKind::Credits => {
                    anyhow::ensure!(p.credits > 0, "credits pack {} grants no credits", p.id)
                }
                PackKind::Usage => {
                    anyhow::ensure!(p.credits == 0, "usage pack {} grants credits", p.id);
                    anyhow::ensure!(p.currency == "usd", "usage pack {} must be in usd", p.id);
                }
            }
        }
        let mut ids = HashSet::new();
        for p in &self.plans {
            check_id("plan id", &p.id)?;
            anyhow::ensure!(ids.insert(&p.id), "plan {} listed twice", p.id);
            anyhow::ensure!(
                p.mailboxes >= 0 && p.custom_domains >= 0 && p.monthly_emails >= 0,
                "plan {}: limits must not be negative",
                p.id
            );
            anyhow::ensure!(
                !p.stripe_price_id.is_empty(),
                "plan {}: no stripe_price_id",
                p.id
            );
        }
        Ok(())
    }

    /// Writes the catalog into billing's database; entries no longer listed become unavailable.
    pub async fn store(&self, db: &PgPool) -> anyhow::Result<()> {
        let mut tx = db.begin().await?;
        sqlx::query("UPDATE packs SET available = false")
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE plans SET available = false")
            .execute(&mut *tx)
            .await?;
        for (position, p) in self.packs.iter().enumerate() {
            sqlx::query(
                "INSERT INTO packs (id, name, credits, amount, currency, kind, position, available)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, true)
                 ON CONFLICT (id) DO UPDATE SET name = $2, credits = $3, amount = $4, currency = $5,
                     kind = $6, position = $7, available = true",
            )
            .bind(&p.id)
            .bind(&p.name)
            .bind(p.credits)
            .bind(p.amount)
            .bind(&p.currency)
            .bind(p.kind)
            .bind(position as i32)
            .execute(&mut *tx)
            .await?;
        }
        for (position, p) in self.plans.iter().enumerate() {
            sqlx::query(
                "INSERT INTO plans (id, name, mailboxes, custom_domains, monthly_emails,
                                    stripe_price_id, position, available)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, true)
                 ON CONFLICT (id) DO UPDATE SET name = $2, mailboxes = $3, custom_domains = $4,
                     monthly_emails = $5, stripe_price_id = $6, position = $7, available = true",
            )
            .bind(&p.id)
            .bind(&p.name)
            .bind(p.mailboxes)
            .bind(p.custom_domains)
            .bind(p.monthly_emails)
            .bind(&p.stripe_price_id)
            .bind(position as i32)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// The packs on sale, in catalog order.
pub async fn packs(db: &PgPool) -> Result<Vec<Pack>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, name, credits, amount, currency, kind FROM packs
         WHERE available ORDER BY position",
    )
    .fetch_all(db)
    .await
}

/// The pack `id` if it is on sale.
pub async fn pack(db: &PgPool, id: &str) -> Result<Option<Pack>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, name, credits, amount, currency, kind FROM packs WHERE id = $1 AND available",
    )
    .bind(id)
    .fetch_optional(db)
    .await
}

/// Every plan, in catalog order, with whether it can be bought now.
pub async fn plans(db: &PgPool) -> Result<Vec<Plan>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, name, mailboxes, custom_domains, monthly_emails, available FROM plans
         ORDER BY available DESC, position",
    )
    .fetch_all(db)
    .await
}

/// The plan `id` if it can be bought, with its Stripe price.
pub async fn plan_for_sale(db: &PgPool, id: &str) -> Result<Option<(Plan, String)>, sqlx::Error> {
    let row: Option<(String, String, i64, i64, i64, bool, String)> = sqlx::query_as(
        "SELECT id, name, mailboxes, custom_domains, monthly_emails, available, stripe_price_id
         FROM plans WHERE id = $1 AND available",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(row.map(
        |(id, name, mailboxes, custom_domains, monthly_emails, available, price)| {
            (
                Plan {
                    id,
                    name,
                    mailboxes,
                    custom_domains,
                    monthly_emails,
                    available,
                },
                price,
            )
        },
    ))
}

/// The answer of `GET /billing/catalog`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CatalogPage {
    /// Whether top-ups can be bought (a payment processor is configured).
    pub enabled: bool,
    pub packs: Vec<Pack>,
}

pub(crate) async fn catalog(
    State(state): State<AppState>,
) -> Result<Success<CatalogPage>, ApiError> {
    let packs = packs(&state.db).await.map_err(|e| {
        tracing::warn!(error = %e, "reading the catalog");
        ApiError::Unavailable("the catalog is unavailable now; retry later".into())
    })?;
    Ok(Success::new(CatalogPage {
        enabled: state.payments.is_some(),
        packs,
    }))
}
