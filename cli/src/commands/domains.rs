//! `domains list|add|verify`: sender domains (spec §4.5) — list them, submit one, and check
//! its ownership TXT record.

use serde::Serialize;
use uuid::Uuid;

use postmesh_contracts::answers::domain::{DomainList, DomainView, Reviewed, Submitted};
use postmesh_contracts::routes::domain;

use super::Context;
use crate::api::Call;
use crate::cli::DomainsCommand;
use crate::output;

/// The `POST /sender-domains` body.
#[derive(Debug, Serialize)]
struct Submission {
    domain: String,
}

/// `postmesh domains ...`.
pub async fn run(ctx: &Context, command: DomainsCommand) -> anyhow::Result<()> {
    match command {
        DomainsCommand::List => {
            // Unverified domains too: they are the ones waiting for `domains verify`.
            let call = Call::to(domain::DOMAINS).query("include_unverified", 1);
            ctx.show(&call, |list: DomainList| Ok(table(&list.domains)))
                .await
        }
        DomainsCommand::Add { domain } => {
            let call = Call::to(domain::DOMAIN_SUBMIT).json(&Submission { domain })?;
            ctx.show(&call, |added: Submitted| {
                Ok(format!(
                    "Added {} (id {})\n{}",
                    added.domain.domain,
                    id_cell(added.domain.id),
                    added.message
                ))
            })
            .await
        }
        DomainsCommand::Verify { id } => {
            let call = Call::to(domain::DOMAIN_VERIFY_OWNERSHIP).id(id);
            ctx.show(&call, |review: Reviewed| Ok(review.message)).await
        }
    }
}

/// A domain's id as a cell: `platform` for the platform's own domains.
fn id_cell(id: Option<Uuid>) -> String {
    id.map_or_else(|| "platform".to_owned(), |id| id.to_string())
}

/// The domains as a table.
fn table(domains: &[DomainView]) -> String {
    if domains.is_empty() {
        return "No sender domains; add one with postmesh domains add DOMAIN".to_owned();
    }
    let rows: Vec<Vec<String>> = domains
        .iter()
        .map(|d| {
            vec![
                id_cell(d.id),
                d.domain.clone(),
                d.ownership_status.as_str().to_owned(),
                d.inbound_status.as_str().to_owned(),
                d.outbound_status.as_str().to_owned(),
            ]
        })
        .collect();
    output::table(&["ID", "DOMAIN", "OWNERSHIP", "INBOUND", "OUTBOUND"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_list_as_a_table_with_platform_domains_marked() {
        let list: DomainList = serde_json::from_str(
            r#"{"success":true,"inboundMxHost":"mx.postmesh.localhost","domains":[
                {"id":null,"domain":"postmesh.localhost","platform":true,"ownershipStatus":"verified",
                 "inboundStatus":"verified","outboundStatus":"verified"},
                {"id":"00000000-0000-0000-0000-000000000001","domain":"example.com","platform":false,
                 "ownershipStatus":"pending","inboundStatus":"not_started","outboundStatus":"not_started",
                 "verification":{"type":"TXT","name":"_postmesh.example.com","value":"tok"},"createdAt":1}]}"#,
        )
        .unwrap();
        assert_eq!(
            table(&list.domains),
            "\
ID                                    DOMAIN              OWNERSHIP  INBOUND      OUTBOUND
platform                              postmesh.localhost  verified   verified     verified
00000000-0000-0000-0000-000000000001  example.com         pending    not_started  not_started
"
        );
        assert_eq!(
            table(&[]),
            "No sender domains; add one with postmesh domains add DOMAIN"
        );
    }
}
