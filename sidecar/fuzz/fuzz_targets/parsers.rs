//! One input drives every parser an agent or engine can reach: the SSE splitter (cut at the
//! input's own first byte), the stitching canonicaliser and request parsing on the input as
//! JSON, and routing plus the agent allow-list on it as a path. None may panic, and the
//! splitter must give back every byte.
#![no_main]

use clawback_datapool::{Endpoint, TenantId};
use clawback_sidecar::data_plane::capture::SseSplitter;
use clawback_sidecar::data_plane::layers::agent_api::{
    is_engine_control, AgentApiConfig, AllowList,
};
use clawback_sidecar::data_plane::recorder::request;
use clawback_sidecar::data_plane::session::canonical::HistoryHasher;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cut = data.first().map_or(0, |b| usize::from(*b)).min(data.len());
    let mut splitter = SseSplitter::new();
    let mut out = 0;
    for frame in [&data[..cut], &data[cut..]] {
        splitter.push(frame);
        while let Some(event) = splitter.next_event() {
            out += event.raw.len();
        }
    }
    out += splitter.finish().map_or(0, |rest| rest.len());
    assert_eq!(out, data.len(), "the splitter lost or invented bytes");

    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let tenant = TenantId::new("fuzz").expect("a valid tenant id");
        let mut hasher = HistoryHasher::new(&tenant);
        if let Some(items) = value.as_array() {
            items.iter().for_each(|item| hasher.push(item));
        }
        hasher.push_reply(&value);
        let _ = hasher.finish();
        for endpoint in [
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Responses,
        ] {
            let messages = request::messages(endpoint, &value);
            let _ = request::step_request(messages, &value);
        }
    }

    if let Ok(path) = std::str::from_utf8(data) {
        let allow = AllowList::new(&AgentApiConfig::default()).expect("the default list");
        for method in [http::Method::GET, http::Method::POST] {
            if let Some(upstream_path) =
                clawback_sidecar::app::classify(&method, path, None).upstream_path()
            {
                let bare = upstream_path.split('?').next().unwrap_or_default();
                assert!(!(is_engine_control(bare) && allow.allows(&method, bare)));
            }
        }
    }
});
