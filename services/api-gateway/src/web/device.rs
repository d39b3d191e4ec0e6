//! `/app/device`: approve or deny a CLI's sign-in. Reached by the CLI's link (`?request=`),
//! where the user types the code the terminal shows, or by typing that code into the form
//! (a POST, so no link can arrive with a code filled in).

use axum::extract::{Query, State};
use axum::http::{request::Parts, HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;

use postmesh_shared::ApiError;

use super::{csrf_refusal, layout, when, Csrf};
use crate::device::{self, display_user_code, normalize_user_code, Decided, Lookup, Request};
use crate::sessions::{self, Session};
use crate::AppState;

const TITLE: &str = "Approve a device";

/// The query of `GET /app/device`.
#[derive(Deserialize)]
pub struct DeviceQuery {
    /// The request id of the CLI's link.
    request: Option<String>,
}

fn code_entry(csrf: &Csrf, error: Option<&str>) -> Markup {
    html! {
        @if let Some(error) = error { p.error role="alert" { (error) } }
        p { "Type the code your terminal shows after " code { "postmesh login" } "." }
        form method="post" action="/app/device" {
            (csrf.field())
            label for="user_code" { "Device code" }
            input #user_code type="text" name="user_code" autocomplete="off" autocapitalize="characters" placeholder="ABCD-EFGH" required;
            button type="submit" { "Continue" }
        }
    }
}

/// The request and its approve and deny buttons; `confirm_code` asks for the user code
/// (reached by link), otherwise it is shown (the user typed it).
fn request_form(
    csrf: &Csrf, request: &Request, rid: &str, confirm_code: bool, error: Option<&str>,
) -> Markup {
    html! {
        @if let Some(error) = error { p.error role="alert" { (error) } }
        p { "A " code { "postmesh" } " CLI asks to sign in to your account and get an API key." }
        dl {
            dt { "Started" } dd { (when(request.created_at)) }
            dt { "From IP address" } dd { (if request.ip.is_empty() { "unknown" } else { &request.ip }) }
            @if !confirm_code {
                dt { "Device code" } dd.code #device-code { (display_user_code(&request.user_code)) }
            }
        }
        p { "Approve only if you started it and the code matches your terminal." }
        form method="post" action="/app/device" {
            (csrf.field())
            input type="hidden" name="request" value=(rid);
            @if confirm_code {
                label for="user_code" { "Code shown in your terminal" }
                input #user_code type="text" name="user_code" autocomplete="off" autocapitalize="characters" placeholder="ABCD-EFGH" required;
            } @else {
                input type="hidden" name="user_code" value=(request.user_code);
            }
            button type="submit" name="decision" value="approve" { "Approve" }
            " "
            button type="submit" name="decision" value="deny" { "Deny" }
        }
    }
}

/// `GET /app/device`.
pub async fn page(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
    Query(q): Query<DeviceQuery>,
) -> Result<Response, ApiError> {
    let csrf = Csrf::of(&state, &headers);
    let render =
        |status, body| csrf.page(&state, status, layout(TITLE, Some(&session), &csrf, body));
    if let Some(rid) = q.request.as_deref().filter(|r| !r.is_empty()) {
        return Ok(match device::find(&state, Lookup::Request(rid)).await? {
            Some(request) => render(StatusCode::OK, request_form(&csrf, &request, rid, true, None)),
            None => render(
                StatusCode::GONE,
                code_entry(&csrf, Some("This sign-in request expired or was already handled. Run postmesh login again.")),
            ),
        });
    }
    Ok(render(StatusCode::OK, code_entry(&csrf, None)))
}

/// The form of `POST /app/device`: a typed code to look up (no `request`), or a decision.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct DecideForm {
    csrf: String,
    request: String,
    user_code: String,
    decision: String,
}

/// `POST /app/device`: approve (the typed code must match) or deny. A typed code that
/// matches no pending sign-in is a failed authentication of the address (a guess at
/// another's code), and past `AUTH_FAILURES_PER_IP_PER_MINUTE` none is looked up.
pub async fn decide(
    State(state): State<AppState>, parts: Parts, Extension(session): Extension<Session>,
    Form(form): Form<DecideForm>,
) -> Result<Response, ApiError> {
    let headers = &parts.headers;
    if let Some(res) = csrf_refusal(&state, headers, &form.csrf) {
        return Ok(res);
    }
    let csrf = Csrf::of(&state, headers);
    let render =
        |status, body| csrf.page(&state, status, layout(TITLE, Some(&session), &csrf, body));
    let expired = "This sign-in request expired or was already handled. Run postmesh login again.";
    if form.request.is_empty() {
        // A typed code: show its request, with the code, to approve or deny.
        let ip = sessions::client_ip(&state, &parts);
        if state.failed_auths.check(ip).is_err() {
            let wait = "Too many codes from this address matched no sign-in. Wait a minute, then try again.";
            return Ok(render(
                StatusCode::TOO_MANY_REQUESTS,
                code_entry(&csrf, Some(wait)),
            ));
        }
        let found = device::find(&state, Lookup::UserCode(&form.user_code)).await?;
        return Ok(match found {
            Some(request) => render(
                StatusCode::OK,
                request_form(&csrf, &request, &request.rid, false, None),
            ),
            None => {
                state.failed_auths.failed(ip);
                render(
                    StatusCode::NOT_FOUND,
                    code_entry(
                        &csrf,
                        Some("No pending sign-in has that code. Check it and try again."),
                    ),
                )
            }
        });
    }
    let Some(request) = device::find(&state, Lookup::Request(&form.request)).await? else {
        return Ok(render(StatusCode::GONE, code_entry(&csrf, Some(expired))));
    };
    let approve = form.decision == "approve";
    let typed = normalize_user_code(&form.user_code);
    let outcome = device::decide(&state, &session, &request.hash, approve, Some(&typed)).await;
    Ok(match outcome {
        Ok(Decided::Approved) => render(
            StatusCode::OK,
            html! {
                p.ok role="status" { "Approved. Your terminal signs in within a few seconds; you can close this page." }
                p { "Device code " span.code { (display_user_code(&request.user_code)) } }
            },
        ),
        Ok(Decided::Denied) => render(
            StatusCode::OK,
            html! { p.ok role="status" { "Denied. That terminal gets no key." } },
        ),
        Ok(Decided::WrongCode) => render(
            StatusCode::BAD_REQUEST,
            request_form(
                &csrf,
                &request,
                &form.request,
                true,
                Some("That code does not match. Type the code your terminal shows."),
            ),
        ),
        Ok(Decided::Voided) => render(
            StatusCode::BAD_REQUEST,
            code_entry(
                &csrf,
                Some(
                    "Too many wrong codes: this sign-in request is void. Run postmesh login again.",
                ),
            ),
        ),
        Err(e @ (ApiError::Gone(_) | ApiError::Conflict(_))) => {
            render(e.status(), code_entry(&csrf, Some(expired)))
        }
        Err(e) => return Err(e),
    })
}
