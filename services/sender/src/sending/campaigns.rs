//! Campaigns: `POST /campaigns {key, name, audience, templateKey, topic, emailType}`,
//! `GET /campaigns`, `GET /campaigns/{key}`. The first send of a campaign freezes its
//! audience (the contact ids it resolves to, stored); every later send of it, a retry
//! included, goes to exactly those contacts. A send's missing `templateKey`, `topic` and
//! `emailType` come from its campaign.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::{is_unique_violation, now_unix};
use postmesh_shared::extract::{Caller, JsonBody, PageQuery, QueryParams};
use postmesh_shared::{ApiError, EmailAddress, Success, WorkspaceId};

use crate::audience::audiences::{self, Audience, AudienceBody};
use crate::audience::contacts::{name, Name};
use crate::model::{parse_key, Key, Recipient, MAX_KEY_LEN};
use crate::sending::request::{EmailType, EmailTypeText, HeaderText, SendBody, TemplateKeyText};
use crate::AppState;

/// A campaign as answered.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Campaign {
    pub key: String,
    pub name: String,
    #[schema(value_type = AudienceBody)]
    pub audience: Json<AudienceBody>,
    pub template_key: Option<String>,
    pub topic: Option<String>,
    pub email_type: EmailType,
    pub created_at: i64,
    /// When its first send froze the audience; none before.
    pub frozen_at: Option<i64>,
    /// Contacts in the frozen audience.
    pub members: i64,
}

const COLUMNS: &str = "key, name, audience, template_key, topic, email_type, created_at,
    frozen_at, (SELECT count(*) FROM campaign_members m WHERE m.campaign_id = c.id) AS members";

/// A key made from a campaign's name (`Spring Sale!` → `spring-sale`).
pub fn key_of(name: &str) -> String {
    let slug: String = name
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let slug: Vec<&str> = slug.split('-').filter(|p| !p.is_empty()).collect();
    let mut key = slug.join("-");
    key.truncate(MAX_KEY_LEN);
    if key.is_empty() {
        key = "campaign".into();
    }
    key
}

/// `POST /campaigns` body.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewCampaign {
    #[schema(value_type = Key, required = true)]
    pub key: Option<Key>,
    /// The key unless given.
    pub name: Option<Name>,
    #[schema(value_type = Audience)]
    pub audience: Option<AudienceBody>,
    pub template_key: Option<Name>,
    pub topic: Option<Name>,
    /// `marketing` unless given.
    pub email_type: Option<EmailTypeText>,
}

