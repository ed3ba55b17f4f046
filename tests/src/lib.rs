//! Whole-system test support: mock upstreams and harness helpers.
