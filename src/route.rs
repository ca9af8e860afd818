//! Request → bucket: the base-URL prefix `/{provider}[/{region}]` and the `X-Tollgate-Region` header.
//! Names come from config only; nothing here does I/O.

use std::collections::BTreeMap;

use crate::config::BucketConfig;

/// Maps provider and region names to bucket indices (positions in the config's bucket list).
#[derive(Debug, Clone, Default)]
pub struct Router {
    providers: BTreeMap<String, ProviderRoutes>,
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
        for (i, b) in buckets.iter().enumerate() {
            let p = providers.entry(b.provider.clone()).or_default();
            match &b.region {
                None => p.own = Some(i),
                Some(r) => {
                    p.regions.insert(r.clone(), i);
                }
            }
        }
        Router { providers }
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
                });
            }
        }
        if let Some(region) = region_header.map(str::trim).filter(|r| !r.is_empty()) {
            return match routes.regions.get(&region.to_ascii_lowercase()) {
                Some(&i) => Ok(Route { bucket: i, rest }),
                None => Err(RouteError::UnknownRegion {
                    provider,
                    region: region.to_string(),
                    known: routes.regions.keys().cloned().collect(),
                }),
            };
        }
        match routes.own {
            Some(i) => Ok(Route { bucket: i, rest }),
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
                rest: "/search"
            })
        );
        assert_eq!(
            r.route("/nominatim", None),
            Ok(Route {
                bucket: 4,
                rest: ""
            })
        );
        assert_eq!(
            r.route("/nominatim/a%2Fb/%20x", None),
            Ok(Route {
                bucket: 4,
                rest: "/a%2Fb/%20x"
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
                rest: "/v1/x"
            })
        );
        assert_eq!(
            r.route("/geo/us", None),
            Ok(Route {
                bucket: 2,
                rest: ""
            })
        );
        // Not a region: the provider's own bucket, segment kept.
        assert_eq!(
            r.route("/geo/search", None),
            Ok(Route {
                bucket: 0,
                rest: "/search"
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
                rest: "/search"
            })
        );
        assert_eq!(
            r.route("/geo/eu/search", Some("us")),
            Ok(Route {
                bucket: 1,
                rest: "/search"
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
                rest: "/v1"
            })
        );
    }

    #[test]
    fn names_match_case_insensitively() {
        let r = router();
        assert_eq!(
            r.route("/GEO/EU/x", None),
            Ok(Route {
                bucket: 1,
                rest: "/x"
            })
        );
    }
}
