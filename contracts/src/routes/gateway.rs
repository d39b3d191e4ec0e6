//! The gateway's own routes: verification codes.

use super::HttpMethod::Post;
use super::{keyed, RouteSpec};

/// `POST /send-code`.
pub const SEND_CODE: RouteSpec = keyed(Post, "/send-code");
/// `POST /verify-code`.
pub const VERIFY_CODE: RouteSpec = keyed(Post, "/verify-code");

/// Every route the gateway serves itself.
pub const ROUTES: &[RouteSpec] = &[SEND_CODE, VERIFY_CODE];
