//! Request → bucket: the base-URL prefix `/{provider}[/{region}]`, the host of an absolute-form
//! (forward-proxy) request, and the `X-Tollgate-Region` header. Names and hosts come from config only;
//! nothing here does I/O.

use std::collections::BTreeMap;

use crate::config::BucketConfig;

/// Maps provider and region names, and upstream hosts, to bucket indices (positions in the config's list).
#[derive(Debug, Clone, Default)]
pub struct Router {
    providers: BTreeMap<String, ProviderRoutes>,
    /// Lowercase host → (port it must have, if any; bucket index).
    hosts: BTreeMap<String, Vec<(Option<u16>, usize)>>,
    /// Bucket index → its region, for choosing among buckets sharing a host.
    regions: Vec<Option<String>>,
}

#[derive(Debug, Clone, Default)]
struct ProviderRoutes {
    own: Option<usize>,
    regions: BTreeMap<String, usize>,
}

/// Where a request goes: its bucket and the path left after the routing prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<'a> {
    /// Index of the bucket in the config's list.
    pub bucket: usize,
    /// The rest of the path, still percent-encoded as received (`""` or starting with `/`).
    pub rest: &'a str,
    /// Forward-proxy mode: `rest` is the whole path, sent without the upstream's base path.
    pub absolute: bool,
}

/// Why a request matched no bucket (answered 404 with what is configured).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The first path segment names no provider.
    #[error("unknown provider {provider:?}; configured: {}", known.join(", "))]
    UnknownProvider {
        /// What the request asked for.
        provider: String,
        /// Configured provider names.
        known: Vec<String>,
    },
    /// The region (from the header) is not configured for this provider.
    #[error(
        "unknown region {region:?} for provider {provider:?}; configured: {}",
        list_or_none(known)
    )]
    UnknownRegion {
        /// The provider.
        provider: String,
        /// What the request asked for.
        region: String,
        /// The provider's configured regions.
        known: Vec<String>,
    },
    /// An absolute-form request for a host that no bucket serves (answered 403: not an open relay).
    #[error("host {host:?} is not a configured upstream; tollgate only forwards to configured providers")]
    HostNotAllowed {
        /// The host asked for.
        host: String,
    },
    /// The provider has only regional buckets and the request named none.
    #[error("provider {provider:?} needs a region (in the path or X-Tollgate-Region); configured: {}", known.join(", "))]
    RegionRequired {
        /// The provider.
        provider: String,
        /// Its configured regions.
        known: Vec<String>,
    },
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

impl Router {
    /// Builds the routing table from the configured buckets.
    pub fn new(buckets: &[BucketConfig]) -> Router {
        let mut providers: BTreeMap<String, ProviderRoutes> = BTreeMap::new();
        let mut hosts: BTreeMap<String, Vec<(Option<u16>, usize)>> = BTreeMap::new();
        for (i, b) in buckets.iter().enumerate() {
            let upstream_port = b.upstream.authority.port_u16().unwrap_or(
                if b.upstream.scheme == http::uri::Scheme::HTTPS {
                    443
                } else {
                    80
                },
            );
            hosts
                .entry(b.upstream.host().to_ascii_lowercase())
                .or_default()
                .push((Some(upstream_port), i));
            for extra in &b.hosts {
                let (host, port) = match extra.rsplit_once(':') {
                    Some((h, p)) if p.parse::<u16>().is_ok() => (h, p.parse::<u16>().ok()),
                    _ => (extra.as_str(), None),
                };
                hosts.entry(host.to_string()).or_default().push((port, i));
            }
            let p = providers.entry(b.provider.clone()).or_default();
            match &b.region {
                None => p.own = Some(i),
                Some(r) => {
                    p.regions.insert(r.clone(), i);
                }
            }
        }
        let regions = buckets.iter().map(|b| b.region.clone()).collect();
        Router {
            providers,
            hosts,
            regions,
        }
    }

