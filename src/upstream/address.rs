//! Which addresses an upstream name may resolve to, and the resolver that enforces it. The addresses it
//! checks are the ones the connector dials: there is no second lookup, so no DNS-rebinding window.

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

/// Why an address must not be dialled for a name from config, or `None` when it may.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local (cloud metadata)")
    } else if a == 100 && (64..128).contains(&b) {
        Some("carrier-grade NAT")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if ip.is_broadcast() || ip.is_multicast() || a >= 240 {
        Some("broadcast, multicast or reserved")
    } else if a == 192 && b == 0 && ip.octets()[2] == 0 {
        Some("IETF protocol assignments")
    } else if a == 198 && (18..20).contains(&b) {
        Some("benchmarking")
    } else {
        None
    }
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let seg = ip.segments();
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_multicast() {
        return Some("multicast");
    }
    if seg[0] & 0xfe00 == 0xfc00 {
        return Some("unique local (private)");
    }
    if seg[0] & 0xffc0 == 0xfe80 || seg[0] & 0xffc0 == 0xfec0 {
        return Some("link-local");
    }
    // Forms that embed an IPv4 address are judged by it.
    let embedded = if let Some(v4) = ip.to_ipv4_mapped() {
        Some(v4)
    } else if seg[..6] == [0; 6] {
        // IPv4-compatible ::a.b.c.d (deprecated, still routable by some stacks).
        Some(Ipv4Addr::new(
            (seg[6] >> 8) as u8,
            seg[6] as u8,
            (seg[7] >> 8) as u8,
            seg[7] as u8,
        ))
    } else if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || seg[..3] == [0x64, 0xff9b, 1] {
        // NAT64 (well-known and local-use prefixes).
        Some(Ipv4Addr::new(
            (seg[6] >> 8) as u8,
            seg[6] as u8,
            (seg[7] >> 8) as u8,
            seg[7] as u8,
        ))
    } else if seg[0] == 0x2002 {
        // 6to4: 2002:AABB:CCDD::/48 carries a.b.c.d.
        Some(Ipv4Addr::new(
            (seg[1] >> 8) as u8,
            seg[1] as u8,
            (seg[2] >> 8) as u8,
            seg[2] as u8,
        ))
    } else {
        None
    };
    match embedded {
        Some(v4) => forbidden_v4(v4).map(|_| "an IPv6 form embedding a forbidden IPv4 address"),
        None => None,
    }
}

/// A DNS resolver that refuses names resolving to loopback, private, link-local, CGNAT or similar
/// addresses, except the names whose bucket sets `allow_private = true`. IP literals never reach it:
/// the connector dials them as written.
#[derive(Clone, Debug, Default)]
pub struct GuardedResolver {
    allow_private: Arc<HashSet<String>>,
}

impl GuardedResolver {
    /// A resolver that lets the given host names resolve to private addresses.
    pub fn new(allow_private: HashSet<String>) -> GuardedResolver {
        GuardedResolver {
            allow_private: Arc::new(allow_private),
        }
    }
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let allowed = self
            .allow_private
            .contains(&name.as_str().to_ascii_lowercase());
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !allowed {
                if let Some((addr, why)) =
                    addrs.iter().find_map(|a| forbidden(a.ip()).map(|w| (a, w)))
                {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("{host} resolves to {} ({why}); set allow_private = true on its provider to allow it", addr.ip()),
                    ));
                }
            }
            Ok(addrs.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address classes, one row each: (address, allowed).
    const MATRIX: &[(&str, bool)] = &[
        ("8.8.8.8", true),
        ("93.184.216.34", true),
        ("2606:4700:4700::1111", true),
        ("127.0.0.1", false),
        ("127.255.0.9", false),
        ("10.1.2.3", false),
        ("172.16.0.1", false),
        ("172.31.255.255", false),
        ("172.32.0.1", true),
        ("192.168.1.1", false),
        ("169.254.169.254", false),
        ("100.64.0.1", false),
        ("100.127.255.254", false),
        ("100.128.0.1", true),
        ("0.0.0.0", false),
        ("0.1.2.3", false),
        ("255.255.255.255", false),
        ("224.0.0.1", false),
        ("240.0.0.1", false),
        ("192.0.0.8", false),
        ("198.18.0.1", false),
        ("::1", false),
        ("::", false),
        ("fc00::1", false),
        ("fd12:3456::1", false),
        ("fe80::1", false),
        ("ff02::1", false),
        ("::ffff:127.0.0.1", false),
        ("::ffff:169.254.169.254", false),
        ("::ffff:10.0.0.1", false),
        ("::ffff:8.8.8.8", true),
        ("::127.0.0.1", false),
        ("64:ff9b::a9fe:a9fe", false),
        ("64:ff9b::808:808", true),
        ("64:ff9b:1::a00:1", false),
        ("2002:7f00:1::", false),
        ("2002:a9fe:a9fe::1", false),
        ("2002:808:808::1", true),
    ];

    #[test]
    fn every_address_class_is_judged_as_the_table_says() {
        for (text, allowed) in MATRIX {
            let ip: IpAddr = text.parse().expect("address");
            assert_eq!(
                forbidden(ip).is_none(),
                *allowed,
                "{text}: {:?}",
                forbidden(ip)
            );
        }
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_unless_allowed() {
        let mut strict = GuardedResolver::default();
        let err = tower_service::Service::call(&mut strict, "localhost".parse().expect("name"))
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        let mut lenient = GuardedResolver::new(HashSet::from(["localhost".to_string()]));
        let addrs: Vec<_> =
            tower_service::Service::call(&mut lenient, "localhost".parse().expect("name"))
                .await
                .expect("allowed")
                .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()));
    }
}
