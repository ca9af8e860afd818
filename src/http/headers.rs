//! Header hygiene shared by both directions: hop-by-hop headers (RFC 9110 §7.6.1) and tollgate's own
//! `X-Tollgate-*` headers never cross the proxy.

use http::header::{
    HeaderMap, HeaderName, CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};

/// Hop-by-hop headers removed in both directions, besides those that `Connection` names.
const HOP_BY_HOP: [&str; 3] = ["keep-alive", "proxy-connection", "connection"];

/// Removes hop-by-hop headers: the fixed list and every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests carry none of them: one pass over the names decides.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .chain(headers.get_all("proxy-connection").iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    for name in [
        TE,
        TRAILER,
        TRANSFER_ENCODING,
        UPGRADE,
        PROXY_AUTHORIZATION,
        PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    *name == CONNECTION
        || *name == TE
        || *name == TRAILER
        || *name == TRANSFER_ENCODING
        || *name == UPGRADE
        || *name == PROXY_AUTHORIZATION
        || *name == PROXY_AUTHENTICATE
        || HOP_BY_HOP.contains(&name.as_str())
}

/// Removes every `X-Tollgate-*` header (instructions to the proxy, never for the provider).
pub fn strip_tollgate(headers: &mut HeaderMap) {
    if !headers.keys().any(is_tollgate) {
        return;
    }
    let ours: Vec<HeaderName> = headers.keys().filter(|k| is_tollgate(k)).cloned().collect();
    for name in ours {
        headers.remove(name);
    }
}

fn is_tollgate(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-tollgate-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_fixed_and_connection_named_headers_only() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Secret-Hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "close"),
            ("authorization", "Bearer keep"),
            ("content-length", "3"),
            ("x-tollgate-region", "eu"),
        ] {
            h.append(k, v.parse().expect("value"));
        }
        strip_hop_by_hop(&mut h);
        strip_tollgate(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "content-length"]);
    }
}