/// Stores a new campaign; 409 when its key is taken.
pub async fn insert(
    db: &PgPool, workspace: WorkspaceId, body: NewCampaign,
) -> Result<Campaign, ApiError> {
    let bad = ApiError::BadRequest;
    let key = parse_key("campaign", body.key.as_deref().unwrap_or("")).map_err(bad)?;
    let title = name("name", body.name.as_deref().unwrap_or(&key)).map_err(bad)?;
    let audience = body
        .audience
        .ok_or_else(|| bad("a campaign needs an audience".into()))?;
    Audience::parse(&audience, true).map_err(|e| bad(format!("audience: {e}")))?;
    // Campaign mail is marketing unless said otherwise.
    let email_type = EmailType::parse(Some(body.email_type.as_deref().unwrap_or("marketing")))
        .ok_or_else(|| bad("emailType is not one of transactional, lifecycle, marketing".into()))?;
    let topic = body
        .topic
        .as_deref()
        .map(|t| name("topic", t))
        .transpose()
        .map_err(bad)?;
    let template_key = body
        .template_key
        .as_deref()
        .map(|t| name("templateKey", t))
        .transpose()
        .map_err(bad)?;
    let made = sqlx::query_as::<_, Campaign>(&format!(
        "INSERT INTO campaigns AS c (id, workspace_id, key, name, audience, template_key, topic,
                                     email_type, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         RETURNING {COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(workspace)
    .bind(&key)
    .bind(&title)
    .bind(Json(&audience))
    .bind(&template_key)
    .bind(&topic)
    .bind(email_type)
    .bind(now_unix())
    .fetch_one(db)
    .await;
    match made {
        Err(e) if is_unique_violation(&e) => Err(ApiError::Conflict(format!(
            "a campaign with key {key:?} exists"
        ))),
        other => Ok(other?),
    }
}

/// One campaign, answered.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = CampaignOne)]
pub struct One {
    pub campaign: Campaign,
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewCampaign>,
) -> Result<(StatusCode, Success<One>), ApiError> {
    let campaign = insert(&state.db, caller.workspace, body).await?;
    Ok((StatusCode::CREATED, Success::new(One { campaign })))
}

/// `GET /campaigns` answer: a page, oldest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CampaignList {
    pub campaigns: Vec<Campaign>,
    pub limit: i64,
    pub offset: i64,
}

/// A page of campaigns when no limit is given.
const DEFAULT_PAGE: i64 = 50;

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<CampaignList>, ApiError> {
    let page = q.page(DEFAULT_PAGE)?;
    let campaigns = sqlx::query_as::<_, Campaign>(&format!(
        "SELECT {COLUMNS} FROM campaigns c WHERE workspace_id = $1
         ORDER BY created_at, key LIMIT $2 OFFSET $3"
    ))
    .bind(caller.workspace)
    .bind(page.limit)
    .bind(page.offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(CampaignList {
        campaigns,
        limit: page.limit,
        offset: page.offset,
    }))
}

/// Campaign `key` of `workspace`, if any.
async fn find(
    db: &PgPool, workspace: WorkspaceId, key: &str,
) -> Result<Option<Campaign>, sqlx::Error> {
    sqlx::query_as::<_, Campaign>(&format!(
        "SELECT {COLUMNS} FROM campaigns c WHERE workspace_id = $1 AND key = $2"
    ))
    .bind(workspace)
    .bind(key)
    .fetch_optional(db)
    .await
}

pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, Path(key): Path<String>,
) -> Result<Success<One>, ApiError> {
    find(&state.db, caller.workspace, key.trim())
        .await?
        .map(|campaign| Success::new(One { campaign }))
        .ok_or_else(|| ApiError::NotFound(format!("no campaign {key:?}")))
}

/// Fills a campaign send's missing `templateKey`, `topic` and `emailType` from campaign
/// `key`; 404 when there is none.
pub async fn fill_defaults(
    db: &PgPool, workspace: WorkspaceId, key: &str, body: &mut SendBody,
) -> Result<(), ApiError> {
    let campaign = find(db, workspace, key.trim())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no campaign {key:?}")))?;
    let has_content = body.html.is_some() || body.text.is_some() || body.template_key.is_some();
    if !has_content {
        body.template_key = campaign.template_key.map(TemplateKeyText::from);
    }
    if body.topic.is_none() {
        body.topic = campaign.topic.map(HeaderText::from);
    }
    if body.email_type.is_none() {
        body.email_type = Some(campaign.email_type.as_str().into());
    }
    Ok(())
}

/// The recipients of campaign `key`: its frozen audience, frozen now by the first send (in
/// its own transaction, under the campaign's row lock, so two first sends freeze it once);
/// without `freeze` (a dry run) an unfrozen audience is resolved and left unfrozen.
pub async fn recipients(
    db: &PgPool, workspace: WorkspaceId, key: &str, max: usize, freeze: bool,
) -> Result<Vec<Recipient>, ApiError> {
    let mut tx = db.begin().await?;
    let campaign: Option<(Uuid, Json<AudienceBody>, Option<i64>)> = sqlx::query_as(
        "SELECT id, audience, frozen_at FROM campaigns WHERE workspace_id = $1 AND key = $2
         FOR UPDATE",
    )
    .bind(workspace)
    .bind(key)
    .fetch_optional(&mut *tx)
    .await?;
    let (id, audience, frozen_at) =
        campaign.ok_or_else(|| ApiError::NotFound(format!("no campaign {key:?}")))?;
    if frozen_at.is_none() {
        let audience = Audience::parse(&audience.0, true)
            .map_err(|e| ApiError::BadRequest(format!("the campaign's audience: {e}")))?;
        let members = audiences::resolve(&mut tx, workspace, &audience, max).await?;
        if !freeze {
            return Ok(members.into_iter().map(|(_, r)| r).collect());
        }
        let ids: Vec<Uuid> = members.iter().map(|(id, _)| *id).collect();
        sqlx::query(
            "INSERT INTO campaign_members (campaign_id, contact_id)
             SELECT $1, c FROM UNNEST($2::uuid[]) AS c",
        )
        .bind(id)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE campaigns SET frozen_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now_unix())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    // Members whose contact was deleted since are left out.
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT c.email, c.external_id FROM campaign_members m
         JOIN contacts c ON c.id = m.contact_id AND c.workspace_id = $2
         WHERE m.campaign_id = $1 ORDER BY m.contact_id",
    )
    .bind(id)
    .bind(workspace)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(email, external_id)| {
            EmailAddress::parse(&email).map(|email| Recipient { email, external_id })
        })
        .collect())
}

/// A campaign named `name` made by a send to `audience`; its key.
pub async fn create_for_send(
    db: &PgPool, workspace: WorkspaceId, name: &str, audience: &Value, email_type: EmailType,
    topic: Option<&str>,
) -> Result<String, ApiError> {
    let audience: AudienceBody = serde_json::from_value(audience.clone())
        .map_err(|e| ApiError::BadRequest(format!("audience: {e}")))?;
    let key = key_of(name);
    let wanted = NewCampaign {
        key: Some(key.clone().into()),
        name: Some(name.into()),
        audience: Some(audience),
        template_key: None,
        topic: topic.map(Name::from),
        email_type: Some(email_type.as_str().into()),
    };
    let made = insert(db, workspace, wanted.clone()).await;
    let Err(ApiError::Conflict(taken)) = made else {
        return made.map(|campaign| campaign.key);
    };
    // A send that failed after making its campaign may be repeated as is: the campaign,
    // made just so and never sent, is taken again.
    match find(db, workspace, &key).await? {
        Some(existing) if made_by(&existing, &wanted) && !sent(db, workspace, &key).await? => {
            Ok(key)
        }
        _ => Err(ApiError::Conflict(taken)),
    }
}

/// Whether `campaign` is what a send's `campaignName` would make of `wanted`.
fn made_by(campaign: &Campaign, wanted: &NewCampaign) -> bool {
    let same_audience = wanted.audience.as_ref().is_some_and(|a| {
        serde_json::to_value(a).ok() == serde_json::to_value(&campaign.audience.0).ok()
    });
    Some(campaign.name.as_str()) == wanted.name.as_deref().map(str::trim)
        && same_audience
        && campaign.template_key.is_none()
        && campaign.topic.as_deref() == wanted.topic.as_deref().map(str::trim)
        && Some(campaign.email_type.as_str()) == wanted.email_type.as_deref()
}

/// Whether a send of campaign `key` was stored.
async fn sent(db: &PgPool, workspace: WorkspaceId, key: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE workspace_id = $1 AND campaign_key = $2)",
    )
    .bind(workspace)
    .bind(key)
    .fetch_one(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_made_from_names() {
        assert_eq!(key_of("Spring Sale 2026!"), "spring-sale-2026");
        assert_eq!(key_of("¡¡"), "campaign");
    }
}