    /// Routes an absolute-form request (`GET http://host[:port]/path`) by its host: a configured
    /// upstream's host (the port, when given, must match it) or one of a bucket's extra `hosts`.
    pub fn route_host<'a>(
        &self,
        host: &str,
        port: Option<u16>,
        path: &'a str,
        region_header: Option<&str>,
    ) -> Result<Route<'a>, RouteError> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let mut candidates: Vec<usize> = self
            .hosts
            .get(&host)
            .into_iter()
            .flatten()
            .filter(|(want, _)| want.is_none() || port.is_none() || *want == port)
            .map(|&(_, i)| i)
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        let route = |bucket| Route {
            bucket,
            rest: path,
            absolute: true,
        };
        let region = region_header.map(str::trim).filter(|r| !r.is_empty());
        match (candidates.as_slice(), region) {
            ([], _) => Err(RouteError::HostNotAllowed { host }),
            (_, Some(region)) => candidates
                .iter()
                .find(|&&i| self.regions[i].as_deref() == Some(&region.to_ascii_lowercase()))
                .map(|&i| route(i))
                .ok_or_else(|| RouteError::UnknownRegion {
                    provider: host.clone(),
                    region: region.to_string(),
                    known: candidates
                        .iter()
                        .filter_map(|&i| self.regions[i].clone())
                        .collect(),
                }),
            ([only], None) => Ok(route(*only)),
            (_, None) => candidates
                .iter()
                .find(|&&i| self.regions[i].is_none())
                .map(|&i| route(i))
                .ok_or_else(|| RouteError::RegionRequired {
                    provider: host.clone(),
                    known: candidates
                        .iter()
                        .filter_map(|&i| self.regions[i].clone())
                        .collect(),
                }),
        }
    }

    /// Routes a base-URL-mode path (`/{provider}[/{region}]/rest`), with an optional region header.
    pub fn route<'a>(
        &self,
        path: &'a str,
        region_header: Option<&str>,
    ) -> Result<Route<'a>, RouteError> {
        let after_slash = path.strip_prefix('/').unwrap_or(path);
        let (provider, rest) = split_segment(after_slash);
        let routes = self
            .providers
            .get(provider)
            .or_else(|| self.providers.get(&provider.to_ascii_lowercase()))
            .ok_or_else(|| RouteError::UnknownProvider {
                provider: provider.to_string(),
                known: self.providers.keys().cloned().collect(),
            })?;
        let provider = provider.to_ascii_lowercase();

        // A region in the path wins over the header.
        let (segment, after_region) = split_segment(rest.strip_prefix('/').unwrap_or(""));
        if !segment.is_empty() {
            if let Some(&i) = routes.regions.get(&segment.to_ascii_lowercase()) {
                return Ok(Route {
                    bucket: i,
                    rest: after_region,
                    absolute: false,
                });
            }
        }
        if let Some(region) = region_header.map(str::trim).filter(|r| !r.is_empty()) {
            return match routes.regions.get(&region.to_ascii_lowercase()) {
                Some(&i) => Ok(Route {
                    bucket: i,
                    rest,
                    absolute: false,
                }),
                None => Err(RouteError::UnknownRegion {
                    provider,
                    region: region.to_string(),
                    known: routes.regions.keys().cloned().collect(),
                }),
            };
        }
        match routes.own {
            Some(i) => Ok(Route {
                bucket: i,
                rest,
                absolute: false,
            }),
            None => Err(RouteError::RegionRequired {
                provider,
                known: routes.regions.keys().cloned().collect(),
            }),
        }
    }
}

