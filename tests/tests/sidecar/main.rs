//! The sidecar proxy over real loopback HTTP: mock engine → sidecar → real clients.

mod anthropic;
mod balancing;
mod claw_r1;
mod engine_fields;
mod forwarding;
mod lifecycle;
mod limits;
mod recording;
mod redis;
mod routing;
mod sdk;
mod support;
mod tenancy;
mod unreadable;
mod viewer;
