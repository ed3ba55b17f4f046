//! The trajectory viewer: one page, its script and its stylesheet, embedded in the binary so the
//! page works offline and ships with the sidecar it shows.
//!
//! The files hold no data, so they are served without the admin token (but only when one is
//! configured: no token, no admin API, no viewer). Everything the page shows it fetches from the
//! admin API ([`crate::control_plane::handshake`]) with `Authorization: Bearer <token>`, set by the script:
//!
//! - a header, not a cookie, so another site can never make the browser send it (no CSRF);
//! - not a query parameter, which would land in access logs, proxies and `Referer` headers;
//! - the token is typed into the page's form, or handed over in the URL *fragment*
//!   (`/ui#token=...`), which browsers never send to a server; the script moves it into
//!   `sessionStorage` (gone when the tab closes) and removes it from the address bar at once.
//!   A browser may still remember the first URL in its history, so the fragment is for links
//!   and automation (the tests); people should use the form.
//!
//! Recorded conversations are untrusted text: the script only ever inserts them as text nodes,
//! and the Content-Security-Policy below allows no inline script, no other origin and no framing,
//! so a model output that looks like HTML stays text.

use http::{header, HeaderValue, Method, Response};

use crate::data_plane::body::ProxyBody;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// One of the viewer's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asset {
    Page,
    Script,
    Style,
}

impl Asset {
    /// `None` when the request is not a GET or HEAD of one of the viewer's paths.
    pub fn classify(method: &Method, path: &str) -> Option<Self> {
        if method != Method::GET && method != Method::HEAD {
            return None;
        }
        match path {
            "/ui" | "/ui/" => Some(Self::Page),
            "/ui/app.js" => Some(Self::Script),
            "/ui/style.css" => Some(Self::Style),
            _ => None,
        }
    }

    fn body_and_type(self) -> (&'static str, &'static str) {
        match self {
            Self::Page => (PAGE, "text/html; charset=utf-8"),
            Self::Script => (SCRIPT, "text/javascript; charset=utf-8"),
            Self::Style => (STYLE, "text/css; charset=utf-8"),
        }
    }
}

/// The asset with the headers that keep the page self-contained.
pub fn serve(asset: Asset) -> Response<ProxyBody> {
    let (body, content_type) = asset.body_and_type();
    let mut response = Response::new(ProxyBody::full(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Revalidate every time: a new sidecar build serves its own page, never a cached older one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_of_the_three_files_are_viewer_routes() {
        assert_eq!(Asset::classify(&Method::GET, "/ui"), Some(Asset::Page));
        assert_eq!(Asset::classify(&Method::GET, "/ui/"), Some(Asset::Page));
        assert_eq!(
            Asset::classify(&Method::HEAD, "/ui/app.js"),
            Some(Asset::Script)
        );
        assert_eq!(
            Asset::classify(&Method::GET, "/ui/style.css"),
            Some(Asset::Style)
        );
        assert_eq!(Asset::classify(&Method::POST, "/ui"), None);
        assert_eq!(Asset::classify(&Method::GET, "/ui/other.js"), None);
        assert_eq!(Asset::classify(&Method::GET, "/uix"), None);
    }

    #[test]
    fn the_page_loads_only_its_own_script_and_style() {
        assert!(PAGE.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(PAGE.contains(r#"<link rel="stylesheet" href="/ui/style.css">"#));
        assert!(!PAGE.contains("http://") && !PAGE.contains("https://"));
        assert!(
            !SCRIPT.contains("innerHTML"),
            "recorded text must stay text"
        );
    }
}