/// Splits `seg/rest` into `("seg", "/rest")`; `rest` keeps its leading slash.
fn split_segment(s: &str) -> (&str, &str) {
    match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn router() -> Router {
        let c = Config::from_toml(
            "t.toml",
            r#"
[providers.nominatim]
upstream = "https://nominatim.example"
rate = 1
[providers.geo]
upstream = "https://api.geo.example"
rate = 50
[providers.geo.regions.eu]
rate = 20
[providers.geo.regions.us]
rate = 30
[providers.llm.regions.eu]
upstream = "https://eu.llm.example"
rate = 1
"#,
        )
        .expect("valid");
        // Buckets: 0 geo, 1 geo:eu, 2 geo:us, 3 llm:eu, 4 nominatim
        Router::new(&c.buckets)
    }

    #[test]
    fn provider_prefix_is_stripped_and_the_rest_kept_verbatim() {
        let r = router();
        assert_eq!(
            r.route("/nominatim/search", None),
            Ok(Route {
                bucket: 4,
                rest: "/search",
                absolute: false
            })
        );
        assert_eq!(
            r.route("/nominatim", None),
            Ok(Route {
                bucket: 4,
                rest: "",
                absolute: false
            })
        );
        assert_eq!(
            r.route("/nominatim/a%2Fb/%20x", None),
            Ok(Route {
                bucket: 4,
                rest: "/a%2Fb/%20x",
                absolute: false
            })
        );
    }

    #[test]
    fn a_region_segment_selects_the_regional_bucket() {
        let r = router();
        assert_eq!(
            r.route("/geo/eu/v1/x", None),
            Ok(Route {
                bucket: 1,
                rest: "/v1/x",
                absolute: false
            })
        );
        assert_eq!(
            r.route("/geo/us", None),
            Ok(Route {
                bucket: 2,
                rest: "",
                absolute: false
            })
        );
        // Not a region: the provider's own bucket, segment kept.
        assert_eq!(
            r.route("/geo/search", None),
            Ok(Route {
                bucket: 0,
                rest: "/search",
                absolute: false
            })
        );
    }

    #[test]
    fn the_region_header_selects_when_the_path_does_not() {
        let r = router();
        assert_eq!(
            r.route("/geo/search", Some("us")),
            Ok(Route {
                bucket: 2,
                rest: "/search",
                absolute: false
            })
        );
        assert_eq!(
            r.route("/geo/eu/search", Some("us")),
            Ok(Route {
                bucket: 1,
                rest: "/search",
                absolute: false
            })
        );
        assert!(matches!(
            r.route("/geo/search", Some("mars")),
            Err(RouteError::UnknownRegion { .. })
        ));
        assert!(matches!(
            r.route("/nominatim/x", Some("eu")),
            Err(RouteError::UnknownRegion { .. })
        ));
    }

    #[test]
    fn unknown_names_are_errors_that_list_what_is_configured() {
        let r = router();
        let e = r.route("/nope/x", None).expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "unknown provider \"nope\"; configured: geo, llm, nominatim"
        );
        assert!(matches!(
            r.route("/", None),
            Err(RouteError::UnknownProvider { .. })
        ));
        let e = r.route("/llm/v1/chat", None).expect_err("needs region");
        assert!(e.to_string().contains("needs a region"), "{e}");
        assert_eq!(
            r.route("/llm/eu/v1", None),
            Ok(Route {
                bucket: 3,
                rest: "/v1",
                absolute: false
            })
        );
    }

    #[test]
    fn absolute_form_requests_route_by_upstream_host_and_port() {
        let r = router();
        let route = r
            .route_host("nominatim.example", None, "/search?q=1", None)
            .expect("route");
        assert_eq!(
            route,
            Route {
                bucket: 4,
                rest: "/search?q=1",
                absolute: true
            }
        );
        // The upstream is https (443): an explicit other port does not match.
        assert!(r
            .route_host("nominatim.example", Some(443), "/", None)
            .is_ok());
        assert!(matches!(
            r.route_host("nominatim.example", Some(8080), "/", None),
            Err(RouteError::HostNotAllowed { .. })
        ));
        assert_eq!(
            r.route_host("EU.LLM.example.", None, "/", None)
                .map(|r| r.bucket),
            Ok(3)
        );
    }

    #[test]
    fn a_host_shared_by_several_buckets_uses_the_region_header_or_the_provider_bucket() {
        let r = router();
        // geo, geo:eu and geo:us all use api.geo.example.
        assert_eq!(
            r.route_host("api.geo.example", None, "/", None)
                .map(|r| r.bucket),
            Ok(0)
        );
        assert_eq!(
            r.route_host("api.geo.example", None, "/", Some("us"))
                .map(|r| r.bucket),
            Ok(2)
        );
        assert!(matches!(
            r.route_host("api.geo.example", None, "/", Some("mars")),
            Err(RouteError::UnknownRegion { .. })
        ));
    }

    #[test]
    fn unconfigured_hosts_are_not_allowed() {
        let r = router();
        for host in [
            "169.254.169.254",
            "localhost",
            "evil.example",
            "nominatim.example.evil.com",
        ] {
            assert!(
                matches!(
                    r.route_host(host, None, "/", None),
                    Err(RouteError::HostNotAllowed { .. })
                ),
                "{host}"
            );
        }
    }

    #[test]
    fn names_match_case_insensitively() {
        let r = router();
        assert_eq!(
            r.route("/GEO/EU/x", None),
            Ok(Route {
                bucket: 1,
                rest: "/x",
                absolute: false
            })
        );
    }
}
