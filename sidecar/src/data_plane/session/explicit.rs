//! The session facts a call states itself, in the order of precedence: the path form
//! `/s/{session}/v1/...`, then headers (`X-Clawback-*`, and OpenClaw-RL's `X-Session-Id`,
//! `X-Turn-Type`, `X-Session-Done` for compatibility), then body fields (`metadata.session_id`,
//! `user`). What none of them names is left to stitching.

use http::HeaderMap;
use serde_json::Value;

use crate::data_plane::route::SessionId;

pub const SESSION: &str = "x-clawback-session";
pub const GROUP: &str = "x-clawback-group";
pub const GROUP_SIZE: &str = "x-clawback-group-size";
pub const DONE: &str = "x-clawback-done";
pub const OPENCLAW_SESSION: &str = "x-session-id";
pub const OPENCLAW_TURN_TYPE: &str = "x-turn-type";
pub const OPENCLAW_DONE: &str = "x-session-done";

/// Longest external id accepted from a header or body field.
const MAX_ID_LEN: usize = 128;

/// Where a call's session id came from (kept on the trajectory's metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Path,
    Header,
    Body,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Path => "path",
            Self::Header => "header",
            Self::Body => "body",
        }
    }
}

/// What a call says about its own session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    /// The agent's name for its session, and where it was given.
    pub session: Option<(String, Source)>,
    /// The agent's name for the group of rollouts, and the group's size.
    pub group: Option<(String, u32)>,
    /// This call is the trajectory's last turn.
    pub done: bool,
    /// An OpenClaw-RL `side` turn: forwarded and recorded, never trained on.
    pub side_turn: bool,
    /// The call continues a response the sidecar relayed (`previous_response_id`).
    pub continues: Option<Continues>,
}

/// A stateful Responses call's trajectory, and what it adds to the conversation (the next
/// state of that trajectory's last step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continues {
    pub trajectory: clawback_datapool::TrajectoryId,
    pub next_state: Vec<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HintError {
    #[error("header {0} must be 1-128 printable ASCII characters")]
    BadId(&'static str),
    #[error("header {GROUP_SIZE} must be a whole number from 1 to 4096")]
    BadGroupSize,
    #[error("header {GROUP} needs {GROUP_SIZE} (how many rollouts the group has)")]
    GroupWithoutSize,
}

impl Hints {
    pub fn read(
        path_session: Option<&SessionId>,
        headers: &HeaderMap,
        body: Option<&Value>,
    ) -> Result<Self, HintError> {
        let header_session = match header_id(headers, SESSION)? {
            Some(id) => Some(id),
            None => header_id(headers, OPENCLAW_SESSION)?,
        };
        let session = path_session
            .map(|s| (s.as_str().to_owned(), Source::Path))
            .or(header_session.map(|s| (s, Source::Header)))
            .or_else(|| body.and_then(body_session).map(|s| (s, Source::Body)));

        let group = match header_id(headers, GROUP)? {
            Some(group) => {
                let size = headers
                    .get(GROUP_SIZE)
                    .ok_or(HintError::GroupWithoutSize)?
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or(HintError::BadGroupSize)?;
                Some((group, size))
            }
            None => None,
        };
        let done = is_true(headers, DONE) || is_true(headers, OPENCLAW_DONE);
        let side_turn = headers
            .get(OPENCLAW_TURN_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("side"));
        Ok(Self {
            session,
            group,
            done,
            side_turn,
            continues: None,
        })
    }
}

fn header_id(headers: &HeaderMap, name: &'static str) -> Result<Option<String>, HintError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|v| valid_id(v))
            .map(|v| Some(v.to_owned()))
            .ok_or(HintError::BadId(name)),
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}

/// `metadata.session_id` (OpenAI's free-form `metadata` map), else the end-user id `user`.
fn body_session(body: &Value) -> Option<String> {
    let from_metadata = body["metadata"]["session_id"].as_str();
    from_metadata
        .or_else(|| body["user"].as_str())
        .map(str::trim)
        .filter(|id| valid_id(id))
        .map(str::to_owned)
}

fn is_true(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn the_path_wins_over_headers_and_headers_over_the_body() {
        let body = json!({"metadata": {"session_id": "from-body"}, "user": "u-1"});
        let h = headers(&[(SESSION, "from-header")]);
        let path = SessionId::parse("from-path");
        let hints = Hints::read(path.as_ref(), &h, Some(&body)).unwrap();
        assert_eq!(hints.session, Some(("from-path".to_owned(), Source::Path)));
        let hints = Hints::read(None, &h, Some(&body)).unwrap();
        assert_eq!(
            hints.session,
            Some(("from-header".to_owned(), Source::Header))
        );
        let hints = Hints::read(None, &HeaderMap::new(), Some(&body)).unwrap();
        assert_eq!(hints.session, Some(("from-body".to_owned(), Source::Body)));
        let hints = Hints::read(None, &HeaderMap::new(), Some(&json!({"user": "u-1"}))).unwrap();
        assert_eq!(hints.session, Some(("u-1".to_owned(), Source::Body)));
    }

    #[test]
    fn openclaw_rl_headers_are_understood() {
        let h = headers(&[
            (OPENCLAW_SESSION, "oc-7"),
            (OPENCLAW_TURN_TYPE, "side"),
            (OPENCLAW_DONE, "true"),
        ]);
        let hints = Hints::read(None, &h, None).unwrap();
        assert_eq!(hints.session, Some(("oc-7".to_owned(), Source::Header)));
        assert!(hints.side_turn && hints.done);
    }

    #[test]
    fn a_group_needs_a_sane_size() {
        let ok = Hints::read(
            None,
            &headers(&[(GROUP, "task-1"), (GROUP_SIZE, "8")]),
            None,
        )
        .unwrap();
        assert_eq!(ok.group, Some(("task-1".to_owned(), 8)));
        assert_eq!(
            Hints::read(None, &headers(&[(GROUP, "task-1")]), None),
            Err(HintError::GroupWithoutSize)
        );
        assert_eq!(
            Hints::read(None, &headers(&[(GROUP, "t"), (GROUP_SIZE, "0")]), None),
            Err(HintError::BadGroupSize)
        );
    }
}
